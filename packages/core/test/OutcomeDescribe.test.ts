import { assert, describe, it } from "@effect/vitest"
import { ErrorSummary, Outcome } from "@jetworker/core"
import { Duration, Effect } from "effect"

const message: Outcome.MessageRef = {
  consumer: "ledger-applier",
  subject: "ledger.transfer.eur",
  sequence: 42,
  deliveryCount: 1,
  eventId: "t-42"
}

/** What `fromError` makes of an effect `SqlError` wrapping the driver's error (SQLSTATE 22003). */
const sqlError: ErrorSummary.ErrorSummary = ErrorSummary.fromError({
  _tag: "SqlError",
  message: "PgConnection: Query failed",
  reason: { _tag: "UnknownError", message: "PgConnection: Query failed", cause: { name: "error", message: "integer out of range", code: "22003" } }
})

describe("Outcome.describe", () => {
  it.effect("a dead letter's line names the innermost cause, as ErrorSummary.describe does", () =>
    Effect.sync(() => {
      const outcome = Outcome.DeadLettered({ message, reason: "PermanentError", error: sqlError, confirmed: true, durationMillis: 3 })
      assert.strictEqual(
        Outcome.describe(outcome),
        "DeadLettered ledger-applier#42 (t-42): PermanentError: SqlError: PgConnection: Query failed (integer out of range, code 22003)"
      )
    }))

  it.effect("the tag is said once when it is the reason, and the innermost cause is still named", () =>
    Effect.sync(() => {
      const plain = Outcome.DeadLettered({
        message,
        reason: "AttemptsExhausted",
        error: ErrorSummary.make("AttemptsExhausted", "3 failed attempts; the retry policy allows 3"),
        confirmed: true,
        durationMillis: 3
      })
      assert.strictEqual(Outcome.describe(plain), "DeadLettered ledger-applier#42 (t-42): AttemptsExhausted: 3 failed attempts; the retry policy allows 3")
      const wrapped = Outcome.Rejected({
        message,
        reason: "SchemaInvalid",
        error: { ...ErrorSummary.make("SchemaInvalid", "Expected a number"), causes: [{ tag: "ParseError", message: "at [\"amount\"]", fields: {} }] },
        confirmed: true,
        durationMillis: 3
      })
      assert.strictEqual(Outcome.describe(wrapped), "Rejected ledger-applier#42 (t-42): SchemaInvalid: Expected a number (at [\"amount\"])")
    }))

  it.effect("a release's line names the innermost cause of its error", () =>
    Effect.sync(() => {
      const outcome = Outcome.Released({ message, reason: "Retrying", error: sqlError, retryIn: Duration.millis(400), confirmed: true, durationMillis: 3 })
      assert.strictEqual(
        Outcome.describe(outcome),
        `Released ledger-applier#42 (t-42): Retrying (retry in ${Duration.format(Duration.millis(400))}): SqlError: PgConnection: Query failed (integer out of range, code 22003)`
      )
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { ErrorSummary, Outcome } from "@jetworker/core"
import { DateTime, Duration, Effect } from "effect"

const message: Outcome.MessageRef = {
  consumer: "ledger-applier",
  subject: "ledger.transfer.eur",
  sequence: 42,
  deliveryCount: 3,
  eventId: "t-42"
}
const error = ErrorSummary.make("InsufficientFunds", "account a has 10, needs 50", { account: "a", amount: 50 })
const now = DateTime.makeUnsafe(Date.parse("2026-11-30T12:00:00.000Z"))
const expiresAt = DateTime.makeUnsafe(Date.parse("2026-11-30T11:59:00.000Z"))

/** One verdict of every kind (and every reason that changes the command). */
const verdicts = {
  committed: Outcome.verdict("Committed", { message }),
  committedAckWithheld: Outcome.verdict("Committed", { message, ackWithheld: "Interrupted" }),
  committedLeaseLost: Outcome.verdict("Committed", { message, ackWithheld: "LeaseLost" }),
  rejectedMetadata: Outcome.verdict("Rejected", {
    message: { ...message, eventId: undefined },
    reason: "MetadataInvalid",
    error: ErrorSummary.make("MetadataInvalid", "the consumer's metadata gave no event id (a non-empty string)")
  }),
  defect: Outcome.verdict("DeadLettered", { message, reason: "Defect", error }),
  duplicate: Outcome.verdict("Duplicate", { message }),
  expired: Outcome.verdict("Expired", { message, expiresAt, detectedAt: now, stage: "BeforeHandler" }),
  rejectedMalformed: Outcome.verdict("Rejected", {
    message: { ...message, eventId: undefined },
    reason: "MalformedPayload",
    error: ErrorSummary.make("MalformedPayload", "the payload is not UTF-8 JSON")
  }),
  rejectedInvalid: Outcome.verdict("Rejected", {
    message: { ...message, eventId: undefined },
    reason: "SchemaInvalid",
    error: ErrorSummary.make("SchemaInvalid", "Expected a positive whole number at [\"amount\"]")
  }),
  permanent: Outcome.verdict("DeadLettered", { message, reason: "PermanentError", error }),
  exhausted: Outcome.verdict("DeadLettered", { message, reason: "AttemptsExhausted", error }),
  retrying: Outcome.verdict("Released", { message, reason: "Retrying", error, retryIn: Duration.millis(400) }),
  interrupted: Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero }),
  leaseLost: Outcome.verdict("Released", { message, reason: "LeaseLost", error, retryIn: undefined }),
  deadLetterFailed: Outcome.verdict("Released", {
    message,
    reason: "DeadLetterFailed",
    error: ErrorSummary.make("DeadLetterFailed", "the dead-letter publish was not confirmed"),
    retryIn: Duration.seconds(2)
  })
} as const

const commandOf = (verdict: Outcome.Verdict, expiredTo: "Ack" | "DeadLetter" = "Ack") =>
  Outcome.toCommand(verdict, { expiredTo, now })

describe("Outcome", () => {
  it.effect("toCommand maps every outcome to the command of the table", () =>
    Effect.sync(() => {
      const table: ReadonlyArray<readonly [Outcome.Verdict, "Ack" | "DeadLetter", Outcome.Command["_tag"]]> = [
        [verdicts.committed, "Ack", "Ack"],
        [verdicts.committedAckWithheld, "Ack", "Leave"],
        [verdicts.committedLeaseLost, "Ack", "Leave"],
        [verdicts.rejectedMetadata, "Ack", "DeadLetter"],
        [verdicts.defect, "Ack", "DeadLetter"],
        [verdicts.duplicate, "Ack", "Ack"],
        [verdicts.expired, "Ack", "Ack"],
        [verdicts.expired, "DeadLetter", "DeadLetter"],
        [verdicts.rejectedMalformed, "Ack", "DeadLetter"],
        [verdicts.rejectedInvalid, "Ack", "DeadLetter"],
        [verdicts.permanent, "Ack", "DeadLetter"],
        [verdicts.exhausted, "Ack", "DeadLetter"],
        [verdicts.retrying, "Ack", "Nak"],
        [verdicts.interrupted, "Ack", "Nak"],
        [verdicts.deadLetterFailed, "Ack", "Nak"],
        [verdicts.leaseLost, "Ack", "Leave"]
      ]
      for (const [verdict, expiredTo, expected] of table) {
        assert.strictEqual(commandOf(verdict, expiredTo)._tag, expected, `${verdict._tag} (expired to ${expiredTo})`)
      }
      // The table covers every outcome tag.
      assert.deepStrictEqual([...new Set(table.map(([v]) => v._tag))].sort(), [...Outcome.tags].sort())
    }))

  it.effect("only Committed, Duplicate and (by default) Expired are acked: a failure is never counted as done", () =>
    Effect.sync(() => {
      const acked = Object.entries(verdicts)
        .filter(([, verdict]) => commandOf(verdict)._tag === "Ack")
        .map(([name]) => name)
      assert.deepStrictEqual(acked, ["committed", "duplicate", "expired"])
      assert.notStrictEqual(commandOf(verdicts.expired, "DeadLetter")._tag, "Ack")
    }))

  it.effect("Released naks with its retryIn delay, or leaves the message to the ack wait without one", () =>
    Effect.sync(() => {
      const retrying = commandOf(verdicts.retrying)
      assert.isTrue(retrying._tag === "Nak" && Duration.toMillis(retrying.delay) === 400)
      const interrupted = commandOf(verdicts.interrupted)
      assert.isTrue(interrupted._tag === "Nak" && Duration.toMillis(interrupted.delay) === 0, "handed back at once")
      const failed = commandOf(verdicts.deadLetterFailed)
      assert.isTrue(failed._tag === "Nak" && Duration.toMillis(failed.delay) === 2000)
      assert.deepStrictEqual(commandOf(verdicts.leaseLost), Outcome.Command.Leave())
    }))

  it.effect("a dead-letter record carries the message ref, the outcome, the reason, the error and the time", () =>
    Effect.sync(() => {
      for (const verdict of [verdicts.permanent, verdicts.exhausted]) {
        const command = commandOf(verdict)
        assert.strictEqual(command._tag, "DeadLetter")
        if (command._tag !== "DeadLetter") continue
        assert.deepStrictEqual(command.record, {
          outcome: "DeadLettered",
          reason: verdict.reason,
          error,
          message,
          failedAt: now
        })
      }
      const rejected = commandOf(verdicts.rejectedInvalid)
      assert.isTrue(rejected._tag === "DeadLetter")
      if (rejected._tag === "DeadLetter") {
        assert.strictEqual(rejected.record.outcome, "Rejected")
        assert.strictEqual(rejected.record.reason, "SchemaInvalid")
        assert.deepStrictEqual(rejected.record.message, verdicts.rejectedInvalid.message)
        assert.isUndefined(rejected.record.message.eventId)
        assert.deepStrictEqual(rejected.record.error, verdicts.rejectedInvalid.error)
        assert.isTrue(DateTime.Equivalence(rejected.record.failedAt, now))
      }
    }))

  it.effect("an expired message dead-lettered by contract says so in its record", () =>
    Effect.sync(() => {
      const command = commandOf(verdicts.expired, "DeadLetter")
      assert.isTrue(command._tag === "DeadLetter")
      if (command._tag !== "DeadLetter") return
      assert.strictEqual(command.record.outcome, "Expired")
      assert.strictEqual(command.record.reason, "Expired")
      assert.deepStrictEqual(command.record.message, message)
      assert.strictEqual(command.record.error.tag, "Expired")
      assert.deepStrictEqual(command.record.error.fields, { stage: "BeforeHandler" })
      // The record is plain data: it survives JSON, as the dead-letter headers need.
      const error = JSON.parse(JSON.stringify(command.record.error)) as ErrorSummary.ErrorSummary
      assert.deepStrictEqual(error, command.record.error)
    }))

  it.effect("settled completes a verdict into an outcome with its confirmation and duration", () =>
    Effect.sync(() => {
      const outcome = Outcome.settled(verdicts.exhausted, true, 12)
      assert.isTrue(Outcome.$is("DeadLettered")(outcome))
      assert.deepStrictEqual(outcome, { ...verdicts.exhausted, confirmed: true, durationMillis: 12 })
      const line = Outcome.describe(outcome)
      assert.include(line, "DeadLettered ledger-applier#42 (t-42)")
      assert.include(line, "AttemptsExhausted")
      assert.include(
        Outcome.describe(Outcome.settled(verdicts.retrying, true, 1)),
        `Retrying (retry in ${Duration.format(Duration.millis(400))})`
      )
    }))
})

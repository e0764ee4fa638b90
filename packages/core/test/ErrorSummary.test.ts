import { assert, describe, it } from "@effect/vitest"
import { ErrorSummary } from "@jetworker/core"
import { Data } from "effect"

class Wrapped extends Data.TaggedError("SqlError")<{ readonly message: string; readonly cause: unknown }> {}

describe("ErrorSummary.describe (a log line's error)", () => {
  it("adds the innermost wrapped error's message, which names what to check", () => {
    const error = new Wrapped({ message: "PgConnection: Failed to connect", cause: new Error("connect ECONNREFUSED 127.0.0.1:5433") })
    assert.strictEqual(
      ErrorSummary.describe(ErrorSummary.fromError(error)),
      "SqlError: PgConnection: Failed to connect (connect ECONNREFUSED 127.0.0.1:5433)"
    )
  })

  it("says it once when the outer message already does, and is the tag and message alone without a chain", () => {
    const repeated = new Wrapped({ message: "timeout: no reply", cause: new Error("no reply") })
    assert.strictEqual(ErrorSummary.describe(ErrorSummary.fromError(repeated)), "SqlError: timeout: no reply")
    assert.strictEqual(ErrorSummary.describe(ErrorSummary.make("UnknownSku", "unknown SKU unicorn")), "UnknownSku: unknown SKU unicorn")
  })

  it("adds the innermost error's code (a PostgreSQL SQLSTATE) where no message says it already", () => {
    const pgError = Object.assign(new Error("integer out of range"), { code: "22003", severity: "ERROR" })
    const error = new Wrapped({ message: "PgConnection: Query failed", cause: pgError })
    assert.strictEqual(ErrorSummary.describe(ErrorSummary.fromError(error)), "SqlError: PgConnection: Query failed (integer out of range, code 22003)")
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5433"), { code: "ECONNREFUSED" })
    assert.strictEqual(
      ErrorSummary.describe(ErrorSummary.fromError(new Wrapped({ message: "PgConnection: Failed to connect", cause: refused }))),
      "SqlError: PgConnection: Failed to connect (connect ECONNREFUSED 127.0.0.1:5433)"
    )
  })
})

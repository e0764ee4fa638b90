/**
 * How the store's error mapping reads a connection that failed at the socket level, in the shapes
 * `@effect/sql-pg` reports it (a `ConnectionError` whose `cause` is Node's error, with its `code`
 * where PostgreSQL's error has its SQLSTATE): a lost connection, never a SQLSTATE; and a defect
 * cause of a transaction whose rollback failed with it is settled into a typed failure.
 */
import { assert, describe, it } from "@effect/vitest"
import { IdempotencyError } from "@jetworker/core/IdempotencyStore"
import { Cause, Data } from "effect"
import * as SqlErrors from "effect/sql/SqlError"
import {
  box,
  classify,
  connectionLost,
  failedCleanup,
  isConnectionLoss,
  settle,
  socketCode,
  sqlState
} from "../src/internal/errors.ts"

const table = "\"jetworker_dedup\""

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

/** Node's error of a failed system call on a socket, as `net` makes it. */
const systemError = (code: string, syscall: string, errno: number): Error =>
  Object.assign(new Error(`${syscall} ${code}`), { code, syscall, errno })

/** What PgConnection reports when its socket errs (`onSocketError`). */
const socketError = (cause: unknown) =>
  new SqlErrors.SqlError({
    reason: new SqlErrors.ConnectionError({ cause, message: "PgConnection: Socket error", operation: "query" })
  })

/** What PgConnection reports when PostgreSQL answers with an error. */
const serverError = (code: string) =>
  new SqlErrors.SqlError({
    reason: new SqlErrors.UnknownError({
      cause: Object.assign(new Error(`server error ${code}`), { code, severity: "ERROR" }),
      message: "PgConnection: Query failed",
      operation: "query"
    })
  })

describe("connection loss at the socket level", () => {
  it("Node's socket codes are connection losses, named as such and never as a SQLSTATE", () => {
    const cases = [
      socketError(systemError("ECONNRESET", "read", -104)),
      socketError(systemError("EPIPE", "write", -32)), // five capitals, like a SQLSTATE
      socketError(systemError("ETIMEDOUT", "read", -110)),
      socketError(systemError("ENOTCONN", "write", -107)),
      socketError(Object.assign(new Error("Cannot call write after a stream was destroyed"), { code: "ERR_STREAM_DESTROYED" })),
      // Wrapped by another layer as an unknown error: the socket's code still decides.
      new SqlErrors.SqlError({
        reason: new SqlErrors.UnknownError({
          cause: new Error("query failed", { cause: systemError("ECONNRESET", "read", -104) }),
          message: "wrapped"
        })
      })
    ]
    for (const error of cases) {
      const code = socketCode(error)
      assert.isDefined(code, String(error.reason.cause))
      assert.isUndefined(sqlState(error), code)
      assert.isTrue(isConnectionLoss(error), code)
      const classified = classify(error, table)
      assert.strictEqual(classified.reason, "Unavailable", classified.message)
      assert.include(classified.message, `the connection to PostgreSQL was lost (${code})`)
      assert.notInclude(classified.message, "SQLSTATE")
    }
  })

  it("a refused connection is named as one", () => {
    const error = new SqlErrors.SqlError({
      reason: new SqlErrors.ConnectionError({
        cause: systemError("ECONNREFUSED", "connect", -111),
        message: "PgConnection: Failed to connect",
        operation: "connect"
      })
    })
    assert.strictEqual(connectionLost(error), "could not connect to PostgreSQL (ECONNREFUSED)")
    assert.strictEqual(classify(error, table).reason, "Unavailable")
  })

  it("the driver's closed socket (no code) is a connection loss, worded without a code", () => {
    const closed = new SqlErrors.SqlError({
      reason: new SqlErrors.ConnectionError({
        cause: new Error("Connection closed"),
        message: "PgConnection: Connection closed",
        operation: "query"
      })
    })
    assert.isTrue(isConnectionLoss(closed))
    assert.strictEqual(connectionLost(closed), "the connection to PostgreSQL was lost")
  })

  it("real SQLSTATEs keep their meaning and wording", () => {
    assert.strictEqual(sqlState(serverError("57P01")), "57P01")
    assert.isTrue(isConnectionLoss(serverError("57P01")))
    assert.isFalse(isConnectionLoss(serverError("23502")))
    assert.isUndefined(connectionLost(serverError("57P01")))
    assert.include(classify(serverError("42P01"), table).message, "SQLSTATE 42P01")
    assert.strictEqual(classify(serverError("22003"), table).reason, "InvalidData")
    // A code of another shape is not a SQLSTATE.
    assert.isUndefined(sqlState(serverError("E123")))
  })

  it("a rollback that failed with a reset socket settles the user's error, not a defect", () => {
    const reset = socketError(systemError("ECONNRESET", "write", -104))
    const boom = new Boom({ message: "transfer rejected" })
    const cause = Cause.fromReasons<SqlErrors.SqlError>([Cause.makeDieReason(box(boom)), Cause.makeDieReason(reset)])
    assert.isDefined(failedCleanup(cause, false))
    const settled = settle(table)(cause)
    assert.isFalse(Cause.hasDies(settled), String(settled))
    assert.strictEqual(Cause.squash(settled), boom)
  })

  it("a transaction whose statement and rollback failed with a reset socket settles IdempotencyError Unavailable", () => {
    const reset = socketError(systemError("ECONNRESET", "write", -104))
    const cause = Cause.fromReasons<SqlErrors.SqlError>([Cause.makeDieReason(reset), Cause.makeDieReason(reset)])
    const settled = settle(table)(cause)
    assert.isFalse(Cause.hasDies(settled), String(settled))
    const error = Cause.squash(settled)
    assert.instanceOf(error, IdempotencyError)
    assert.strictEqual((error as IdempotencyError).reason, "Unavailable")
    assert.include((error as IdempotencyError).message, "the connection to PostgreSQL was lost (ECONNRESET)")
  })
})

/**
 * Maps the store's own `SqlError`s onto core's `IdempotencyError`, by the SQL error's reason (never
 * by message text), and boxes the user's errors so they cross the transaction untouched.
 */
import { IdempotencyError } from "@jetworker/core/IdempotencyStore"
import type { SqlError } from "effect/sql/SqlError"

/** Carries an error of the user's effect through the transaction, apart from the store's own. */
export class UserFailure<E> {
  readonly error: E
  constructor(error: E) {
    this.error = error
  }
}

/** Boxes a user error (the `mapError` callback of the protected effect). */
export const box = <E>(error: E): UserFailure<E> => new UserFailure(error)

/** Unboxes a user error, or classifies a store error (the `mapError` callback of a commit). */
export const unbox = (table: string) => <E>(error: UserFailure<E> | SqlError): E | IdempotencyError =>
  error instanceof UserFailure ? error.error : classify(error, table)

/** The SQLSTATE of the error PostgreSQL reported, when there is one. */
export const sqlState = (error: SqlError): string | undefined => {
  const cause: unknown = error.reason.cause
  if (typeof cause === "object" && cause !== null && "code" in cause && typeof cause.code === "string") {
    return cause.code
  }
  return undefined
}

const detail = (error: SqlError): string => {
  const cause: unknown = error.reason.cause
  const reported = cause instanceof Error && cause.message !== "" ? cause.message : undefined
  const own = error.reason.message ?? error.reason._tag
  return reported === undefined || own.includes(reported) ? own : `${own}: ${reported}`
}

/** The `IdempotencyError` for a failure of the store's own statements (dedup insert, BEGIN, COMMIT). */
export const classify = (error: SqlError, table: string): IdempotencyError => {
  switch (error.reason._tag) {
    case "ConnectionError":
      return new IdempotencyError({
        reason: "Unavailable",
        message: `idempotency store unreachable (${detail(error)})`
      })
    case "DeadlockError":
    case "SerializationError":
    case "LockTimeoutError":
    case "StatementTimeoutError":
      return new IdempotencyError({
        reason: "Conflict",
        message: `idempotency commit conflicted with a concurrent transaction (${detail(error)})`
      })
    case "SqlSyntaxError":
      return misconfigured(error, table)
    default:
      return sqlState(error) === "42P01" ? misconfigured(error, table) : new IdempotencyError({
        reason: "Unavailable",
        message: `idempotency store failed (${detail(error)})`
      })
  }
}

const misconfigured = (error: SqlError, table: string): IdempotencyError =>
  new IdempotencyError({
    reason: "Misconfigured",
    message: `the idempotency table ${table} is missing or does not have the expected shape ` +
      `(${detail(error)}); run the jetworker migrations first (Migrations.run or Migrations.layer ` +
      `from @jetworker/sql-pg, or its migrate command)`
  })

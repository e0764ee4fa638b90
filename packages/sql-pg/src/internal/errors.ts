/**
 * Maps the store's own `SqlError`s onto core's `IdempotencyError`, by the SQLSTATE PostgreSQL
 * reported (never by message text), and boxes the user's errors so they cross the transaction
 * untouched.
 */
import { IdempotencyError } from "@jetworker/core/IdempotencyStore"
import { Predicate } from "effect"
import type { SqlError, SqlErrorReason } from "effect/sql/SqlError"

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

/** Why the store failed, as core names it. */
export type Reason = IdempotencyError["reason"]

/**
 * SQLSTATE codes (five characters) and classes (their first two) with the reason they mean for the
 * store, after PostgreSQL's "PostgreSQL Error Codes" appendix. A code's entry wins over its class's;
 * a code matching neither is `Unavailable`. Retrying must only be able to help where it says so:
 * a data error retried as an outage would go round to exhaustion instead of dead-lettering at once.
 */
export const sqlStateReasons: ReadonlyArray<readonly [classOrCode: string, reason: Reason]> = [
  ["08", "Unavailable"], // connection exception
  ["53", "Unavailable"], // insufficient resources (disk full, out of memory, too many connections)
  ["57", "Unavailable"], // operator intervention (admin or crash shutdown, cannot connect now)
  ["58", "Unavailable"], // system error (I/O error)
  ["40", "Conflict"], // transaction rollback (serialization failure, deadlock)
  ["55P03", "Conflict"], // lock not available (lock_timeout)
  ["57014", "Conflict"], // query canceled (statement_timeout)
  ["42", "Misconfigured"], // syntax error or access rule violation (undefined table or column, no privilege)
  ["3F", "Misconfigured"], // invalid schema name
  ["22", "InvalidData"], // data exception (invalid byte sequence, bad text representation, too long)
  ["23", "InvalidData"] // integrity constraint violation (a unique violation on the dedup key excepted)
]

const bySqlState: ReadonlyMap<string, Reason> = new Map(sqlStateReasons)

/** The reason a SQLSTATE means for the store, by {@link sqlStateReasons}. */
export const reasonForSqlState = (code: string): Reason =>
  bySqlState.get(code) ?? bySqlState.get(code.slice(0, 2)) ?? "Unavailable"

/**
 * The reason for an error without a SQLSTATE (the client's own: a failed connection, a COMMIT
 * that rolled back), by effect's classification; it agrees with {@link sqlStateReasons}.
 */
const byTag: { readonly [Tag in SqlErrorReason["_tag"]]: Reason } = {
  ConnectionError: "Unavailable",
  AuthenticationError: "Unavailable",
  AuthorizationError: "Misconfigured",
  SqlSyntaxError: "Misconfigured",
  UniqueViolation: "InvalidData",
  ConstraintError: "InvalidData",
  DeadlockError: "Conflict",
  SerializationError: "Conflict",
  LockTimeoutError: "Conflict",
  StatementTimeoutError: "Conflict",
  UnknownError: "Unavailable"
}

/** A field PostgreSQL reported with the error (`code`, `table`, `schema`...), when there is one. */
const causeField = (error: SqlError, field: string): string | undefined => {
  const cause: unknown = error.reason.cause
  return Predicate.hasProperty(cause, field) && typeof cause[field] === "string" ? cause[field] : undefined
}

/** The SQLSTATE of the error PostgreSQL reported, when there is one. */
export const sqlState = (error: SqlError): string | undefined => causeField(error, "code")

const uniqueViolation = "23505"

/**
 * Whether `error` is a unique violation on the dedup table `table` (validated and quoted, maybe
 * schema-qualified), whose only unique key is (scope, id): a concurrent commit recorded the key
 * first, so a retry finds it and is a duplicate.
 */
const violatesDedupKey = (error: SqlError, table: string): boolean => {
  if (error.reason._tag !== "UniqueViolation" && sqlState(error) !== uniqueViolation) return false
  const parts = table.replaceAll("\"", "").split(".")
  const name = parts[parts.length - 1]
  const schema = parts.length === 2 ? parts[0] : undefined
  return causeField(error, "table") === name && (schema === undefined || causeField(error, "schema") === schema)
}

/** The reason of a failure of the store's own statements: by SQLSTATE when there is one. */
export const reasonOf = (error: SqlError, table: string): Reason => {
  if (violatesDedupKey(error, table)) return "Conflict"
  const code = sqlState(error)
  return code === undefined ? byTag[error.reason._tag] : reasonForSqlState(code)
}

const detail = (error: SqlError): string => {
  const cause: unknown = error.reason.cause
  const reported = cause instanceof Error && cause.message !== "" ? cause.message : undefined
  const own = error.reason.message ?? error.reason._tag
  const text = reported === undefined || own.includes(reported) ? own : `${own}: ${reported}`
  const code = sqlState(error)
  return code === undefined ? text : `SQLSTATE ${code}: ${text}`
}

/** The `IdempotencyError` for a failure of the store's own statements (dedup insert, BEGIN, COMMIT). */
export const classify = (error: SqlError, table: string): IdempotencyError => {
  const reason = reasonOf(error, table)
  return new IdempotencyError({ reason, message: messages[reason](detail(error), table) })
}

const messages: { readonly [R in Reason]: (detail: string, table: string) => string } = {
  Unavailable: (detail) => `idempotency store failed or unreachable (${detail})`,
  Conflict: (detail) => `idempotency commit conflicted with a concurrent transaction (${detail})`,
  Misconfigured: (detail, table) =>
    `the idempotency table ${table} is missing, not accessible or does not have the expected shape ` +
    `(${detail}); run the jetworker migrations first (Migrations.run or Migrations.layer ` +
    `from @jetworker/sql-pg, or its migrate command)`,
  InvalidData: (detail) =>
    `the database rejected the data of this commit (${detail}); the same event fails the same way ` +
    `on every attempt, so no retry can succeed`
}

/**
 * The `IdempotencyError` for a failed `purge` statement: the reasons of {@link classify}, worded
 * for a purge (which commits no event, so the commit wording would mislead).
 */
export const classifyPurge = (error: SqlError, table: string): IdempotencyError => {
  const reason = reasonOf(error, table)
  return new IdempotencyError({ reason, message: purgeMessages[reason](detail(error), table) })
}

const purgeMessages: { readonly [R in Reason]: (detail: string, table: string) => string } = {
  Unavailable: (detail) => `idempotency purge failed: the store failed or is unreachable (${detail})`,
  Conflict: (detail) => `idempotency purge conflicted with a concurrent transaction (${detail}); running it again can succeed`,
  Misconfigured: (detail, table) => `idempotency purge: ${messages.Misconfigured(detail, table)}`,
  InvalidData: (detail, table) =>
    `the database refused the idempotency purge of ${table} (${detail}); check its olderThan and limit, ` +
    `since the same purge fails the same way every time`
}

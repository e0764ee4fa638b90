/**
 * Maps the store's own `SqlError`s onto core's `IdempotencyError`, by the SQLSTATE PostgreSQL
 * reported (never by message text), and boxes the user's errors so they cross the transaction
 * untouched.
 */
import { IdempotencyError } from "@jetworker/core/IdempotencyStore"
import { Cause, Predicate } from "effect"
import { isSqlError, type SqlError, type SqlErrorReason } from "effect/sql/SqlError"
import { isSentFailure } from "./pipelinedSession.ts"

/** Carries an error of the user's effect through the transaction, apart from the store's own. */
export class UserFailure<E> {
  readonly error: E
  constructor(error: E) {
    this.error = error
  }
}

/** Boxes a user error (the `mapError` callback of the protected effect). */
export const box = <E>(error: E): UserFailure<E> => new UserFailure(error)

/**
 * Unboxes a user error, or classifies a store error (the `mapError` callback of a commit). A
 * statement the effect sent without waiting (`PgPipelinedClient.send`) that failed is reported by
 * the `COMMIT`, but it is the effect's failure (its `SqlError` is in the effect's error type), as
 * it would have been had the effect waited for it.
 */
export const unbox = (table: string) => <E>(error: UserFailure<E> | SqlError | IdempotencyError): E | IdempotencyError =>
  error instanceof UserFailure
    ? error.error
    : error instanceof IdempotencyError
    ? error
    : isSentFailure(error)
    ? error as E
    : classify(error, table)

/**
 * A transaction whose cleanup failed. `@effect/sql` runs `ROLLBACK`, `ROLLBACK TO SAVEPOINT` and
 * `RELEASE SAVEPOINT` under `orDie`, and a failed finalizer turns the transaction's own failures
 * into defects too: when the connection dies under the user's effect (or PostgreSQL aborted the
 * transaction under an effect that then succeeded), the cause is nothing but defects, the store's
 * `UserFailure` box among them. `first` is what ended the transaction (the first defect: a boxed
 * user error, the store's own error or statement); `cleanup` is the statement error of the
 * cleanup (the last `SqlError`).
 */
export interface FailedCleanup {
  readonly first: unknown
  readonly cleanup: SqlError
}

/**
 * Whether `error` says the connection is gone: a connection exception (class 08), the backend
 * shut down or terminated (57P01 to 57P05), the client's own connection error, or a socket that
 * failed under the driver (Node's ECONNRESET, EPIPE..., which carry no SQLSTATE: see
 * {@link socketCode}).
 */
export const isConnectionLoss = (error: SqlError): boolean => {
  const code = sqlState(error)
  return code === undefined
    ? error.reason._tag === "ConnectionError" || socketCode(error) !== undefined
    : code.startsWith("08") || code.startsWith("57P0")
}

/**
 * The {@link FailedCleanup} `cause` stands for, or `undefined` for any other cause: one holding an
 * interruption (never turned into a failure) or a typed failure, or a defect that is not a
 * `SqlError`, a `UserFailure` or an `IdempotencyError` (the user's own defect stays one). With
 * `afterSuccess` (the effect succeeded, so only the cleanup can have failed: an element's `RELEASE
 * SAVEPOINT`) any `SqlError` does; otherwise one must say the connection is gone, since only that
 * fails a rollback, and a `SqlError` a user's effect died with on a live connection stays a defect.
 */
export const failedCleanup = (cause: Cause.Cause<unknown>, afterSuccess: boolean): FailedCleanup | undefined => {
  let cleanup: SqlError | undefined
  let lost = false
  for (const reason of cause.reasons) {
    if (!Cause.isDieReason(reason)) return undefined
    const defect = reason.defect
    if (isSqlError(defect)) {
      cleanup = defect
      lost ||= isConnectionLoss(defect)
    } else if (!(defect instanceof UserFailure) && !(defect instanceof IdempotencyError)) {
      return undefined
    }
  }
  if (cleanup === undefined || !(afterSuccess || lost)) return undefined
  return { first: (cause.reasons[0] as Cause.Die).defect, cleanup }
}

/**
 * The cause a commit's transaction (`commit`, `commitAll`, the batch's) ends with, from the cause
 * `withTransaction` failed with: boxed user errors unboxed and store errors classified, as
 * {@link unbox}; and a {@link FailedCleanup} (the rollback failed with the connection) turned back
 * into the typed failure it hides. A dead connection commits nothing, so the transaction's own
 * failure is the truth: the user's error when the effect failed (what the caller gets when the
 * rollback succeeds), else the store's error, else the failed statement's `IdempotencyError`
 * (`Unavailable` for a lost connection). Interruptions and the user's own defects are left as they are.
 */
export const settle = (table: string) => {
  const unboxed = unbox(table)
  return <E>(cause: Cause.Cause<UserFailure<E> | SqlError | IdempotencyError>): Cause.Cause<E | IdempotencyError> => {
    const failed = failedCleanup(cause, false)
    if (failed === undefined) return Cause.map(cause, unboxed)
    const first = failed.first
    return Cause.fail(
      first instanceof UserFailure || first instanceof IdempotencyError
        ? unboxed(first as UserFailure<E> | IdempotencyError)
        : classify(isSqlError(first) ? first : failed.cleanup, table)
    )
  }
}

/**
 * The batch's failure when the savepoint of the element `key` could not be cleaned up
 * ({@link FailedCleanup}): the transaction is lost (the connection died) or aborted (the effect
 * recovered from a failed statement, so `RELEASE SAVEPOINT` fails with 25P02), and with it every
 * element. Classified by the cleanup's SQLSTATE (both `Unavailable`, as `commit`'s aborted
 * `COMMIT`); the message names the element and the effect's own error, if it failed.
 */
export const batchCleanupFailure = (
  key: { readonly scope: string; readonly id: string },
  failed: FailedCleanup,
  table: string
): IdempotencyError => {
  const element = `${JSON.stringify(key.scope)}/${JSON.stringify(key.id)}`
  const what = isConnectionLoss(failed.cleanup)
    ? `the connection failed while the effect of element ${element} ran`
    : sqlState(failed.cleanup) === abortedTransaction
    ? `the effect of element ${element} recovered from a failed SQL statement, which aborts the whole transaction in ` +
      `PostgreSQL (an effect must fail when one of its statements does)`
    : `the savepoint of element ${element} could not be ended`
  const own = failed.first instanceof UserFailure ? `; the effect itself failed with ${describe(failed.first.error)}` : ""
  return new IdempotencyError({
    reason: reasonOf(failed.cleanup, table),
    message: `commitBatch: ${what}, so nothing of the batch was committed${own} (${detail(failed.cleanup)})`
  })
}

/** SQLSTATE 25P02, in_failed_sql_transaction: a statement after a failed one, before the transaction ended. */
const abortedTransaction = "25P02"

/** A user's error in a message: its tag and message when it has them. */
const describe = (error: unknown): string => {
  const tag = Predicate.hasProperty(error, "_tag") && typeof error._tag === "string" ? error._tag : undefined
  const message = Predicate.hasProperty(error, "message") && typeof error.message === "string" ? error.message : undefined
  if (tag !== undefined || message !== undefined) return [tag, message].filter((part) => part !== undefined && part !== "").join(": ")
  return String(error)
}

/** Why the store failed, as core names it. */
export type Reason = IdempotencyError["reason"]

/**
 * SQLSTATE codes (five characters) and classes (their first two) with the reason they mean for the
 * store, after PostgreSQL's "PostgreSQL Error Codes" appendix. A code's entry wins over its class's;
 * a code matching neither is `Unavailable`. Retrying must only be able to help where it says so:
 * a data error retried as an outage would go round to exhaustion instead of dead-lettering at once.
 * So every class whose errors the same statement on the same data meets again (data, program and
 * routine errors, a limit of the program) is `InvalidData`, and one that only a change of the
 * statement, the schema or the server's setup fixes is `Misconfigured`. Left to the default are
 * the states of the connection, the transaction and the server (25: aborted by an earlier error,
 * or read-only on a standby until a failover ends; 28: authentication; 55; XX) and the unknown.
 */
export const sqlStateReasons: ReadonlyArray<readonly [classOrCode: string, reason: Reason]> = [
  ["08", "Unavailable"], // connection exception
  ["53", "Unavailable"], // insufficient resources (disk full, out of memory, too many connections)
  ["57", "Unavailable"], // operator intervention (admin or crash shutdown, cannot connect now)
  ["58", "Unavailable"], // system error (I/O error)
  ["40", "Conflict"], // transaction rollback (serialization failure, deadlock)
  ["55P03", "Conflict"], // lock not available (lock_timeout)
  ["57014", "Conflict"], // query canceled (statement_timeout)
  ["0A", "Misconfigured"], // feature not supported (by the statement as written)
  ["3D", "Misconfigured"], // invalid catalog name (no such database)
  ["3F", "Misconfigured"], // invalid schema name
  ["42", "Misconfigured"], // syntax error or access rule violation (undefined table or column, no privilege)
  ["F0", "Misconfigured"], // configuration file error
  ["09", "InvalidData"], // triggered action exception
  ["20", "InvalidData"], // case not found (a PL/pgSQL CASE without ELSE)
  ["21", "InvalidData"], // cardinality violation (a scalar subquery of many rows)
  ["22", "InvalidData"], // data exception (invalid byte sequence, bad text representation, too long)
  ["23", "InvalidData"], // integrity constraint violation (a unique violation on the dedup key excepted)
  ["27", "InvalidData"], // triggered data change violation
  ["2F", "InvalidData"], // SQL routine exception (a function ended without RETURN)
  ["38", "InvalidData"], // external routine exception
  ["39", "InvalidData"], // external routine invocation exception
  ["44", "InvalidData"], // WITH CHECK OPTION violation
  ["54", "InvalidData"], // program limit exceeded (an index row too big, a statement too complex)
  ["P0", "InvalidData"] // PL/pgSQL error (RAISE EXCEPTION in a trigger or function, ASSERT)
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

/** What a SQLSTATE looks like: five digits or upper-case letters. */
const sqlStatePattern = /^[0-9A-Z]{5}$/

/**
 * Node's codes of a socket (or a stream over one) that failed or closed under the client: the
 * connection is gone, whatever the driver made of it. `@effect/sql-pg` reports them as a
 * `ConnectionError` whose `cause` is Node's error, with its `code` where PostgreSQL's error has
 * its SQLSTATE.
 */
const socketCodes: ReadonlySet<string> = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "ENOTCONN",
  "ENETDOWN",
  "ENETUNREACH",
  "ENETRESET",
  "EHOSTDOWN",
  "EHOSTUNREACH",
  "EAI_AGAIN",
  "ERR_SOCKET_CLOSED",
  "ERR_STREAM_DESTROYED",
  "ERR_STREAM_PREMATURE_CLOSE",
  "ERR_STREAM_WRITE_AFTER_END"
])

/** How deep {@link socketCode} looks into the errors the reason wraps. */
const maxCauseDepth = 4

/** Whether `value` is Node's error of a system call (it has a `syscall` or a numeric `errno`). */
const isSystemError = (value: unknown): boolean =>
  Predicate.hasProperty(value, "syscall") || (Predicate.hasProperty(value, "errno") && typeof value.errno === "number")

/**
 * Node's code of the socket failure under `error`, when it is one: the code of the error the
 * reason wraps (or of one it wraps in turn, a few levels deep) when it is a {@link socketCodes}
 * code or Node's error of a system call (`syscall`, `errno`). Never a SQLSTATE.
 */
export const socketCode = (error: SqlError): string | undefined => {
  let cause: unknown = error.reason.cause
  for (let depth = 0; depth < maxCauseDepth && Predicate.isObject(cause); depth++) {
    const code = Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : undefined
    if (code !== undefined && (socketCodes.has(code) || isSystemError(cause))) return code
    cause = Predicate.hasProperty(cause, "cause") ? cause.cause : undefined
  }
  return undefined
}

/**
 * The SQLSTATE of the error PostgreSQL reported, when there is one: five digits or upper-case
 * letters, and not Node's code of a failed socket (which the driver puts in the same place, and
 * of which `EPIPE` has the same shape).
 */
export const sqlState = (error: SqlError): string | undefined => {
  const code = causeField(error, "code")
  if (code === undefined || !sqlStatePattern.test(code)) return undefined
  const cause: unknown = error.reason.cause
  return socketCodes.has(code) || isSystemError(cause) ? undefined : code
}

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
  if (code !== undefined) return reasonForSqlState(code)
  // A socket that failed under a statement: the outage it is, whatever the driver's reason says.
  return socketCode(error) === undefined ? byTag[error.reason._tag] : "Unavailable"
}

/**
 * What happened to the connection, in words, when `error` says it is gone ({@link isConnectionLoss})
 * and PostgreSQL did not say so itself (no SQLSTATE): "the connection to PostgreSQL was lost
 * (ECONNRESET)", or "could not connect to PostgreSQL (ECONNREFUSED)" when it failed while
 * connecting; otherwise `undefined`. Node's code is named, never passed off as a SQLSTATE.
 */
export const connectionLost = (error: SqlError): string | undefined => {
  if (sqlState(error) !== undefined || !isConnectionLoss(error)) return undefined
  const code = socketCode(error)
  const what = error.reason.operation === "connect" ? "could not connect to PostgreSQL" : "the connection to PostgreSQL was lost"
  return code === undefined ? what : `${what} (${code})`
}

/** The error in words: the SQLSTATE or the lost connection first, then the driver's and PostgreSQL's messages. */
const detail = (error: SqlError): string => {
  const cause: unknown = error.reason.cause
  const reported = cause instanceof Error && cause.message !== "" ? cause.message : undefined
  const own = error.reason.message ?? error.reason._tag
  const text = reported === undefined || own.includes(reported) ? own : `${own}: ${reported}`
  const code = sqlState(error)
  if (code !== undefined) return `SQLSTATE ${code}: ${text}`
  const lost = connectionLost(error)
  return lost === undefined ? text : `${lost}: ${text}`
}

/** The `IdempotencyError` for a failure of the store's own statements (dedup insert, BEGIN, COMMIT). */
export const classify = (error: SqlError, table: string): IdempotencyError => {
  const reason = reasonOf(error, table)
  return new IdempotencyError({ reason, message: messages[reason](detail(error), table) })
}

/** What a probe found about the dedup table after a `commitStatement` failed: usable, not, or unknown. */
export type DedupTableState = "usable" | "unusable" | "unknown"

/**
 * The `IdempotencyError` for a failure of `commitStatement`'s one statement, which holds both the
 * dedup row's insert and the user's statement: classified as {@link classify}, but a
 * `Misconfigured` one is worded by what a probe of the dedup table found (`dedupTable`): the
 * statement's own error when the table is usable, the table's (run the migrations) when it is
 * not, and either when that is unknown.
 */
export const classifyStatement = (error: SqlError, table: string, dedupTable: DedupTableState): IdempotencyError => {
  const reason = reasonOf(error, table)
  if (reason !== "Misconfigured" || dedupTable === "unusable") return classify(error, table)
  const refused = `commitStatement: PostgreSQL refused the statement (${detail(error)})`
  return new IdempotencyError({
    reason,
    message: dedupTable === "usable"
      ? `${refused}; the idempotency table ${table} is fine, so fix the statement or the objects it names: ` +
        `the same statement fails the same way on every attempt`
      : `${refused}; either the statement or the idempotency table ${table} is at fault (if the message names the ` +
        `table, run the jetworker migrations first)`
  })
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

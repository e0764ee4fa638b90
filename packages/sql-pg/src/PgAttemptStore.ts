/**
 * The attempts budget's memory on PostgreSQL: one row per event that has failed at least once or
 * been dead-lettered, `(scope, id, failures, dead_letter)`, in the table the migrations create
 * (`jetworker_attempts`). Each failure is recorded by one atomic upsert on its own connection,
 * outside the handler's transaction (which rolled back), so the count survives crashes, restarts
 * and the broker rewinding its delivery count; a dead-letter decision likewise (`dead_letter`, as
 * JSON), before the dead letter is written. The engine reads the row (one statement) only for
 * redeliveries and clears it once the message is settled for good, so a message that never fails
 * costs no round trip and leaves no row.
 *
 * It deliberately does not decide anything: the engine compares the count with the retry policy,
 * and writes the decisions it made.
 *
 * @since 0.1.0
 */
import {
  AttemptStore,
  AttemptStoreError,
  type Attempts,
  type AttemptStoreShape,
  type DeadLetterDecision
} from "@jetworker/core/AttemptStore"
import type { Key } from "@jetworker/core/IdempotencyStore"
import { Cause, Duration, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import * as DurationInput from "@jetworker/core/DurationInput"
import { connectionLost } from "./internal/errors.ts"
import * as PurgeLimit from "./internal/purgeLimit.ts"
import * as Table from "./internal/table.ts"
import { type MissingTable, requireTable } from "./internal/tableCheck.ts"

/** Options of the store. */
export interface Options {
  /**
   * The attempts table, a lowercase identifier optionally qualified by a schema. It must have the
   * shape the migrations create. Default: `"jetworker_attempts"`.
   */
  readonly table?: string | undefined
}

/**
 * The store's error for a failed statement. A socket that failed under it is named as the lost
 * connection it is (with Node's code, e.g. ECONNRESET): the driver's own message ("Socket error")
 * does not say which.
 */
const storeError = (operation: string) => (error: SqlError) => {
  const lost = connectionLost(error)
  return new AttemptStoreError({ message: `attempt store ${operation}: ${lost === undefined ? error.message : `${lost} (${error.message})`}` })
}

const Fields = Schema.Record(Schema.String, Schema.Union([Schema.String, Schema.Number, Schema.Boolean]))

/** The `dead_letter` column's JSON: an `AttemptStore.DeadLetterDecision`. */
const Decision = Schema.Struct({
  reason: Schema.Literals(["PermanentError", "AttemptsExhausted", "DeliveriesExhausted", "Defect"]),
  error: Schema.Struct({
    kind: Schema.Literals(["Failure", "Defect", "Interrupted"]),
    tag: Schema.String,
    message: Schema.String,
    fields: Fields,
    causes: Schema.optional(Schema.Array(Schema.Struct({ tag: Schema.String, message: Schema.String, fields: Fields })))
  }),
  effectCommitted: Schema.optional(Schema.Boolean)
})
const decodeDecision = Schema.decodeUnknownExit(Decision)

/**
 * A row as `read` gives it: a `dead_letter` that does not decode (written by hand, or by a newer
 * version) is an error, not "no decision", which would run the handler of a dead-lettered event.
 */
const attemptsOf = (
  row: { readonly failures: number; readonly dead_letter: unknown } | undefined
): Effect.Effect<Attempts, AttemptStoreError> => {
  if (row === undefined) return Effect.succeed(none)
  if (row.dead_letter === null || row.dead_letter === undefined) return Effect.succeed({ failures: row.failures })
  const decoded = decodeDecision(row.dead_letter)
  return decoded._tag === "Success"
    ? Effect.succeed({ failures: row.failures, deadLetter: decoded.value as DeadLetterDecision })
    : Effect.fail(new AttemptStoreError({ message: `attempt store read: the recorded dead-letter decision is not one: ${Cause.pretty(decoded.cause)}` }))
}
const none: Attempts = { failures: 0 }

/** Builds the store on the current `SqlClient`; fails when the table name is invalid. */
export const make = (options?: Options): Effect.Effect<AttemptStoreShape, AttemptStoreError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const name = options?.table ?? Table.defaultAttemptsTable
    const table = Table.quote(name)
    if (table === undefined) return yield* new AttemptStoreError({ message: Table.invalidMessage(name, "attempts") })
    const sql = yield* SqlClient.SqlClient
    const upsert = `INSERT INTO ${table} AS t (scope, id, failures) VALUES ($1, $2, 1)
ON CONFLICT (scope, id) DO UPDATE SET failures = t.failures + 1, updated_at = now()
RETURNING failures`
    // A decision keeps the failures counted (none if it is the first row of the event).
    const decide = `INSERT INTO ${table} AS t (scope, id, failures, dead_letter) VALUES ($1, $2, 0, $3::jsonb)
ON CONFLICT (scope, id) DO UPDATE SET dead_letter = EXCLUDED.dead_letter, updated_at = now()`
    const select = `SELECT failures, dead_letter FROM ${table} WHERE scope = $1 AND id = $2`
    const remove = `DELETE FROM ${table} WHERE scope = $1 AND id = $2`
    return {
      read: (key: Key) =>
        sql.unsafe<{ readonly failures: number; readonly dead_letter: unknown }>(select, [key.scope, key.id]).pipe(
          Effect.mapError(storeError("read")),
          Effect.flatMap((rows) => attemptsOf(rows[0]))
        ),
      recordDeadLetter: (key: Key, decision: DeadLetterDecision) =>
        sql.unsafe(decide, [key.scope, key.id, JSON.stringify(decision)]).pipe(
          Effect.asVoid,
          Effect.mapError(storeError("record dead letter"))
        ),
      recordFailure: (key: Key) =>
        sql.unsafe<{ readonly failures: number }>(upsert, [key.scope, key.id]).pipe(
          Effect.map((rows) => rows[0]?.failures ?? 1),
          Effect.mapError(storeError("record"))
        ),
      clear: (key: Key) => sql.unsafe(remove, [key.scope, key.id]).pipe(Effect.asVoid, Effect.mapError(storeError("clear")))
    }
  })

/**
 * The store as a layer over the current `SqlClient`. Building it fails with `AttemptStoreError`
 * when the table name is invalid, and with `Migrations.MissingTable` when the table does not exist
 * (the migrations have not run on this database and schema), as `PgIdempotencyStore.layer` does;
 * a database that cannot be reached fails the check with its `SqlError`, never as a missing table.
 * {@link make} checks nothing.
 */
export const layer = (options?: Options): Layer.Layer<AttemptStore, AttemptStoreError | MissingTable | SqlError, SqlClient.SqlClient> =>
  Layer.effect(
    AttemptStore,
    Effect.map(
      Effect.tap(make(options), () => requireTable(options?.table ?? Table.defaultAttemptsTable, "attempts")),
      (shape) => AttemptStore.of(shape)
    )
  )

/**
 * Deletes at most `limit` rows not updated for `olderThan` (messages that stopped failing
 * without reaching a final outcome the engine saw, e.g. purged from the stream; dead-letter
 * decisions whose term was never confirmed, once no redelivery can come) and returns how
 * many it deleted. A negative, NaN or infinite `olderThan`, and a `limit` outside 1 to
 * 2147483647, are refused before any statement.
 */
export const purge = (options: {
  readonly olderThan: Duration.Input
  readonly limit: number
  readonly table?: string | undefined
}): Effect.Effect<number, AttemptStoreError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const name = options.table ?? Table.defaultAttemptsTable
    const table = Table.quote(name)
    if (table === undefined) return yield* new AttemptStoreError({ message: Table.invalidMessage(name, "attempts") })
    // Read as given: effect turns a NaN into a zero duration. A negative or NaN age ("-1 hour", a
    // sign slip) would delete counts recorded a moment ago, resetting the retry budget of messages
    // still being retried.
    const olderThan = DurationInput.parse(options.olderThan)
    if (olderThan === undefined || !Duration.isFinite(olderThan) || Duration.toMillis(olderThan) < 0) {
      return yield* new AttemptStoreError({
        message: `purge: olderThan must be a finite duration of at least 0, got ${DurationInput.show(options.olderThan)}`
      })
    }
    const limitProblem = PurgeLimit.problem(options.limit)
    if (limitProblem !== undefined) return yield* new AttemptStoreError({ message: limitProblem })
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql.unsafe<{ readonly deleted: number }>(
      `WITH doomed AS (
  SELECT scope, id FROM ${table} WHERE updated_at < now() - make_interval(secs => $1::double precision)
  ORDER BY updated_at LIMIT $2::integer FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM ${table} AS t USING doomed WHERE t.scope = doomed.scope AND t.id = doomed.id RETURNING 1
)
SELECT count(*)::integer AS deleted FROM deleted`,
      [Duration.toMillis(olderThan) / 1000, options.limit]
    ).pipe(Effect.mapError(storeError("purge")))
    return rows[0]?.deleted ?? 0
  })

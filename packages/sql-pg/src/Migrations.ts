/**
 * The database objects `@jetworker/sql-pg` needs (the dedup table, the failed-attempts table with
 * its dead-letter decisions, the outbox), as migrations run by effect's generic SQL migrator, which
 * records them in their own table (`jetworker_migrations`, so their ids never collide with the
 * application's migrations). Running them is safe from several processes at once:
 * the migrator locks its table for the run, so one process applies them and the others find
 * them applied. Every statement is also idempotent (`IF NOT EXISTS`), so the SQL text in
 * {@link statements} can be applied ahead of time with psql, and the migrator still runs cleanly after.
 *
 * It deliberately does not drop or rewrite anything, dump the schema (no `pg_dump`, so it needs
 * only a `SqlClient`), or create tables for a store configured with another table name: such a
 * table must have the same columns and primary key (an attempts table also the `dead_letter jsonb`
 * column migration 5 adds; an outbox also the unique index on `id`, named `<table>_id_key` as
 * `UNIQUE (id)` names it). Nor does it delete anything to make a step fit: an
 * outbox holding an id more than once fails migration 4, naming the ids, until a person fixes them.
 *
 * @since 0.1.0
 */
import * as Lifecycle from "@jetworker/core/Lifecycle"
import { Effect, Layer } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { isConnectionLoss } from "./internal/errors.ts"
import * as Table from "./internal/table.ts"

/** The table in which the migrator records which of these migrations ran. */
export const table = "jetworker_migrations"

const dedup: ReadonlyArray<string> = Table.ddl(`"${Table.defaultTable}"`, `${Table.defaultTable}_committed_at_idx`)
const attempts: ReadonlyArray<string> = Table.attemptsDdl(
  `"${Table.defaultAttemptsTable}"`,
  `${Table.defaultAttemptsTable}_updated_at_idx`
)
const attemptsDeadLetter: ReadonlyArray<string> = Table.attemptsDeadLetterDdl(`"${Table.defaultAttemptsTable}"`)
const outbox: ReadonlyArray<string> = Table.outboxDdl(`"${Table.defaultOutboxTable}"`, Table.defaultOutboxTable)

/**
 * The unique index on the outbox's `id` (PostgreSQL's own name for `UNIQUE (id)`): the relay
 * publishes a row with its id as `Nats-Msg-Id`, and the stream drops a second message with an id it
 * still remembers as a duplicate, so a second event recorded under one id would be marked sent and
 * lost. With the index, `Outbox.record` of an id still in the table fails its transaction instead.
 */
const outboxIdIndex = `${Table.defaultOutboxTable}_id_key`

/**
 * A table that already holds an id more than once (recorded before this migration) cannot take
 * the index: the check before it fails the migration naming those ids and what to do, where the
 * index build would only say that it could not be built. Nothing is deleted here: which of the
 * rows is right is for a person to say. No statement ends a line with `;` (the script's separator).
 */
const outboxUniqueId: ReadonlyArray<string> = [
  `DO $jetworker$ BEGIN
  IF EXISTS (SELECT FROM "${Table.defaultOutboxTable}" GROUP BY id HAVING count(*) > 1) THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation', MESSAGE = (
      SELECT format(
        'the outbox table ${Table.defaultOutboxTable} holds %s id(s) recorded more than once (%s%s): outbox ids must be ' ||
          'unique per event, since the stream drops a second message with an id it remembers as a duplicate. ' ||
          'Delete the repeated rows (a sent one is history) or give a pending one an id of its own, then run the ' ||
          'migrations again; SELECT seq, id, sent_at FROM ${Table.defaultOutboxTable} WHERE id IN (SELECT id FROM ' ||
          '${Table.defaultOutboxTable} GROUP BY id HAVING count(*) > 1) ORDER BY id, seq lists them',
        count(*), string_agg(quote_literal(id), ', ' ORDER BY id) FILTER (WHERE n <= 5), CASE WHEN count(*) > 5 THEN ', ...' ELSE '' END)
      FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM "${Table.defaultOutboxTable}" GROUP BY id HAVING count(*) > 1) AS repeated
    ); END IF; END $jetworker$`,
  `CREATE UNIQUE INDEX IF NOT EXISTS "${outboxIdIndex}" ON "${Table.defaultOutboxTable}" (id)`
]

/** Every statement of every migration, in order, as plain SQL (each idempotent). */
export const statements: ReadonlyArray<string> = [...dedup, ...attempts, ...outbox, ...outboxUniqueId, ...attemptsDeadLetter]

/** The same statements as one script, for `psql -f` (a user may run it ahead of time). */
export const script: string = statements.map((statement) => `${statement};\n`).join("\n")

const runAll = (sqlTexts: ReadonlyArray<string>): Effect.Effect<void, SqlError, SqlClient.SqlClient> =>
  SqlClient.SqlClient.use((sql) => Effect.forEach(sqlTexts, (text) => sql.unsafe(text), { discard: true }))

/** The migrations, keyed `<id>_<name>` as effect's `Migrator.fromRecord` expects. */
export const migrations: Readonly<Record<string, Effect.Effect<void, SqlError, SqlClient.SqlClient>>> = {
  "1_jetworker_dedup": runAll(dedup),
  "2_jetworker_attempts": runAll(attempts),
  "3_jetworker_outbox": runAll(outbox),
  // Its own step: migration 3 may already have run (without the index) in a deployed database.
  "4_jetworker_outbox_unique_id": runAll(outboxUniqueId),
  // The attempts table's dead-letter decisions (`PgAttemptStore.recordDeadLetter`): a column added
  // to a table migration 2 may have created long before.
  "5_jetworker_attempts_dead_letter": runAll(attemptsDeadLetter)
}

/** Applies the pending migrations and returns the ones it applied, as `[id, name]`. */
export const run: Effect.Effect<
  ReadonlyArray<readonly [id: number, name: string]>,
  Migrator.MigrationError | SqlError,
  SqlClient.SqlClient
> = Migrator.make({})({ loader: Migrator.fromRecord(migrations), table })

export {
  /**
   * A store's table does not exist where its statements look for it: what building
   * `PgIdempotencyStore.layer`, `PgAttemptStore.layer` or `PgOutbox.layer` fails with on a database
   * and schema these migrations have not run on.
   */
  MissingTable
} from "./internal/tableCheck.ts"

/**
 * Applies the pending migrations while the layer is built. Provided beneath the stores' layers
 * (`PgIdempotencyStore.layer().pipe(Layer.provide(Migrations.layer))`), it runs before their check
 * of their tables. Under a worker that is still starting, a database that cannot be reached yet
 * is waited for (`Lifecycle.waitFor`, dependency `postgres`), as the stores' check waits.
 */
export const layer: Layer.Layer<never, Migrator.MigrationError | SqlError, SqlClient.SqlClient> = Layer.effectDiscard(
  Lifecycle.waitFor("postgres", run, { while: (error) => error._tag === "SqlError" && (error.isRetryable || isConnectionLoss(error)) })
)

/**
 * The database objects `@jetworker/sql-pg` needs (the dedup table, the failed-attempts table, the outbox), as migrations run by effect's generic SQL
 * migrator, which records them in their own table (`jetworker_migrations`, so their ids never
 * collide with the application's migrations). Running them is safe from several processes at once:
 * the migrator locks its table for the run, so one process applies them and the others find
 * them applied. Every statement is also idempotent (`IF NOT EXISTS`), so the SQL text in
 * {@link statements} can be applied ahead of time with psql, and the migrator still runs cleanly after.
 *
 * It deliberately does not drop or rewrite anything, dump the schema (no `pg_dump`, so it needs
 * only a `SqlClient`), or create tables for a store configured with another table name: such a
 * table must have the same columns and primary key.
 *
 * @since 0.1.0
 */
import { Effect, Layer } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import * as Table from "./internal/table.ts"

/** The table in which the migrator records which of these migrations ran. */
export const table = "jetworker_migrations"

const dedup: ReadonlyArray<string> = Table.ddl(`"${Table.defaultTable}"`, `${Table.defaultTable}_committed_at_idx`)
const attempts: ReadonlyArray<string> = Table.attemptsDdl(
  `"${Table.defaultAttemptsTable}"`,
  `${Table.defaultAttemptsTable}_updated_at_idx`
)
const outbox: ReadonlyArray<string> = Table.outboxDdl(`"${Table.defaultOutboxTable}"`, Table.defaultOutboxTable)

/** Every statement of every migration, in order, as plain SQL (each idempotent). */
export const statements: ReadonlyArray<string> = [...dedup, ...attempts, ...outbox]

/** The same statements as one script, for `psql -f` (a user may run it ahead of time). */
export const script: string = statements.map((statement) => `${statement};\n`).join("\n")

const runAll = (sqlTexts: ReadonlyArray<string>): Effect.Effect<void, SqlError, SqlClient.SqlClient> =>
  SqlClient.SqlClient.use((sql) => Effect.forEach(sqlTexts, (text) => sql.unsafe(text), { discard: true }))

/** The migrations, keyed `<id>_<name>` as effect's `Migrator.fromRecord` expects. */
export const migrations: Readonly<Record<string, Effect.Effect<void, SqlError, SqlClient.SqlClient>>> = {
  "1_jetworker_dedup": runAll(dedup),
  "2_jetworker_attempts": runAll(attempts),
  "3_jetworker_outbox": runAll(outbox)
}

/** Applies the pending migrations and returns the ones it applied, as `[id, name]`. */
export const run: Effect.Effect<
  ReadonlyArray<readonly [id: number, name: string]>,
  Migrator.MigrationError | SqlError,
  SqlClient.SqlClient
> = Migrator.make({})({ loader: Migrator.fromRecord(migrations), table })

/** Applies the pending migrations while the layer is built. */
export const layer: Layer.Layer<never, Migrator.MigrationError | SqlError, SqlClient.SqlClient> = Layer.effectDiscard(run)

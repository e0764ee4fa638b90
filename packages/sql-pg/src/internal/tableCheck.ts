/**
 * The check the stores' layers make as they are built: that the table their statements use
 * exists where those statements will look for it (an unqualified name over the session's
 * `search_path`, a qualified one in its schema). Without it, a store built on a schema the
 * migrations never ran on fails every commit with SQLSTATE 42P01, and every message is
 * dead-lettered. One query (`to_regclass`), bounded; a database that cannot be reached stays the
 * connection failure it is, waited for while a worker starts, like the first contact with any
 * dependency (`Lifecycle.waitFor`).
 */
import * as Lifecycle from "@jetworker/core/Lifecycle"
import { Data, Duration, Effect } from "effect"
import { SqlClient } from "effect/sql"
import { ConnectionError, SqlError } from "effect/sql/SqlError"
import { isConnectionLoss } from "./errors.ts"
import * as Table from "./table.ts"

/**
 * A store's table does not exist where its statements look for it: the migrations have not run on
 * this database and schema (or the store names a table of its own that nobody created). Building
 * `PgIdempotencyStore.layer`, `PgAttemptStore.layer` or `PgOutbox.layer` fails with it, so that a
 * worker refuses to start instead of dead-lettering every message. Its message names the table,
 * the schema and the database (never the connection URL) and what to do.
 *
 * @since 0.1.0
 */
export class MissingTable extends Data.TaggedError("MissingTable")<{
  /** The table's name as the store was given it (default `jetworker_dedup`, `jetworker_attempts`, `jetworker_outbox`). */
  readonly table: string
  /** Which store's table it is. */
  readonly role: "idempotency" | "attempts" | "outbox"
  /**
   * The schema it was looked for in: the one the name gives, else the session's current schema
   * (the first schema of its `search_path` that exists); `undefined` when none of those exists.
   */
  readonly schema: string | undefined
  /** The session's `search_path`. */
  readonly searchPath: string
  /** The database, as PostgreSQL names it. */
  readonly database: string
  readonly message: string
}> {}

/** How long one check may wait for its answer (connecting included) before it counts as a connection failure. */
export const checkTimeout = Duration.seconds(10)

/** Aliases without `_`: a client that transforms result names (to camel case) leaves them alone. */
const checkText = `SELECT to_regclass($1)::text AS found, current_database() AS database, current_schema() AS schema,
  current_setting('search_path') AS path`

interface Row {
  readonly found: string | null
  readonly database: string
  readonly schema: string | null
  readonly path: string
}

const defaults: { readonly [R in Table.Role]: string } = {
  idempotency: Table.defaultTable,
  attempts: Table.defaultAttemptsTable,
  outbox: Table.defaultOutboxTable
}

/** What to do about `table`, missing in `schema`: run the migrations there, or create a table of the store's own. */
const fix = (table: string, role: Table.Role, schema: string): string => {
  const parts = table.split(".")
  if (parts.at(-1) !== defaults[role]) {
    return `the migrations create only ${defaults[role]}: create ${table} with its columns and keys (jetworker migrate --sql ` +
      `prints them), or use the migrated table`
  }
  const searchPath = schema === "public" ? "" : ` (the schema in its options: ?options=-csearch_path%3D${schema})`
  return `run the jetworker migrations on this database and schema before starting: jetworker migrate with DATABASE_URL ` +
    `naming this database${searchPath}, or Migrations.run (or Migrations.layer beneath the store's layer) from @jetworker/sql-pg`
}

/** The `MissingTable` for `table` (the store's `role`), from what the check's query found. */
const missing = (table: string, role: Table.Role, row: Row): MissingTable => {
  const named = table.includes(".") ? table.split(".")[0] : undefined
  const schema = named ?? row.schema ?? undefined
  const database = JSON.stringify(row.database)
  const message = schema === undefined
    ? `the ${role} table ${table} cannot be found in database ${database}: no schema of its search_path (${row.path}) exists; ` +
      `create the schema (or correct the search_path), then ${fix(table, role, "public")}`
    : `the ${role} table ${table} does not exist in schema ${JSON.stringify(schema)} of database ${database}: ${fix(table, role, schema)}`
  return new MissingTable({ table, role, schema, searchPath: row.path, database: row.database, message })
}

/** Whether a failed check may pass with time: the database not up yet, or not answering. */
const mayPass = (error: SqlError): boolean => error.isRetryable || isConnectionLoss(error)

/**
 * Fails with {@link MissingTable} when `table` (the `role` store's, already validated) does not
 * exist for the current `SqlClient`'s sessions. A failed query is its `SqlError`, never a missing
 * table; one without an answer within {@link checkTimeout} is a `ConnectionError`. Under a worker
 * that is still starting, a failure that may pass (a connection refused or lost, no answer) is
 * retried while the start-up deadline allows (`Lifecycle.waitFor`, dependency `postgres`).
 */
export const requireTable = (table: string, role: Table.Role): Effect.Effect<void, MissingTable | SqlError, SqlClient.SqlClient> =>
  SqlClient.SqlClient.use((sql) => {
    const quoted = Table.quote(table) ?? table
    const check = sql.unsafe<Row>(checkText, [quoted]).pipe(
      Effect.timeoutOrElse({
        duration: checkTimeout,
        orElse: () =>
          Effect.fail(
            new SqlError({
              reason: new ConnectionError({
                cause: undefined,
                message: `no answer from PostgreSQL within ${Duration.format(checkTimeout)} to the check of the ${role} table ${table}`,
                operation: "check"
              })
            })
          )
      })
    )
    return Effect.flatMap(
      Lifecycle.waitFor("postgres", check, { while: mayPass }),
      (rows) => rows[0] === undefined || rows[0].found !== null ? Effect.void : Effect.fail(missing(table, role, rows[0]))
    )
  })

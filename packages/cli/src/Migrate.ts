/**
 * `jetworker migrate`: applies `@jetworker/sql-pg`'s migrations to the database at `DATABASE_URL`
 * (default `postgres://postgres@127.0.0.1:5432/test`) and prints the ones it applied; with
 * `--sql` it prints their SQL instead, for `psql`, without connecting. A failure prints a
 * one-line reason and a one-line next step on stderr; an interruption (SIGINT/SIGTERM) rolls back
 * the open migration transaction. Its waits are bounded: 5 seconds to connect (the driver's
 * default, or the URL's `connect_timeout`), 30 seconds for a lock another session holds (the URL's
 * `lock_timeout` option instead, when it sets one).
 *
 * Before migrating it prints which database it migrates: host, port, database and schema (and
 * that it is the default, when `DATABASE_URL` is not set). It deliberately does not print the URL
 * (it is read as a `Redacted`; a password would be in it), take flags for connection settings
 * (everything is in the URL, e.g. `?options=-csearch_path%3Dmy_schema`), or roll back migrations.
 *
 * @since 0.1.0
 */
import { PgClient } from "@effect/sql-pg"
import { Migrations } from "@jetworker/sql-pg"
import { Cause, Config, Console, Effect, Option, Redacted } from "effect"
import { type Migrator, SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"

/** The database the command migrates when `DATABASE_URL` is not set. */
export const defaultUrl = "postgres://postgres@127.0.0.1:5432/test"

/**
 * How long the run waits for a lock another session holds on a table it changes (another
 * migration run, a long transaction) before it fails, instead of waiting for ever (30 seconds).
 */
const lockTimeout = "30s"

const databaseUrl = Config.Redacted("DATABASE_URL").pipe(Config.withDefault(Redacted.make(defaultUrl)))

const Database = PgClient.layerConfig({
  url: databaseUrl,
  maxConnections: Config.succeed(1),
  applicationName: Config.succeed("jetworker-migrate"),
  // Unless the URL sets its own (`?options=-clock_timeout%3D...`): the startup parameter would win.
  startupParameters: databaseUrl.pipe(
    Config.map((url): Record<string, string> => Redacted.value(url).includes("lock_timeout") ? {} : { lock_timeout: lockTimeout })
  )
})

const causeMessage = (cause: unknown): string | undefined =>
  cause instanceof Error && cause.message !== "" ? cause.message : undefined

const describeSql = (error: SqlError): string => {
  const own = error.reason.message ?? error.reason._tag
  const reported = causeMessage(error.reason.cause)
  return reported === undefined || own.includes(reported) ? own : `${own}: ${reported}`
}

const isSqlError = (u: unknown): u is SqlError =>
  typeof u === "object" && u !== null && "_tag" in u && u._tag === "SqlError" && "reason" in u

/** One readable line for a failure; never includes the connection URL. */
const describe = (error: Migrator.MigrationError | SqlError | Config.ConfigError): string => {
  switch (error._tag) {
    case "SqlError":
      return `database error (${error.reason._tag}): ${describeSql(error)}`
    case "MigrationError":
      return isSqlError(error.cause)
        ? `${error.message}: ${describeSql(error.cause)}`
        : `${error.message}${causeMessage(error.cause) === undefined ? "" : `: ${causeMessage(error.cause)}`}`
    case "ConfigError":
      return `configuration error: ${error.message}`
  }
}

const sqlNextStep = (error: SqlError): string | undefined => {
  switch (error.reason._tag) {
    case "ConnectionError":
      return "check DATABASE_URL (host, port, database) and that the server runs"
    case "AuthenticationError":
      return "check the user and password in DATABASE_URL"
    case "AuthorizationError":
      return "run this command as a user that may create tables in the schema (its owner), or hand the output of --sql to one"
    case "LockTimeoutError":
      return `nothing was applied: another session held a lock on a table the migrations change for 30 seconds ` +
        `(another jetworker migrate, or a long transaction: see pg_stat_activity); run again when it is done ` +
        `(a longer wait: lock_timeout in DATABASE_URL's options)`
    default:
      return undefined
  }
}

/** What to do next, where the reason alone does not say. */
const nextStep = (error: Migrator.MigrationError | SqlError | Config.ConfigError): string => {
  switch (error._tag) {
    case "SqlError":
      return sqlNextStep(error) ?? "fix the database error above and run the command again"
    case "MigrationError":
      // The migrator applies every pending migration in one transaction: a failed run applied none.
      return (isSqlError(error.cause) ? sqlNextStep(error.cause) : undefined) ??
        `nothing was applied; fix the cause above and run again (a table named like one in --sql that already exists with other columns must be renamed first)`
    case "ConfigError":
      return "set DATABASE_URL to a postgres:// URL"
  }
}

/** The database a run migrates, as it is printed: no user, no password. */
export interface Target {
  readonly host: string
  readonly port: string
  readonly database: string
  /** The schema the tables are created in (the session's `current_schema()`). */
  readonly schema: string
  /** Whether `DATABASE_URL` was not set, so that the run took {@link defaultUrl}. */
  readonly fromDefault: boolean
}

/** The line naming the database a run migrates. */
export const describeTarget = (target: Target): string =>
  `jetworker migrations: database ${JSON.stringify(target.database)} on ${target.host}:${target.port}, ` +
  `schema ${JSON.stringify(target.schema)}${target.fromDefault ? ` (DATABASE_URL is not set: the default, ${defaultUrl})` : ""}`

/**
 * The database the client is connected to: the host and port as the URL names them (the server
 * does not know the name the client used), the database and schema as the server has them.
 */
const target = Effect.gen(function*() {
  const set = yield* Config.option(Config.Redacted("DATABASE_URL"))
  const url = URL.parse(Option.match(set, { onNone: () => defaultUrl, onSome: Redacted.value }))
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ readonly database: string; readonly schema: string | null }>`SELECT current_database() AS database,
    current_schema() AS schema`
  return {
    host: url?.hostname || "localhost",
    port: url?.port || "5432",
    database: row?.database ?? "?",
    // No schema of the search path exists: the migrations will say so.
    schema: row?.schema ?? "(none)",
    fromDefault: Option.isNone(set)
  } satisfies Target
})

/**
 * Applies the migrations to `DATABASE_URL` (default {@link defaultUrl}), printing first which
 * database ({@link describeTarget}), then the ones it applied ("up to date" when none); a failure
 * is printed as one readable line and a next step on stderr (the URL never).
 */
export const migrate = Effect.andThen(Effect.flatMap(target, (t) => Console.log(describeTarget(t))), Migrations.run).pipe(
  Effect.provide(Database),
  Effect.tap((applied) =>
    applied.length === 0
      ? Console.log("jetworker migrations: up to date")
      : Effect.forEach(applied, ([id, name]) => Console.log(`jetworker migrations: applied ${id}_${name}`), {
        discard: true
      })),
  Effect.tapCause((cause) =>
    Cause.hasInterruptsOnly(cause)
      ? Console.error("jetworker migrations: interrupted; the open migration was rolled back")
      : Cause.findErrorOption(cause).pipe(
        (error) =>
          error._tag === "Some"
            ? Console.error(`jetworker migrations failed: ${describe(error.value)}\nnext step: ${nextStep(error.value)}`)
            : Console.error(`jetworker migrations failed unexpectedly:\n${Cause.pretty(cause)}`)
      ))
)


/** The migrations' SQL, as one script for `psql -f`. */
export const script: string = Migrations.script

/**
 * What to do about a failure the worker stopped on, for the common ones whose own message does
 * not say: a database that cannot be reached, refused credentials, a missing privilege, a
 * migration that failed. Read from the error's tag, kind and reason, never its text (this package
 * does not depend on the SQL packages, so the shapes are matched structurally). Other failures
 * carry their own next step in their message (see the NATS and source errors).
 */
import { Cause, Option } from "effect"

interface Tagged {
  readonly _tag?: unknown
  readonly kind?: unknown
  readonly cause?: unknown
  readonly reason?: { readonly _tag?: unknown }
}

const asTagged = (u: unknown): Tagged | undefined => (typeof u === "object" && u !== null ? u as Tagged : undefined)

const forSqlError = (error: Tagged): string | undefined => {
  switch (error.reason?._tag) {
    case "ConnectionError":
      return "the database cannot be reached: check DATABASE_URL (host, port, database) and that the server runs"
    case "AuthenticationError":
      return "the database refused the credentials: check the user and password in DATABASE_URL"
    case "AuthorizationError":
      return "the database user lacks a privilege the worker needs (see the error): grant it, or run the migrations as the owner ahead of time (jetworker migrate, or psql with the output of jetworker migrate --sql)"
    default:
      return undefined
  }
}

// effect's Migrator runs every pending migration in one transaction, so a failed run applied none.
const forMigrationError = (error: Tagged): string => {
  const cause = asTagged(error.cause)
  const sql = cause?._tag === "SqlError" ? forSqlError(cause) : undefined
  if (sql !== undefined) return sql
  switch (error.kind) {
    case "Failed":
      return "a migration failed and none was applied (the run rolled back): fix the cause shown and start again; if a table of the same name already exists with other columns, rename it or point the store at another table"
    case "Duplicates":
      return "two migrations share an id: give each migration of the loader its own id"
    default:
      return "the migrations could not run (see the error); nothing was applied: fix it and start again"
  }
}

/** The next step for the failure in `cause`, or `undefined` when its own message says it. */
export const nextStep = (cause: Cause.Cause<unknown>): string | undefined => {
  // The worker reports an interruption only when it was not the shutdown procedure's own.
  if (Cause.hasInterruptsOnly(cause)) {
    return "the program stopped interrupted with no stop signal and no deadline passed: something in it interrupted what it waited on (a fiber it joined, a scope closed early); the cause shows where"
  }
  const found = Cause.findErrorOption(cause)
  if (Option.isNone(found)) return undefined
  const error = asTagged(found.value)
  if (error === undefined) return undefined
  if (error._tag === "SqlError") return forSqlError(error)
  if (error._tag === "MigrationError") return forMigrationError(error)
  return undefined
}

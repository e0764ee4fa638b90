/**
 * A throw-away PostgreSQL schema for tests: `layer()` creates a schema `jw_<random>` on the test
 * database, provides a `PgClient`/`SqlClient` whose every connection has its `search_path` set to
 * that schema (sent in the connection's startup packet, so it holds for pooled and transaction
 * connections alike), and drops the schema with everything in it (`CASCADE`) when the scope
 * closes, after the client's pool has closed. The schema's name is the `TestSchema` service.
 *
 * It deliberately does not create any table (tests run the migrations they need) nor isolate
 * anything beyond the schema: roles, databases and server settings are shared.
 *
 * @since 0.1.0
 */
import { PgClient } from "@effect/sql-pg"
import { Context, Effect, Layer, Redacted } from "effect"
import * as Reactivity from "effect/reactivity/Reactivity"
import type { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { randomBytes } from "node:crypto"

/** The database tests use: `process.env.DATABASE_URL`, else the local test database. */
export const defaultUrl = (): string => process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"

/** The throw-away schema of the current test database. */
export class TestSchema extends Context.Service<TestSchema, {
  /** The schema's name, `jw_<12 hex digits>`; a plain identifier, safe to interpolate. */
  readonly name: string
  /** The database's URL (without the schema). */
  readonly url: Redacted.Redacted
}>()("@jetworker/testing/TestDatabase/TestSchema") {}

/** Options of {@link layer}. */
export interface Options {
  /** The database's URL. Default: {@link defaultUrl}. */
  readonly url?: string | undefined
}

/** Options of {@link client}: the pool's settings, except the URL (the schema's). */
export type ClientOptions = Omit<PgClient.PgPoolConfig, "url">

/** Creates the schema (dropped, `CASCADE`, when the scope closes) and provides its name. */
export const schema = (options?: Options): Layer.Layer<TestSchema, SqlError> =>
  Layer.effect(
    TestSchema,
    Effect.gen(function*() {
      const url = Redacted.make(options?.url ?? defaultUrl())
      const name = `jw_${randomBytes(6).toString("hex")}`
      const admin = yield* PgClient.make({ url, maxConnections: 1, applicationName: "jetworker-test-admin" })
      yield* Effect.acquireRelease(
        admin.unsafe(`CREATE SCHEMA "${name}"`),
        () =>
          admin.unsafe(`DROP SCHEMA IF EXISTS "${name}" CASCADE`).pipe(
            Effect.timeout("10 seconds"),
            Effect.catchCause((cause) => Effect.logWarning(`TestDatabase: could not drop schema ${name}`, cause))
          )
      )
      return TestSchema.of({ name, url })
    })
  ).pipe(Layer.provide(Reactivity.layer))

/**
 * A client on the current test schema: its connections' `search_path` is the schema. Use it for a
 * second pool with other session settings (e.g. `startupParameters: { lock_timeout: "100ms" }`).
 */
export const client = (options?: ClientOptions): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError, TestSchema> =>
  Layer.unwrap(TestSchema.useSync((test) =>
    PgClient.layer({
      applicationName: "jetworker-test",
      ...options,
      url: test.url,
      startupParameters: { ...options?.startupParameters, search_path: test.name }
    })))

/** A fresh schema and a client on it, for one test file (or one test). */
export const layer = (
  options?: Options & ClientOptions
): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient | TestSchema, SqlError> => {
  const { url, ...clientOptions } = options ?? {}
  return client(clientOptions).pipe(Layer.provideMerge(schema({ url })))
}

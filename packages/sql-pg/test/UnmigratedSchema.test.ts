/**
 * The stores' layers check their tables as they are built, against the real PostgreSQL: on a
 * schema the migrations never ran on, building `PgIdempotencyStore.layer`, `PgAttemptStore.layer`
 * or `PgOutbox.layer` fails with `Migrations.MissingTable`, naming the table, the schema, the
 * database and the fix (and never the URL), instead of building a store whose every commit fails
 * with SQLSTATE 42P01. A database that cannot be reached stays a connection failure (waited for
 * while a worker starts), and a check that gets no answer is bounded (those tests run on the real
 * clock: the check's bound and the start-up retries are timers).
 */
import { assert, describe, it } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import * as Lifecycle from "@jetworker/core/Lifecycle"
import { type Duration, Effect, Exit, Fiber, Layer, Logger, Redacted, Result, type Scope } from "effect"
import type { SqlClient } from "effect/sql"
import * as Eventually from "../../testing/src/Eventually.ts"
import * as FaultProxy from "../../testing/src/FaultProxy.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as Migrations from "../src/Migrations.ts"
import * as PgAttemptStore from "../src/PgAttemptStore.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import * as PgOutbox from "../src/PgOutbox.ts"

/** What a `MissingTable` carries, read without assuming the class exists (the failing-first run). */
interface Missing {
  readonly _tag: string
  readonly table: string
  readonly role: string
  readonly schema: string | undefined
  readonly database: string
  readonly message: string
}

/** The error building `layer` fails with; a test failure naming `expected` when it builds. */
const buildFailure = <E, R>(build: Effect.Effect<unknown, E, R>, expected: string) =>
  Effect.scoped(Effect.flip(Effect.andThen(build, Effect.die(new Error(`the layer was built; expected it to fail: ${expected}`)))))

/** Each store's role, default table, and the build of its layer. */
const stores: ReadonlyArray<readonly [string, string, Effect.Effect<unknown, unknown, SqlClient.SqlClient | Scope.Scope>]> = [
  ["idempotency", "jetworker_dedup", Layer.build(PgIdempotencyStore.layer())],
  ["attempts", "jetworker_attempts", Layer.build(PgAttemptStore.layer())],
  ["outbox", "jetworker_outbox", Layer.build(PgOutbox.layer())]
]

/** The database the tests use, as PostgreSQL names it. */
const databaseName = new URL(TestDatabase.defaultUrl()).pathname.slice(1)

/** The test database's host and port. */
const target = new URL(TestDatabase.defaultUrl())
const targetAddress = { host: target.hostname, port: Number(target.port || 5432) }

/** A client on the test database through `port` on loopback (a proxy's), or directly, with `search_path` set. */
const clientVia = (port: number | undefined, searchPath: string, connectTimeout: Duration.Input = "1 second") => {
  const url = new URL(TestDatabase.defaultUrl())
  if (port !== undefined) {
    url.hostname = "127.0.0.1"
    url.port = String(port)
  }
  return PgClient.layer({ url: Redacted.make(url.toString()), startupParameters: { search_path: searchPath }, connectTimeout, maxConnections: 2 })
}

describe("the stores' layers on a schema without the migrations", () => {
  it.effect("each layer refuses to build with MissingTable naming its table, the schema, the database and the fix; after the migrations all three build", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      for (const [role, table, build] of stores) {
        const error = (yield* buildFailure(build, `${table} is missing`)) as unknown as Missing
        assert.strictEqual(error._tag, "MissingTable", String(error))
        assert.instanceOf(error, Migrations.MissingTable)
        assert.deepStrictEqual(
          { table: error.table, role: error.role, schema: error.schema, database: error.database },
          { table, role, schema: schema.name, database: databaseName }
        )
        assert.include(error.message, `${role} table ${table} does not exist in schema "${schema.name}" of database "${databaseName}"`)
        assert.include(error.message, "jetworker migrate")
        assert.include(error.message, `-csearch_path%3D${schema.name}`)
        assert.include(error.message, "Migrations.run")
        assert.notInclude(error.message, "postgres://")
        assert.isBelow(error.message.length, 500, "a log line's summary keeps 500 characters")
      }
      yield* Migrations.run
      for (const [, , build] of stores) yield* Effect.scoped(build)
    }).pipe(Effect.provide(TestDatabase.layer())))

  it.effect("a store configured with a table of its own is told to create it (the migrations create only the default one)", () =>
    Effect.gen(function*() {
      yield* Migrations.run
      const error = (yield* buildFailure(Layer.build(PgIdempotencyStore.layer({ table: "app_dedup" })), "app_dedup is missing")) as unknown as Missing
      assert.strictEqual(error._tag, "MissingTable", String(error))
      assert.strictEqual(error.table, "app_dedup")
      assert.include(error.message, "idempotency table app_dedup does not exist")
      assert.include(error.message, "jetworker migrate --sql")
    }).pipe(Effect.provide(TestDatabase.layer())))

  it.effect("a search_path none of whose schemas exists is named as such", () =>
    Effect.gen(function*() {
      const error = (yield* buildFailure(
        Layer.build(PgAttemptStore.layer().pipe(Layer.provide(clientVia(undefined, "jw_no_such_schema")))),
        "no schema"
      )) as unknown as Missing
      assert.strictEqual(error._tag, "MissingTable", String(error))
      assert.isUndefined(error.schema)
      assert.include(error.message, "no schema of its search_path (jw_no_such_schema) exists")
    }))
})

describe("the table check when the database is not there", () => {
  it.live("unreachable outside a worker: the layer fails with the connection's SqlError, not MissingTable", () =>
    Effect.gen(function*() {
      const proxy = yield* FaultProxy.make({ target: targetAddress })
      yield* proxy.cut
      const error = yield* buildFailure(
        Layer.build(PgIdempotencyStore.layer().pipe(Layer.provide(clientVia(proxy.port, "public")))),
        "a connection error"
      )
      assert.strictEqual(error._tag, "SqlError", String(error))
    }).pipe(Effect.scoped))

  it.live("unreachable while a worker starts: the check waits (startup.waiting) and the layer builds once the database answers", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      yield* Migrations.run
      const proxy = yield* FaultProxy.make({ target: targetAddress })
      yield* proxy.cut
      const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "30 seconds" })
      const waiting: Array<string> = []
      const logger = Logger.make(({ message }) => {
        const parts = Array.isArray(message) ? message : [message]
        if (parts[0] === "startup.waiting") waiting.push(String(parts[0]))
      })
      const build = yield* Effect.forkChild(Effect.scoped(Layer.build(
        PgIdempotencyStore.layer().pipe(Layer.provide(clientVia(proxy.port, schema.name)))
      )).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(Logger.layer([logger]))))
      yield* Eventually.holds("the check waits for the database", Effect.sync(() => waiting.length > 0), "20 seconds")
      assert.isUndefined(build.pollUnsafe(), "still building while the database is cut")
      yield* proxy.restore
      const exit = yield* Fiber.await(build).pipe(Effect.timeout("20 seconds"))
      assert.isTrue(Exit.isSuccess(exit), String(exit))
    }).pipe(Effect.scoped, Effect.provide(TestDatabase.layer())))

  it.live("the stores with Migrations.layer beneath them, on a schema without the migrations while a worker starts: the migrations wait for the database, then run, and the stores build", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const proxy = yield* FaultProxy.make({ target: targetAddress })
      yield* proxy.cut
      const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "30 seconds" })
      const waiting: Array<string> = []
      const logger = Logger.make(({ message }) => {
        const parts = Array.isArray(message) ? message : [message]
        if (parts[0] === "startup.waiting") waiting.push(String(parts[0]))
      })
      const stores = Layer.mergeAll(PgIdempotencyStore.layer(), PgAttemptStore.layer(), PgOutbox.layer()).pipe(
        Layer.provide(Migrations.layer),
        Layer.provide(clientVia(proxy.port, schema.name))
      )
      const build = yield* Effect.forkChild(Effect.scoped(Layer.build(stores)).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle),
        Effect.provide(Logger.layer([logger]))
      ))
      yield* Eventually.holds("the migrations wait for the database", Effect.sync(() => waiting.length > 0), "20 seconds")
      assert.isUndefined(build.pollUnsafe(), "still building while the database is cut")
      yield* proxy.restore
      const exit = yield* Fiber.await(build).pipe(Effect.timeout("20 seconds"))
      assert.isTrue(Exit.isSuccess(exit), String(exit))
    }).pipe(Effect.scoped, Effect.provide(TestDatabase.layer())))

  it.live("a database that takes the connection and never answers: the check gives up within its bound, as a connection failure", () =>
    Effect.gen(function*() {
      const proxy = yield* FaultProxy.make({ target: targetAddress })
      yield* proxy.pause
      const started = Date.now()
      const error = yield* buildFailure(
        Layer.build(PgOutbox.layer().pipe(Layer.provide(clientVia(proxy.port, "public", "1 hour")))),
        "no answer"
      ).pipe(Effect.timeout("30 seconds"))
      assert.strictEqual(error._tag, "SqlError", String(error))
      assert.include(error.message, "no answer")
      assert.isBelow(Date.now() - started, 25_000)
      yield* proxy.resume
    }).pipe(Effect.scoped), 40_000)
})

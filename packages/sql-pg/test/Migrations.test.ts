import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as Migrations from "../src/Migrations.ts"
import { awaitLockWaiters, backendPid, observerLayer } from "./support.ts"

// Every test gets its own empty schema: migrations are about the state before and after them.
const Fresh = Layer.provideMerge(observerLayer, TestDatabase.layer({ maxConnections: 6 }))

const applied: ReadonlyArray<readonly [number, string]> = [
  [1, "jetworker_dedup"],
  [2, "jetworker_attempts"],
  [3, "jetworker_outbox"],
  [4, "jetworker_outbox_unique_id"],
  [5, "jetworker_attempts_dead_letter"]
]

/** What exists in the test schema: its tables and indexes, and the recorded migrations. */
const inventory = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const tables = yield* sql<{ readonly name: string }>`SELECT table_name AS name FROM information_schema.tables
    WHERE table_schema = current_schema() ORDER BY table_name`
  const indexes = yield* sql<{ readonly name: string }>`SELECT indexname AS name FROM pg_indexes
    WHERE schemaname = current_schema() AND tablename = 'jetworker_dedup' ORDER BY indexname`
  const recorded = yield* sql<{ readonly id: number; readonly name: string }>`SELECT migration_id AS id, name
    FROM jetworker_migrations ORDER BY migration_id`
  return {
    tables: tables.map((row) => row.name),
    indexes: indexes.map((row) => row.name),
    recorded: recorded.map((row) => [row.id, row.name] as const)
  }
})

const expected = {
  tables: ["jetworker_attempts", "jetworker_dedup", "jetworker_migrations", "jetworker_outbox"],
  indexes: ["jetworker_dedup_committed_at_idx", "jetworker_dedup_pkey"],
  recorded: applied
}

describe("Migrations", () => {
  it.live("creates the dedup table with its primary key and purge index, and records the migration", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* Migrations.run, applied)
      assert.deepStrictEqual(yield* inventory, expected)
      const sql = yield* SqlClient.SqlClient
      const columns = yield* sql<{ readonly name: string; readonly type: string; readonly nullable: string }>`
        SELECT column_name AS name, data_type AS type, is_nullable AS nullable FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'jetworker_dedup' ORDER BY ordinal_position`
      assert.deepStrictEqual(columns.map((c) => [c.name, c.type, c.nullable]), [
        ["scope", "text", "NO"],
        ["id", "text", "NO"],
        ["committed_at", "timestamp with time zone", "NO"]
      ])
    }).pipe(Effect.provide(Fresh)))

  it.live("running them again applies nothing and changes nothing", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* Migrations.run, applied)
      assert.deepStrictEqual(yield* Migrations.run, [])
      assert.deepStrictEqual(yield* inventory, expected)
    }).pipe(Effect.provide(Fresh)))

  it.live("the layer applies them while it is built", () =>
    Effect.gen(function*() {
      yield* Layer.build(Migrations.layer)
      assert.deepStrictEqual(yield* inventory, expected)
    }).pipe(Effect.provide(Fresh)))

  it.live("two concurrent runs: both wait on the migrator's lock, one applies the migrations, the other none", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // The migrator's own table, created empty, then held locked so that both runs queue on it.
      // Bounded, like every wait here: under a loaded suite it once hung without one.
      assert.deepStrictEqual(
        yield* Migrator.make({})({ loader: Migrator.fromRecord({}), table: Migrations.table }).pipe(Effect.timeout("20 seconds")),
        []
      )
      const locked = yield* Deferred.make<number>()
      const release = yield* Deferred.make<void>()
      const holder = yield* Effect.forkChild(sql.withTransaction(Effect.gen(function*() {
        yield* sql`LOCK TABLE jetworker_migrations IN ACCESS EXCLUSIVE MODE`
        yield* Deferred.succeed(locked, yield* backendPid)
        yield* Deferred.await(release)
      })))
      const holderPid = yield* Effect.timeout(Deferred.await(locked), "5 seconds")
      const runs = yield* Effect.forkChild(
        Effect.all([Migrations.run, Migrations.run], { concurrency: "unbounded" })
      )
      const waiters = yield* awaitLockWaiters(holderPid, 2)
      assert.isTrue(waiters.every((waiter) => waiter.query.includes("LOCK TABLE")))

      yield* Deferred.succeed(release, undefined)
      yield* Effect.timeout(Fiber.join(holder), "5 seconds")
      const [a, b] = yield* Effect.timeout(Fiber.join(runs), "10 seconds")
      assert.deepStrictEqual([a, b].sort((x, y) => x.length - y.length), [[], applied])
      assert.deepStrictEqual(yield* inventory, expected)
    }).pipe(Effect.provide(Fresh)))

  it.live("three concurrent runs on an empty schema all succeed and apply the migrations once", () =>
    Effect.gen(function*() {
      const results = yield* Effect.timeout(
        Effect.all([Migrations.run, Migrations.run, Migrations.run], { concurrency: "unbounded" }),
        "10 seconds"
      )
      assert.deepStrictEqual(results.flat(), applied)
      assert.deepStrictEqual(yield* inventory, expected)
    }).pipe(Effect.provide(Fresh)))

  it.live("the SQL text applied ahead of time (as with psql) leaves the migrator nothing to fail on", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      for (const statement of Migrations.statements) yield* sql.unsafe(statement)
      // The migrator records the migration; its statements are no-ops on the existing objects.
      assert.deepStrictEqual(yield* Migrations.run, applied)
      assert.deepStrictEqual(yield* inventory, expected)
      assert.strictEqual(Migrations.script.split(";\n").length - 1, Migrations.statements.length)
    }).pipe(Effect.provide(Fresh)))
})

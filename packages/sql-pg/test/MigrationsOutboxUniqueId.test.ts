/**
 * Migration 4 (the unique index on the outbox's `id`) on a database that already ran migrations 1
 * to 3: it adds the index, or, when the outbox already holds an id more than once, fails naming
 * those ids and what to do, applying nothing and deleting nothing.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as Migrations from "../src/Migrations.ts"

// Every test gets its own empty schema: migrations are about the state before and after them.
const Fresh = TestDatabase.layer({ maxConnections: 2 })

/** The state of a database migrated before migration 4 existed. */
const migratedToOutbox = Effect.gen(function*() {
  const { "1_jetworker_dedup": dedup, "2_jetworker_attempts": attempts, "3_jetworker_outbox": outbox } = Migrations.migrations
  const applied = yield* Migrator.make({})({
    loader: Migrator.fromRecord({ "1_jetworker_dedup": dedup!, "2_jetworker_attempts": attempts!, "3_jetworker_outbox": outbox! }),
    table: Migrations.table
  })
  assert.deepStrictEqual(applied.map(([id]) => id), [1, 2, 3])
})

const insertRows = (ids: ReadonlyArray<string>) =>
  SqlClient.SqlClient.use((sql) =>
    Effect.forEach(ids, (id) => sql`INSERT INTO jetworker_outbox (id, subject, payload) VALUES (${id}, 'orders.placed', '\\x7b7d'::bytea)`, {
      discard: true
    })
  )

/**
 * The unique indexes on the outbox table, as `[name, definition]`. From `pg_index` by the table's
 * own OID, not the `pg_indexes` view: its filters may run `pg_get_indexdef` on other schemas'
 * indexes, which the tests running beside this one drop meanwhile ("could not open relation with OID").
 */
const uniqueIndexes = SqlClient.SqlClient.use((sql) =>
  Effect.map(
    sql<{ readonly name: string; readonly definition: string }>`SELECT c.relname AS name, pg_get_indexdef(i.indexrelid) AS definition
      FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
      WHERE i.indrelid = to_regclass('jetworker_outbox') AND i.indisunique ORDER BY c.relname`,
    (rows) => rows.map((row) => [row.name, row.definition.replace(/ ON \S+\.jetworker_outbox /, " ON jetworker_outbox ")] as const)
  )
)

const recorded = SqlClient.SqlClient.use((sql) =>
  Effect.map(sql<{ readonly id: number }>`SELECT migration_id AS id FROM jetworker_migrations ORDER BY migration_id`, (rows) =>
    rows.map((row) => row.id))
)

/** The error `effect` fails with; a test failure saying what was expected when it succeeds. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>, expected: string) =>
  Effect.flip(Effect.andThen(effect, Effect.die(new Error(`it succeeded; expected a failure: ${expected}`))))

/** The text PostgreSQL reported for `error` (the migrator's cause), as an operator reads it. */
const reported = (error: unknown): string => {
  const cause: unknown = (error as { readonly cause?: { readonly reason?: { readonly cause?: unknown } } }).cause?.reason?.cause
  return cause instanceof Error ? cause.message : String(cause)
}

describe("Migrations: outbox ids unique", () => {
  it.live("INT-NATS-007: migration 4 adds the unique index on the outbox's id to a database migrated before it; the rows stay", () =>
    Effect.gen(function*() {
      yield* migratedToOutbox
      yield* insertRows(["a", "b"])
      assert.deepStrictEqual(yield* Migrations.run, [[4, "jetworker_outbox_unique_id"], [5, "jetworker_attempts_dead_letter"]])
      assert.deepStrictEqual(yield* uniqueIndexes, [
        ["jetworker_outbox_id_key", "CREATE UNIQUE INDEX jetworker_outbox_id_key ON jetworker_outbox USING btree (id)"],
        ["jetworker_outbox_pkey", "CREATE UNIQUE INDEX jetworker_outbox_pkey ON jetworker_outbox USING btree (seq)"]
      ])
      assert.deepStrictEqual(yield* recorded, [1, 2, 3, 4, 5])
      const sql = yield* SqlClient.SqlClient
      const [rows] = yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox`
      assert.strictEqual(rows?.n, 2)
    }).pipe(Effect.provide(Fresh)))

  it.live("INT-NATS-007: an outbox already holding an id more than once fails migration 4, naming the ids and what to do; nothing is applied or deleted, and once the rows are fixed it applies", () =>
    Effect.gen(function*() {
      yield* migratedToOutbox
      // Seven ids recorded twice (the message names five), one once.
      const repeated = ["r1", "r2", "r3", "r4", "r5", "r6", "r7"]
      yield* insertRows([...repeated, "once", ...repeated])
      const error = yield* failureOf(Migrations.run, "migration 4 refused on repeated ids")
      assert.strictEqual(error._tag, "MigrationError", String(error))
      assert.strictEqual(error.message, `Migration "4_jetworker_outbox_unique_id" failed`)
      const text = reported(error)
      assert.include(text, `the outbox table jetworker_outbox holds 7 id(s) recorded more than once ('r1', 'r2', 'r3', 'r4', 'r5', ...)`)
      assert.include(text, "outbox ids must be unique per event")
      assert.include(text, "then run the migrations again")
      assert.include(text, "SELECT seq, id, sent_at FROM jetworker_outbox WHERE id IN")
      assert.deepStrictEqual(yield* recorded, [1, 2, 3], "migration 4 is not recorded")
      assert.deepStrictEqual((yield* uniqueIndexes).map(([name]) => name), ["jetworker_outbox_pkey"])
      const sql = yield* SqlClient.SqlClient
      const [rows] = yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox`
      assert.strictEqual(rows?.n, 15, "nothing deleted")

      // The SQL text applied ahead of time (as with psql) stops at the same check.
      const ahead = yield* failureOf(
        Effect.forEach(Migrations.statements, (statement) => sql.unsafe(statement), { discard: true }),
        "the statements refused on repeated ids"
      )
      assert.include(String((ahead.reason.cause as Error).message), "holds 7 id(s) recorded more than once")

      // The operator deletes the later copies; the migration then applies.
      yield* sql`DELETE FROM jetworker_outbox AS o WHERE EXISTS (SELECT FROM jetworker_outbox AS e WHERE e.id = o.id AND e.seq < o.seq)`
      assert.deepStrictEqual(yield* Migrations.run, [[4, "jetworker_outbox_unique_id"], [5, "jetworker_attempts_dead_letter"]])
      assert.deepStrictEqual((yield* uniqueIndexes).map(([name]) => name), ["jetworker_outbox_id_key", "jetworker_outbox_pkey"])
    }).pipe(Effect.provide(Fresh)))
})

/**
 * `PgAttemptStore`'s dead-letter decisions: recorded, read with the failures in one statement,
 * kept beside the count, cleared with it; and migration 5, which adds their column to an attempts
 * table created before it (rows kept).
 */
import { assert, describe, it, layer } from "@effect/vitest"
import type { AttemptStore } from "@jetworker/core"
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as Migrations from "../src/Migrations.ts"
import * as PgAttemptStore from "../src/PgAttemptStore.ts"
import { database } from "./support.ts"

const key = () => ({ scope: "ledger-applier", id: `event-${crypto.randomUUID()}` })

const refused: AttemptStore.DeadLetterDecision = {
  reason: "PermanentError",
  error: {
    kind: "Failure",
    tag: "InsufficientFunds",
    message: "30.00 from an account holding 10.00",
    fields: { account: "acc-1", shortBy: 2000, retryable: false }
  }
}

describe("PgAttemptStore dead-letter decisions", () => {
  layer(database(), { excludeTestServices: true })((it) => {
    it.effect("a decision round-trips with the failures in one read; a later one replaces it; clear forgets both", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const [a, b] = [key(), key()]
        assert.deepStrictEqual(yield* store.read(a), { failures: 0 }, "nothing recorded")
        // A decision alone: no failures counted.
        yield* store.recordDeadLetter(a, refused)
        assert.deepStrictEqual(yield* store.read(a), { failures: 0, deadLetter: refused })
        // Beside failures: the count is kept, and a second decision replaces the first.
        yield* store.recordFailure(b)
        yield* store.recordFailure(b)
        const exhausted: AttemptStore.DeadLetterDecision = {
          reason: "AttemptsExhausted",
          error: {
            kind: "Failure",
            tag: "PgTimeout",
            message: "lock timeout",
            fields: { effectCommitted: true },
            causes: [{ tag: "SqlError", message: "canceling statement", fields: { code: "55P03" } }]
          },
          effectCommitted: true
        }
        yield* store.recordDeadLetter(b, refused)
        yield* store.recordDeadLetter(b, exhausted)
        assert.deepStrictEqual(yield* store.read(b), { failures: 2, deadLetter: exhausted })
        assert.strictEqual(yield* store.recordFailure(b), 3, "a failure after a decision keeps counting")
        assert.deepStrictEqual(yield* store.read(b), { failures: 3, deadLetter: exhausted })
        yield* store.clear(a)
        yield* store.clear(b)
        assert.deepStrictEqual([yield* store.read(a), yield* store.read(b)], [{ failures: 0 }, { failures: 0 }])
      }))

    it.effect("a stored decision that is not one fails the read (it is never taken for no decision)", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const k = key()
        const sql = yield* SqlClient.SqlClient
        yield* sql`INSERT INTO jetworker_attempts (scope, id, failures, dead_letter) VALUES (${k.scope}, ${k.id}, 0, '{"reason":"Nope"}'::jsonb)`
        const error = yield* Effect.flip(store.read(k))
        assert.strictEqual(error._tag, "AttemptStoreError")
        assert.match(error.message, /not one/)
      }))
  })
})

describe("Migrations: the dead-letter column", () => {
  it.live("migration 5 adds dead_letter to an attempts table created before it, keeping its rows", () =>
    Effect.gen(function*() {
      const { "1_jetworker_dedup": dedup, "2_jetworker_attempts": attempts, "3_jetworker_outbox": outbox, "4_jetworker_outbox_unique_id": unique } =
        Migrations.migrations
      yield* Migrator.make({})({
        loader: Migrator.fromRecord({
          "1_jetworker_dedup": dedup!,
          "2_jetworker_attempts": attempts!,
          "3_jetworker_outbox": outbox!,
          "4_jetworker_outbox_unique_id": unique!
        }),
        table: Migrations.table
      })
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO jetworker_attempts (scope, id, failures) VALUES ('ledger-applier', 'old', 2)`
      const store = yield* PgAttemptStore.make()
      // Before migration 5 the store cannot read its rows (the column is missing): an error, not "none".
      assert.strictEqual((yield* Effect.flip(store.read({ scope: "ledger-applier", id: "old" })))._tag, "AttemptStoreError")
      assert.deepStrictEqual(yield* Migrations.run, [[5, "jetworker_attempts_dead_letter"]])
      assert.deepStrictEqual(yield* store.read({ scope: "ledger-applier", id: "old" }), { failures: 2 })
      yield* store.recordDeadLetter({ scope: "ledger-applier", id: "old" }, refused)
      assert.deepStrictEqual(yield* store.read({ scope: "ledger-applier", id: "old" }), { failures: 2, deadLetter: refused })
      const columns = yield* sql<{ readonly name: string; readonly type: string }>`SELECT column_name AS name, data_type AS type
        FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'jetworker_attempts'
        ORDER BY ordinal_position`
      assert.deepStrictEqual(columns.map((c) => [c.name, c.type]), [
        ["scope", "text"],
        ["id", "text"],
        ["failures", "integer"],
        ["updated_at", "timestamp with time zone"],
        ["dead_letter", "jsonb"]
      ])
      assert.deepStrictEqual(yield* Migrations.run, [], "applied once")
    }).pipe(Effect.provide(TestDatabase.layer({ maxConnections: 2 }))))
})

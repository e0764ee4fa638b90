import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import * as PgAttemptStore from "../src/PgAttemptStore.ts"
import { database } from "./support.ts"

const key = () => ({ scope: "ledger-applier", id: `event-${crypto.randomUUID()}` })

describe("PgAttemptStore", () => {
  layer(database(), { excludeTestServices: true })((it) => {
    it.effect("counts failures per key atomically, even when they are recorded at once", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const k = key()
        assert.strictEqual((yield* store.read(k)).failures, 0)
        assert.strictEqual(yield* store.recordFailure(k), 1)
        const counts = yield* Effect.forEach(Array.from({ length: 8 }), () => store.recordFailure(k), { concurrency: "unbounded" })
        assert.deepStrictEqual([...counts].sort((a, b) => a - b), [2, 3, 4, 5, 6, 7, 8, 9])
        assert.strictEqual((yield* store.read(k)).failures, 9)
        assert.strictEqual((yield* store.read(key())).failures, 0, "another key has none")
      }))

    it.effect("clear forgets a key; purge deletes rows not updated for a while, at most limit of them", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const [a, b, c] = [key(), key(), key()]
        for (const k of [a, b, c]) yield* store.recordFailure(k)
        yield* store.clear(a)
        assert.strictEqual((yield* store.read(a)).failures, 0)
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE jetworker_attempts SET updated_at = now() - interval '2 days' WHERE id IN (${b.id}, ${c.id})`
        assert.strictEqual(yield* PgAttemptStore.purge({ olderThan: "1 day", limit: 1 }), 1)
        assert.strictEqual(yield* PgAttemptStore.purge({ olderThan: "1 day", limit: 10 }), 1)
        assert.strictEqual(yield* PgAttemptStore.purge({ olderThan: "1 day", limit: 10 }), 0)
        assert.deepStrictEqual([(yield* store.read(b)).failures, (yield* store.read(c)).failures], [0, 0])
      }))

    it.effect("an invalid table name is refused at construction, naming the rule", () =>
      Effect.gen(function*() {
        const error = yield* PgAttemptStore.make({ table: "Bad Name" }).pipe(Effect.flip)
        assert.match(error.message, /lowercase SQL identifier/)
      }))
  })
})

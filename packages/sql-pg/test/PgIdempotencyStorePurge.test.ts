import { assert, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { database } from "./support.ts"

/** The ids of the dedup rows of `scope`, sorted. */
const idsOf = (scope: string) =>
  SqlClient.SqlClient.use((sql) =>
    Effect.map(sql<{ readonly id: string }>`SELECT id FROM jetworker_dedup WHERE scope = ${scope} ORDER BY id`, (rows) => rows.map((row) => row.id))
  )

layer(database(), { excludeTestServices: true })("PgIdempotencyStore.purge", (it) => {
  it.effect("a limit beyond PostgreSQL's integer (2147483647) is Misconfigured, naming limit and the value, before any statement", () =>
    Effect.gen(function*() {
      for (const limit of [2_147_483_648, Number.MAX_SAFE_INTEGER]) {
        const error = yield* Effect.flip(PgIdempotencyStore.purge({ olderThan: "1 hour", limit }))
        assert.strictEqual(error.reason, "Misconfigured", error.message)
        assert.include(error.message, "limit")
        assert.include(error.message, String(limit))
        assert.include(error.message, "2147483647")
        assert.notInclude(error.message, "commit")
      }
      // The largest limit is accepted.
      assert.isAtLeast(yield* PgIdempotencyStore.purge({ olderThan: "1000 weeks", limit: 2_147_483_647 }), 0)
    }))

  it.effect("a NaN olderThan is Misconfigured, naming the value, and deletes nothing (it is not an age of zero)", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const scope = `purge-nan-${randomUUID()}`
      yield* sql`INSERT INTO jetworker_dedup (scope, id, committed_at) VALUES (${scope}, 'recent', now() - interval '1 second')`
      for (const olderThan of [Number.NaN, [Number.NaN, 0] as const, { minutes: Number.NaN }]) {
        const error = yield* Effect.flip(PgIdempotencyStore.purge({ olderThan, limit: 10 }))
        assert.strictEqual(error.reason, "Misconfigured", error.message)
        assert.include(error.message, "olderThan")
        assert.include(error.message, "NaN")
      }
      assert.deepStrictEqual(yield* idsOf(scope), ["recent"])
      const negative = yield* Effect.flip(PgIdempotencyStore.purge({ olderThan: "-1 hour", limit: 10 }))
      assert.strictEqual(negative.reason, "Misconfigured")
      assert.include(negative.message, "got \"-1 hour\"")
    }))

  it.effect("a purge the database refuses is worded as a purge, not as a commit of an event", () =>
    Effect.gen(function*() {
      // Far enough back that `now() - olderThan` leaves PostgreSQL's timestamp range.
      const error = yield* Effect.flip(PgIdempotencyStore.purge({ olderThan: "1000000 weeks", limit: 10 }))
      assert.strictEqual(error.reason, "InvalidData", error.message)
      assert.include(error.message, "purge")
      assert.notInclude(error.message, "this commit")
      assert.notInclude(error.message, "event")
      assert.include(error.message, "timestamp out of range")
    }))
})

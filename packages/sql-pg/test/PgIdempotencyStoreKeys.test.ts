/**
 * Keys that are not well-formed UTF-16 (a lone surrogate, as `"evt-\uD800"`): UTF-8 cannot encode
 * them, so the driver sends U+FFFD instead, and distinct ids would become one key. The store must
 * refuse them, before sending anything, in every operation taking keys.
 */
import { assert, layer } from "@effect/vitest"
import { IdempotencyError, IdempotencyStore, type Key } from "@jetworker/core/IdempotencyStore"
import { Effect, Layer, Ref } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { database, dedupRows, ledgerRows, record } from "./support.ts"

/** Asserts `error` is the refusal of a key that is not well-formed, naming the offending part. */
const assertMalformed = (error: unknown, part: "scope" | "id") => {
  assert.instanceOf(error, IdempotencyError)
  const failure = error as IdempotencyError
  assert.strictEqual(failure.reason, "InvalidData", failure.message)
  assert.isFalse(failure.isRetryable)
  assert.include(failure.message, `key's ${part}`)
  assert.include(failure.message, "lone surrogate")
}

layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database()),
  { excludeTestServices: true }
)("PgIdempotencyStore keys that are not well-formed", (it) => {
  it.effect("BE-JOB-002: commit refuses a key with a lone surrogate as InvalidData, so distinct ids never collide", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const base = `evt-${randomUUID()}-`
      const high: Key = { scope: "ledger-applier", id: `${base}\uD800` }
      const low: Key = { scope: "ledger-applier", id: `${base}\uDC00` }
      const ran = yield* Ref.make(0)
      for (const key of [high, low]) {
        assertMalformed(yield* Effect.flip(store.commit(key, Ref.update(ran, (n) => n + 1))), "id")
      }
      assert.strictEqual(yield* Ref.get(ran), 0)
      // Nothing was sent: no row under the text PostgreSQL would have stored.
      assert.strictEqual(yield* dedupRows({ scope: "ledger-applier", id: `${base}\uFFFD` }), 0)
      assertMalformed(yield* Effect.flip(store.commit({ scope: "ledger\uDFFF", id: randomUUID() }, Effect.void)), "scope")
    }))

  it.effect("BE-JOB-002: commitBatch and commitAll refuse a batch holding such a key instead of dropping its event as already committed", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const good: Key = { scope: "ledger-applier", id: randomUUID() }
      const bad: Key = { scope: "ledger-applier", id: `${randomUUID()}\uD83D` }
      const batchError = yield* Effect.flip(store.commitBatch([
        { key: good, effect: Effect.orDie(record(good.id)) },
        { key: bad, effect: Effect.orDie(record(bad.id)) }
      ]))
      assertMalformed(batchError, "id")
      assert.include(batchError.message, "commitBatch")
      const ran = yield* Ref.make(false)
      const allError = yield* Effect.flip(store.commitAll([good, bad], () => Ref.set(ran, true)))
      assertMalformed(allError, "id")
      assert.isFalse(yield* Ref.get(ran))
      assert.strictEqual(yield* dedupRows(good), 0)
      assert.strictEqual(yield* ledgerRows(good.id), 0)
    }))

  it.effect("BE-JOB-002: commitStatement and isCommitted refuse such a key too", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const sql = yield* SqlClient.SqlClient
      const bad: Key = { scope: "ledger-applier", id: `${randomUUID()}\uDC00x` }
      assertMalformed(
        yield* Effect.flip(PgIdempotencyStore.commitStatement(bad, (fresh) => sql`INSERT INTO ledger (note) SELECT ${bad.id} WHERE ${fresh}`)),
        "id"
      )
      assert.strictEqual(yield* ledgerRows(bad.id), 0)
      assertMalformed(yield* Effect.flip(store.isCommitted(bad)), "id")
    }))

  it.effect("keys with characters outside the BMP (surrogate pairs) are well-formed and commit as before", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key: Key = { scope: "ledger-applier", id: `${randomUUID()}-\u{1F600}` }
      assert.strictEqual(yield* store.commit(key, Effect.as(record(key.id), "applied")), "applied")
      assert.isTrue(yield* store.isCommitted(key))
      assert.strictEqual(yield* dedupRows(key), 1)
    }))
})

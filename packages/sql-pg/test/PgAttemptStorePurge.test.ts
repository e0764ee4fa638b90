import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as PgAttemptStore from "../src/PgAttemptStore.ts"
import { database } from "./support.ts"

describe("PgAttemptStore.purge options", () => {
  layer(database(), { excludeTestServices: true })((it) => {
    it.effect("a NaN olderThan is refused, naming the value, and deletes no live count (effect would read it as zero)", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const key = { scope: "orders", id: `evt-${crypto.randomUUID()}` }
        yield* store.recordFailure(key)
        for (const olderThan of [Number.NaN, { seconds: Number.NaN }] as const) {
          const error = yield* Effect.flip(PgAttemptStore.purge({ olderThan, limit: 1000 }))
          assert.include(error.message, "olderThan must be a finite duration of at least 0")
          assert.include(error.message, "NaN")
          assert.strictEqual((yield* store.read(key)).failures, 1, "purge with a NaN age deleted a count recorded a moment ago")
        }
      }))

    it.effect("a limit past PostgreSQL's integer is refused before any statement, naming the range", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(PgAttemptStore.purge({ olderThan: "1 day", limit: 2_147_483_648 }))
        assert.include(error.message, "limit must be an integer from 1 to 2147483647, got 2147483648")
      }))
  })
})

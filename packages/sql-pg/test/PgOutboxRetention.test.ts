import { assert, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { Duration, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as PgOutbox from "../src/PgOutbox.ts"
import { database } from "./support.ts"

/** A publisher that never gets a row here: every row of these tests is already sent. */
const NoPublisher = Layer.succeed(Outbox.OutboxPublisher, {
  publish: () => Effect.fail(new Outbox.PublishFailed({ message: "no publish expected in this test", retryable: false }))
})

/** A row marked sent one second ago, long inside any sane retention; returns its id. */
const sentJustNow = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const id = `recent-${randomUUID()}`
  yield* sql`INSERT INTO jetworker_outbox (id, subject, payload, sent_at) VALUES (${id}, 'retention.test', ${new Uint8Array([123, 125])}, now() - interval '1 second')`
  return id
})

const stillThere = (id: string) =>
  SqlClient.SqlClient.use((sql) =>
    Effect.map(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox WHERE id = ${id}`, (rows) => rows[0]?.n === 1)
  )

const badRetentions: ReadonlyArray<readonly [Duration.Input, string]> = [
  [-60_000, "got -60000"],
  ["-1 hour", "got \"-1 hour\""],
  [Number.NaN, "got NaN"],
  [[Number.NaN, 0], "got [NaN, 0]"],
  [{ hours: Number.NaN }, "got { hours: NaN }"],
  ["-Infinity", "got \"-Infinity\""]
]

layer(Layer.merge(database(), NoPublisher), { excludeTestServices: true })("PgOutbox retention", (it) => {
  it.effect("cleanup refuses a negative or NaN retention, naming retention and the value, and deletes nothing", () =>
    Effect.gen(function*() {
      const id = yield* sentJustNow
      for (const [retention, got] of badRetentions) {
        const error = yield* Effect.flip(PgOutbox.cleanup({ retention }))
        assert.strictEqual(error._tag, "OutboxError")
        assert.include(error.message, "retention", error.message)
        assert.include(error.message, got, error.message)
        assert.isTrue(yield* stillThere(id), `a row sent 1 s ago survives retention ${String(retention)}`)
      }
      // Kept for ever, and the default of an hour, still delete nothing this recent.
      assert.strictEqual(yield* PgOutbox.cleanup({ retention: Duration.infinity }), 0)
      assert.strictEqual(yield* PgOutbox.cleanup({ retention: "Infinity" }), 0)
      assert.strictEqual(yield* PgOutbox.cleanup(), 0)
      assert.isTrue(yield* stillThere(id))
    }))

  it.effect("relay and layerRelay refuse a negative or NaN retention before their first round", () =>
    Effect.gen(function*() {
      const id = yield* sentJustNow
      for (const [retention, got] of badRetentions) {
        // Bounded: an accepted relay runs until interrupted.
        const error = yield* Effect.flip(PgOutbox.relay({ retention }).pipe(Effect.timeout("5 seconds")))
        assert.strictEqual(error._tag, "OutboxError", `relay with retention ${String(retention)}: ${String(error)}`)
        assert.include(error.message, `retention must be`)
        assert.include(error.message, got)
        const refused = yield* Effect.flip(Effect.scoped(Layer.build(PgOutbox.layerRelay({ retention }))))
        assert.strictEqual(refused._tag, "OutboxError")
        assert.include(refused.message, got)
        assert.isTrue(yield* stillThere(id), `a row sent 1 s ago survives retention ${String(retention)}`)
      }
    }))
})

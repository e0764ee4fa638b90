/**
 * INT-NATS-007 with BE-SHUT-003: a relay interrupted in the middle of a round (a worker shutting
 * down: `layerRelay`'s scope closes). Before, the interruption rolled the whole round back, so rows
 * whose publication the stream had already CONFIRMED stayed pending and the next relay published
 * them again; outside the stream's duplicate window (2 minutes by default: a single-worker
 * deployment down for longer) each was stored twice (a reviewer's reproduction, the first test
 * here). Now the interruption stops the publishing only: the confirmed rows are marked sent and
 * committed, and a database that does not answer then holds the shutdown for a bounded time.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgOutbox } from "@jetworker/sql-pg"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Clock, Deferred, Effect, Fiber, Layer, Logger, References } from "effect"
import { SqlClient } from "effect/sql"
import { NatsLive } from "./support/services.ts"

const Live = Layer.mergeAll(PgOutbox.layer(), Publisher.outboxPublisher()).pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer()),
  Layer.provideMerge(NatsLive)
)

const encoder = new TextEncoder()

/** A stream of this test capturing `<prefix>.>`, deleted with the scope; three rows r1..r3 recorded for it. */
const threeRows = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`DELETE FROM jetworker_outbox`
  const { manager } = yield* NatsConnection.NatsConnection
  const suffix = crypto.randomUUID().slice(0, 8)
  const name = `OUTBOX_INT_${suffix.toUpperCase()}`
  const prefix = `outbox-int-${suffix}`
  yield* Topology.ensureStream({ name, subjects: [`${prefix}.>`], duplicateWindow: "2 minutes" })
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  const ids = ["r1", "r2", "r3"].map((id) => `${suffix}-${id}`)
  yield* sql.withTransaction(Effect.forEach(ids, (id) => Outbox.record({ subject: `${prefix}.${id}`, id, payload: encoder.encode(id) }), { discard: true }))
  const storedCount = Effect.map(Effect.promise(() => manager.streams.info(name)), (info) => info.state.messages)
  return { ids, storedCount }
})

/** The real publisher, but r3's publish (`ids[2]`) never ends: it says when it has started. */
const hangingOnThird = (ids: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const real = yield* Outbox.OutboxPublisher
    const third = yield* Deferred.make<void>()
    const publisher = Outbox.OutboxPublisher.of({
      publish: (m, tp) => m.id === ids[2] ? Effect.andThen(Deferred.succeed(third, undefined), Effect.never) : real.publish(m, tp)
    })
    return { publisher, third }
  })

const pendingIds = SqlClient.SqlClient.use((sql) =>
  Effect.map(sql<{ readonly id: string }>`SELECT id FROM jetworker_outbox WHERE sent_at IS NULL ORDER BY seq`, (rows) => rows.map((r) => r.id))
)

describe("outbox: a relay interrupted in a round (shutdown)", () => {
  layer(Live, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("INT-NATS-007/BE-SHUT-003: rows the stream confirmed before the relay was interrupted are marked sent, not rolled back to be published again after the duplicate window; the next relay publishes only the rest", () =>
      Effect.gen(function*() {
        const { ids, storedCount } = yield* threeRows
        const { publisher, third } = yield* hangingOnThird(ids)
        // r1 and r2 are confirmed by the stream; r3's publish is still under way when shutdown comes.
        const relay = yield* Effect.forkChild(Effect.provideService(PgOutbox.relay({ pollInterval: "50 millis" }), Outbox.OutboxPublisher, publisher))
        yield* Deferred.await(third).pipe(Effect.timeout("20 seconds"))
        yield* Fiber.interrupt(relay).pipe(Effect.timeout("10 seconds"))

        assert.strictEqual(yield* storedCount, 2, "r1 and r2 are stored (confirmed)")
        assert.deepStrictEqual(yield* pendingIds, [ids[2]], "only r3 (unconfirmed) is still pending; the confirmed r1 and r2 are marked sent")
        // The next relay (after the window, say) publishes r3 alone: each event is stored once.
        assert.deepStrictEqual(yield* PgOutbox.relayRound(), { locked: true, published: 1, full: false })
        assert.strictEqual(yield* storedCount, 3)
      }).pipe(Effect.scoped))

    it.effect("BE-SHUT-003: a database that does not answer when the interrupted round marks its rows holds the interruption about 5 seconds, not for ever; it says so (WARN outbox.relay_interrupted) and the rows stay pending for the next relay", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { ids, storedCount } = yield* threeRows
        const { publisher, third } = yield* hangingOnThird(ids)
        // Another transaction holds r1's row: the round's UPDATE marking r1 and r2 sent waits on it.
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const locker = yield* Effect.forkChild(sql.withTransaction(Effect.gen(function*() {
          yield* sql`SELECT id FROM jetworker_outbox WHERE id = ${ids[0]} FOR UPDATE`
          yield* Deferred.succeed(locked, undefined)
          yield* Deferred.await(release)
        })))
        yield* Deferred.await(locked).pipe(Effect.timeout("10 seconds"))
        const lines: Array<{ readonly level: string; readonly text: string; readonly event: unknown }> = []
        const logger = Logger.layer([Logger.make(({ fiber, logLevel, message }) => {
          const parts = Array.isArray(message) ? message : [message]
          lines.push({ level: String(logLevel), text: String(parts[0]), event: fiber.getRef(References.CurrentLogAnnotations)["event"] })
        })])

        const relay = yield* Effect.forkChild(PgOutbox.relay({ pollInterval: "50 millis" }).pipe(
          Effect.provideService(Outbox.OutboxPublisher, publisher),
          Effect.provide(logger)
        ))
        yield* Deferred.await(third).pipe(Effect.timeout("20 seconds"))
        const started = yield* Clock.currentTimeMillis
        yield* Fiber.interrupt(relay).pipe(Effect.timeout("15 seconds"))
        const took = (yield* Clock.currentTimeMillis) - started
        assert.isAtMost(took, 9_000, `the interruption took ${took} ms`)
        const warnings = lines.filter((line) => line.event === "outbox.relay_interrupted")
        assert.lengthOf(warnings, 1, JSON.stringify(lines))
        assert.strictEqual(warnings[0]?.level, "Warn")
        assert.include(warnings[0]?.text, "did not commit within 5000 ms")

        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(locker).pipe(Effect.timeout("10 seconds"))
        assert.strictEqual(yield* storedCount, 2, "r1 and r2 were stored")
        // The abandoned round ends (rolled back) on its own: the next round then gets the lock, and
        // republishes r1 and r2, which the stream's window still remembers: each is stored once.
        const round = yield* Eventually.poll("the next round gets the lock", PgOutbox.relayRound(), (r) => r.locked, { timeout: "15 seconds" })
        assert.deepStrictEqual(round, { locked: true, published: 3, full: false })
        assert.strictEqual(yield* storedCount, 3)
        assert.deepStrictEqual(yield* pendingIds, [])
      }).pipe(Effect.scoped))
  })
})

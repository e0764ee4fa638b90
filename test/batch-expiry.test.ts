/**
 * Work expiry inside a batch handler (BE-JOB-005 with BE-JOB-007), against the real NATS and
 * PostgreSQL: a batch handler that waited on a dependency past one element's deadline calls
 * `Expiry.ensure` before its effect, as a single-delivery handler does. The expired element has no
 * business effect and ends `Expired`; the fresh one commits. (Before, `Expiry.ensure` found no
 * current delivery in a batch handler and let the whole batch commit.)
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Expiry, IdempotencyStore, Lease, type Outcome, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, DateTime, Deferred, Duration, Effect, Fiber, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.optional(Schema.DateTimeUtcFromString) })
type Event = typeof Event.Type
const metadata = (event: Event) => ({ id: event.id, time: DateTime.makeUnsafe(0), expiresAt: event.expiresAt })

const effectRows = (prefix: string) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly id: string }>`SELECT id FROM batch_expiry_effects WHERE id LIKE ${`${prefix}%`} ORDER BY id`.pipe(
      Effect.map((rows) => rows.map((row) => row.id))
    ))

describe("expiry in a batch handler (BE-JOB-005)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-005: expiry while waiting for a dependency in a batch handler: Expiry.ensure stops the expired element before its effect (Expired, no effect); the fresh element commits", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS batch_expiry_effects (id text PRIMARY KEY)`
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const p = `bx${Date.now()}`
        const expiresAt = DateTime.makeUnsafe(Date.now() + 1_500)
        // The dependency the handler waits on (a lock, a rate limiter): let go once the deadline passed.
        const release = yield* Deferred.make<void>()
        const entered = yield* Deferred.make<number>()
        const consumer = Consumer.makeBatch({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata,
          batch: { maxSize: 2, maxWait: Duration.millis(500) },
          handleBatch: (events) =>
            Effect.gen(function*() {
              yield* Deferred.succeed(entered, events.length)
              yield* Deferred.await(release)
              yield* Expiry.ensure
              yield* Lease.ensure
              return yield* IdempotencyStore.commitAll(
                events.map((event) => event.id),
                (fresh) => Effect.forEach(fresh, (i) => sql`INSERT INTO batch_expiry_effects (id) VALUES (${events[i]!.id})`, { discard: true })
              )
            }),
          classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
          retry: Retry.exponential({ attempts: 3 }),
          concurrency: 1,
          onOutcome: log.record
        })
        yield* stream.publish("a", JSON.stringify({ id: `${p}.e1`, expiresAt: DateTime.formatIso(expiresAt) }), `${p}.e1`)
        yield* stream.publish("a", JSON.stringify({ id: `${p}.e2` }), `${p}.e2`)
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        assert.strictEqual(yield* Eventually.deferred("the batch handler to start", entered), 2, "both events in one batch")
        yield* Eventually.holds("the deadline to pass", Effect.map(Clock.currentTimeMillis, (now) => now > expiresAt.epochMilliseconds))
        yield* Deferred.succeed(release, undefined)
        const outcomes: ReadonlyArray<Outcome.Outcome> = yield* log.waitUntil((all) => all.length >= 2, "20 seconds")
        yield* Fiber.interrupt(fiber)
        const byId = new Map(outcomes.map((o) => [o.message.eventId, o]))
        const expired = byId.get(`${p}.e1`)
        assert.deepStrictEqual([expired?._tag, expired?._tag === "Expired" ? expired.stage : ""], ["Expired", "AfterWait"])
        assert.strictEqual(byId.get(`${p}.e2`)?._tag, "Committed")
        assert.deepStrictEqual(yield* effectRows(p), [`${p}.e2`], "no business effect for the expired element")
        const store = yield* IdempotencyStore.IdempotencyStore
        assert.isFalse(yield* store.isCommitted({ scope: stream.consumer, id: `${p}.e1` }), "the expired element's key is not recorded")
      }).pipe(Effect.scoped))

    it.effect("BE-JOB-005: expiry checked inside each element's effect of commitBatch: the expired element alone fails (Expired, no effect) and the fresh one commits in the same batch, judged by its own deadline", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS batch_expiry_effects (id text PRIMARY KEY)`
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const p = `by${Date.now()}`
        const expiresAt = DateTime.makeUnsafe(Date.now() + 1_500)
        const release = yield* Deferred.make<void>()
        const sizes: Array<number> = []
        const entered = yield* Deferred.make<void>()
        const consumer = Consumer.makeBatch({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata,
          batch: { maxSize: 2, maxWait: Duration.millis(500) },
          handleBatch: (events) =>
            Effect.gen(function*() {
              sizes.push(events.length)
              yield* Deferred.succeed(entered, undefined)
              yield* Deferred.await(release)
              // The fresh element (published first) runs its check first: it must judge its own deadline only.
              return yield* IdempotencyStore.commitBatch(events.map((event) => ({
                id: event.id,
                effect: Effect.andThen(Expiry.ensure, sql`INSERT INTO batch_expiry_effects (id) VALUES (${event.id})`)
              })))
            }),
          classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
          retry: Retry.exponential({ attempts: 3 }),
          concurrency: 1,
          onOutcome: log.record
        })
        yield* stream.publish("a", JSON.stringify({ id: `${p}.e1` }), `${p}.e1`)
        yield* stream.publish("a", JSON.stringify({ id: `${p}.e2`, expiresAt: DateTime.formatIso(expiresAt) }), `${p}.e2`)
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* Eventually.deferred("the batch handler to start", entered)
        yield* Eventually.holds("the deadline to pass", Effect.map(Clock.currentTimeMillis, (now) => now > expiresAt.epochMilliseconds))
        yield* Deferred.succeed(release, undefined)
        const outcomes: ReadonlyArray<Outcome.Outcome> = yield* log.waitUntil((all) => all.length >= 2, "20 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(sizes, [2], "one batch, no element run alone")
        const byId = new Map(outcomes.map((o) => [o.message.eventId, o]))
        assert.strictEqual(byId.get(`${p}.e1`)?._tag, "Committed", JSON.stringify(byId.get(`${p}.e1`)))
        const expired = byId.get(`${p}.e2`)
        assert.deepStrictEqual([expired?._tag, expired?._tag === "Expired" ? expired.stage : ""], ["Expired", "AfterWait"])
        assert.deepStrictEqual(yield* effectRows(p), [`${p}.e1`], "no business effect for the expired element")
      }).pipe(Effect.scoped))
  })
})

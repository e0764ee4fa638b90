/**
 * Testing your consumer (README, "Testing your consumer"), as a user would: the consumer of
 * OrderShipping.ts against the real NATS and PostgreSQL, on a throw-away stream and schema that
 * the test's scope deletes, with bounded waits on its outcomes.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope } from "@jetworker/core"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Migrations, PgIdempotencyStore } from "@jetworker/sql-pg"
import { OutcomeLog, TestDatabase, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { shipping, tables } from "../src/OrderShipping.ts"

// Real services: NATS, and PostgreSQL in a fresh schema with the dedup store on it (jetworker's
// migrations beneath it: the store's layer refuses to build without its table).
const Live = Layer.mergeAll(
  NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" }),
  PgIdempotencyStore.layer().pipe(Layer.provide(Migrations.layer), Layer.provideMerge(TestDatabase.layer()))
)

const order = (id: string, sku: string) =>
  Effect.map(Envelope.make({ type: "order.created", id, data: { orderId: id, sku, quantity: 1 } }), (event) =>
    Envelope.toJson(event))

describe("order shipping", () => {
  // `excludeTestServices`: the engine's timers (leases, retries) must run on the real clock.
  layer(Live, { excludeTestServices: true })((it) => {
    it.effect("ships a known SKU once, dead-letters an unknown one, and takes a republished order as a duplicate", () =>
      Effect.gen(function*() {
        yield* tables
        const stream = yield* TestStream.make({ maxDeliver: 11 })
        yield* stream.publish("created", yield* order("o1", "book"), "o1")
        yield* stream.publish("created", yield* order("o2", "unicorn"), "o2")
        yield* stream.publish("created", yield* order("o1", "book"), "o1-again") // a new message id: not deduplicated by the stream
        const log = yield* OutcomeLog.make
        const consumer = shipping({
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        // Bounded: a wait that cannot be satisfied fails with a WaitTimeout saying what it saw.
        const outcomes = yield* log.waitUntil((all) => all.length >= 3, "15 seconds")
        yield* Fiber.interrupt(fiber)
        // Handlers run concurrently: compare the outcomes, not their order.
        assert.deepStrictEqual(
          outcomes.map((o) => `${o.message.eventId} ${o._tag}`).sort(),
          ["o1 Committed", "o1 Duplicate", "o2 DeadLettered"]
        )
        const sql = yield* SqlClient.SqlClient
        const shipped = yield* sql<{ readonly order_id: string }>`SELECT order_id FROM shipments`
        assert.deepStrictEqual(shipped.map((row) => row.order_id), ["o1"])
      }))
  })
})

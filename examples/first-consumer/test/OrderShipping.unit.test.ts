/**
 * Testing your consumer without NATS or PostgreSQL (README, "Testing your consumer"): the same
 * kind of consumer over `InMemoryBroker` (JetStream's delivery semantics: leases, naks with a
 * delay, redelivery, dead letters) and `InMemoryIdempotencyStore`, under `TestClock`, so retries
 * and their delays run in a few milliseconds and every run is the same. The effect is an
 * in-memory stand-in for the shipment insert; what is under test is the consumer's decisions:
 * what it retries, what it dead-letters, and that a redelivered order ships once.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Envelope, IdempotencyStore, type Outcome } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Data, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { OrderCreated, UnknownSku } from "../src/OrderShipping.ts"

/** The warehouse is down for a while: retrying helps. */
class WarehouseUnavailable extends Data.TaggedError("WarehouseUnavailable")<{ readonly message: string }> {}

const order = (id: string, sku: string) =>
  Effect.map(Envelope.make({ type: "order.created", id, data: { orderId: id, sku, quantity: 1 } }), (event) =>
    Envelope.toJson(event))

describe("order shipping, without NATS or PostgreSQL", () => {
  // `it.effect` runs under TestClock: time moves only when the test moves it.
  it.effect("retries a transient failure after its delay, dead-letters an unknown SKU at once, and ships a redelivered order once", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      const store = InMemoryIdempotencyStore.make()
      const shipped: Array<string> = []
      let warehouseFailures = 2 // the first two attempts find the warehouse down
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "order-shipping",
        source: broker.source,
        schema: OrderCreated,
        handle: (event) =>
          IdempotencyStore.commit(
            event.id,
            Effect.suspend((): Effect.Effect<void, UnknownSku | WarehouseUnavailable> => {
              if (event.data.sku === "unicorn") return Effect.fail(new UnknownSku({ sku: "unicorn", message: "unknown SKU unicorn" }))
              if (warehouseFailures-- > 0) return Effect.fail(new WarehouseUnavailable({ message: "warehouse down" }))
              return Effect.sync(() => {
                shipped.push(event.data.orderId)
              })
            })
          ),
        classify: { UnknownSku: "permanent", WarehouseUnavailable: "transient", IdempotencyError: "isRetryable" },
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* broker.publish(yield* order("o1", "book"))
      yield* broker.publish(yield* order("o2", "unicorn"))
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
      // Move time in steps until every message is settled (bounded: a stuck run fails below).
      for (let step = 0; step < 600 && !broker.quiescent(); step++) yield* TestClock.adjust("100 millis")
      assert.isTrue(broker.quiescent(), "every message settled")

      // The same order delivered again (a redelivery, a republish): a duplicate, not shipped twice.
      yield* broker.publish(yield* order("o1", "book"))
      for (let step = 0; step < 600 && !broker.quiescent(); step++) yield* TestClock.adjust("100 millis")
      yield* Fiber.interrupt(fiber)

      assert.deepStrictEqual(shipped, ["o1"])
      // Three runs of o1's effect (two failures, then the shipment); its redelivery ran none.
      assert.strictEqual(warehouseFailures, -1)
      const last = (id: string) => outcomes.filter((o) => o.message.eventId === id).map((o) => o._tag)
      // o1: two transient failures (retried in process or released with a delay), then committed, then a duplicate.
      assert.deepStrictEqual(last("o1").filter((tag) => tag !== "Released"), ["Committed", "Duplicate"])
      assert.deepStrictEqual(last("o2"), ["DeadLettered"])
      assert.strictEqual(broker.deadLetters().length, 1)
      assert.strictEqual(store.commits().length, 1)
    }))
})

/**
 * BE-JOB-003: a dead letter that could not be written is naked for a redelivery that writes it
 * again. With the retry policy's delay alone (a 50 ms base here), an outage of the dead-letter
 * stream of some seconds (a failover) spent the message's remaining deliveries in those seconds,
 * up to its MaxDeliver, where it is stranded. The nak has a floor of 5 seconds. In-memory broker
 * (every dead-letter write refused) and test clock: the nak's delay and the redeliveries are seen
 * exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Duration, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Invalid extends Data.TaggedError("Invalid")<{ readonly message: string }> {}

const floorMillis = 5_000

describe("the nak after a dead letter that was not written", () => {
  it.effect("BE-JOB-003: a failed dead-letter write is naked with at least 5 s, whatever the retry policy's delay: an 8 s outage of the dead-letter stream costs two deliveries, not the message's remaining ones", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 11, faults: { deadLetterFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "dead-letter-floor",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () => Effect.fail(new Invalid({ message: "never valid" })),
        classify: { Invalid: "permanent" },
        retry: Retry.exponential({ attempts: 5, base: "50 millis", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      // Eight seconds of the outage, in steps of 10 ms.
      for (let i = 0; i < 800; i++) yield* TestClock.adjust("10 millis")
      yield* Fiber.interrupt(fiber)
      const released = outcomes.filter((outcome) => outcome._tag === "Released")
      assert.isAbove(released.length, 0, "a dead letter that failed")
      for (const outcome of released) {
        assert.strictEqual(outcome._tag === "Released" ? outcome.reason : outcome._tag, "DeadLetterFailed")
        const retryIn = outcome._tag === "Released" && outcome.retryIn !== undefined ? Duration.toMillis(outcome.retryIn) : 0
        assert.isAtLeast(retryIn, floorMillis, "the nak's delay")
      }
      // The broker saw it: each redelivery comes at least the floor after the nak before it.
      const events = broker.events()
      const deliveries = events.filter((event) => event._tag === "Delivered")
      const naks = events.filter((event) => event._tag === "Naked")
      for (const nak of naks) {
        const next = deliveries.find((delivery) => delivery.deliveryCount === nak.deliveryCount + 1)
        if (next !== undefined) assert.isAtLeast(next.at - nak.at, floorMillis, `redelivery ${next.deliveryCount}`)
      }
      assert.isAtMost(deliveries.length, 2, `deliveries in 8 s: ${deliveries.map((d) => d.deliveryCount).join(", ")}`)
    }))
})

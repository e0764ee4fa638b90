/**
 * BE-JOB-006: an owner past its local lease sends no nak. Its lease may be another consumer's
 * delivery by then, and NATS 2.9 applies a nak by sequence to whoever holds the message: the old
 * owner's nak would hand the message to a third consumer while the second still runs it. Past the
 * lease the engine already withholds acks; a failure found there is left to the broker too.
 * In-memory broker and test clock: the window (from 90% of the lease to the keeper's next check)
 * is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

describe("an old owner's nak", () => {
  it.effect("BE-JOB-006: a transient failure found past 90% of the lease sends no nak: Released (LeaseLost), left to the broker", () =>
    Effect.gen(function*() {
      // Every extension fails, so the lease is not renewed; the keeper checks every 100 ms (a
      // sixth of the lease) and takes it lost at its check at 600 ms. The handler fails at 560 ms.
      const broker = InMemoryBroker.make({ lease: "600 millis", faults: { extendFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "old-owner",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () => Effect.andThen(Effect.sleep("560 millis"), Effect.fail(new Flaky({ message: "try again" }))),
        classify: { Flaky: "transient" },
        retry: Retry.exponential({ attempts: 5, base: "1 second", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      for (let i = 0; i < 100 && outcomes.length < 1; i++) yield* TestClock.adjust("10 millis")
      yield* Fiber.interrupt(fiber)
      const first = outcomes[0]
      assert.isDefined(first, "an outcome for the first delivery")
      const naks = broker.events().filter((event) => event._tag === "Naked" && event.deliveryCount === 1)
      assert.deepStrictEqual(naks, [], `the old owner's nak reached the broker: ${JSON.stringify(first)}`)
      assert.deepStrictEqual([first!._tag, first!._tag === "Released" ? first!.reason : ""], ["Released", "LeaseLost"])
      // The failure that ended the run is kept for the operator.
      assert.include(first!._tag === "Released" ? String(first!.error?.message) : "", "try again")
    }))
})

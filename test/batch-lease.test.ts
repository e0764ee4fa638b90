/**
 * BE-JOB-006 in a batch handler: `Lease.ensure` before an irreversible step checks every element's
 * local lease, as it checks a delivery's. Past an element's lease it fails the batch as a whole;
 * each element then runs alone, where the check ends it `Released` (LeaseLost) before the step.
 * (Before, `Lease.ensure` found no current delivery in a batch handler and let the step run.)
 * In-memory broker and test clock: the window (from 90% of the lease to the keeper's next check)
 * is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Lease, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { DateTime, Duration, Effect, Fiber, Result, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

describe("Lease.ensure in a batch handler", () => {
  it.effect("BE-JOB-006: a batch handler past its elements' lease is stopped by Lease.ensure before its irreversible step: each element Released (LeaseLost), no step, no ack", () =>
    Effect.gen(function*() {
      // Every extension fails, so no lease is renewed; the keeper takes them lost at its check at
      // 600 ms. The handler reaches its check at about 560 ms: past 90% of the lease, before the cut.
      const broker = InMemoryBroker.make({ lease: "600 millis", faults: { extendFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const outcomes: Array<Outcome.Outcome> = []
      const steps: Array<string> = []
      const sizes: Array<number> = []
      const consumer = Consumer.makeBatch({
        name: "batch-lease",
        source: broker.source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: Duration.millis(20) },
        handleBatch: (events) =>
          Effect.gen(function*() {
            sizes.push(events.length)
            yield* Effect.sleep("540 millis")
            yield* Lease.ensure
            // The irreversible step (a payment call): must not run past the lease.
            for (const event of events) steps.push(event.id)
            return events.map(() => Result.succeed(undefined))
          }),
        classify: {},
        retry: Retry.exponential({ attempts: 5, base: "1 second", inProcessRetries: 0 }),
        concurrency: 1,
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      for (let i = 0; i < 200 && outcomes.length < 2; i++) yield* TestClock.adjust("10 millis")
      // The redelivered batch is in its handler by now: its drain runs on the test clock too.
      let stopped = false
      yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
        stopped = true
      })))
      for (let i = 0; i < 1_000 && !stopped; i++) yield* TestClock.adjust("10 millis")
      assert.isTrue(stopped, "the consumer stopped")
      assert.strictEqual(sizes[0], 2, "both events in one batch")
      assert.deepStrictEqual(steps, [], "the irreversible step ran past the lease")
      assert.deepStrictEqual(
        outcomes.slice(0, 2).map((o) => [o.message.eventId, o._tag, o._tag === "Released" ? o.reason : ""]).sort(),
        [["e1", "Released", "LeaseLost"], ["e2", "Released", "LeaseLost"]]
      )
      const acks = broker.events().filter((event) => event._tag === "Acked")
      assert.deepStrictEqual(acks, [], "no ack past the lease")
    }))
})

/**
 * Expiry checked again before every run of the handler (BE-JOB-005), over the in-memory broker
 * and store under `TestClock`: an event that expires while the engine waits for an in-process
 * retry ends `Expired` (stage `AfterWait`) without its effect.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Clock, Data, DateTime, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.Number })

describe("engine: expiry", () => {
  it.effect("BE-JOB-005: expiry during the wait for an in-process retry: the retry does not run, the outcome is Expired after the wait, no effect", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const now = yield* Clock.currentTimeMillis
      // Expires 150 ms from now; the first run fails and the in-process retry waits 200 ms.
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 150 }))
      const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
        name: "expiry",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(now), expiresAt: DateTime.makeUnsafe(event.expiresAt) }),
        handle: (event): Effect.Effect<unknown, Flaky | IdempotencyStore.IdempotencyError, IdempotencyStore.IdempotencyStore> =>
          Effect.suspend((): Effect.Effect<unknown, Flaky | IdempotencyStore.IdempotencyError, IdempotencyStore.IdempotencyStore> => {
            runs++
            return runs === 1 ? Effect.fail(new Flaky({ message: "once" })) : IdempotencyStore.commit(event.id, Effect.void)
          }),
        classify: { Flaky: "transient", IdempotencyError: "isRetryable" },
        retry: Retry.exponential({ attempts: 3, base: "200 millis", jitter: false, inProcessRetries: 1 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })).pipe(Effect.provide(store.layer)))
      for (let i = 0; i < 20 && outcomes.length === 0; i++) yield* TestClock.adjust("50 millis")
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(runs, 1, "the retry did not run")
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Expired"])
      const [expired] = outcomes
      assert.strictEqual(expired?._tag === "Expired" ? expired.stage : undefined, "AfterWait")
      assert.deepStrictEqual(store.commits(), [])
      assert.isTrue(broker.quiescent(), "acked (the contract's default for expired work)")
    }))
})

describe("engine: lease deadline before the ack", () => {
  it.effect("BE-JOB-006: no ack after ownership is lost: a handler that ends past the lease deadline, before the keeper notices, commits but does not ack", () =>
    Effect.gen(function*() {
      // Lease 600 ms: the keeper looks every 100 ms and calls it lost from 540 ms on; every
      // extension fails. The handler ends at 570 ms: past the deadline, before the keeper's look.
      const broker = InMemoryBroker.make({ lease: "600 millis", faults: { extendFails: 1 } })
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      const now = yield* Clock.currentTimeMillis
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 60_000 }))
      const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
        name: "lease",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(now) }),
        handle: (event) => Effect.andThen(Effect.sleep("570 millis"), IdempotencyStore.commit(event.id, Effect.void)),
        classify: { IdempotencyError: "isRetryable" },
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })).pipe(Effect.provide(store.layer)))
      for (let i = 0; i < 100 && outcomes.length === 0; i++) yield* TestClock.adjust("10 millis")
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
      const [committed] = outcomes
      assert.strictEqual(committed?._tag === "Committed" ? committed.ackWithheld : undefined, "LeaseLost")
      assert.isFalse(committed!.confirmed)
      assert.strictEqual(store.commits().length, 1, "the effect is committed (the dedup row fences a second owner)")
      assert.isFalse(broker.events().some((e) => e._tag === "Acked"), "no ack was sent")
    }))
})

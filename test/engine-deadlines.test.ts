/**
 * Deadlines inside the engine, over the in-memory broker and store under `TestClock`: expiry
 * checked before every run of the handler and by the handler itself after a wait (BE-JOB-005),
 * and the lease deadline checked before every ack and by the handler before an irreversible step
 * (BE-JOB-006).
 */
import { assert, describe, it } from "@effect/vitest"
import { type Classification, Consumer, Expiry, IdempotencyStore, Lease, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Clock, Data, DateTime, type Duration, Effect, Fiber, Metric, Schema } from "effect"
import { TestClock } from "effect/testing"

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.Number })

/** A broker, a store and an outcome log for one test. */
const rig = (options: InMemoryBroker.Options) => {
  const outcomes: Array<Outcome.Outcome> = []
  return {
    broker: InMemoryBroker.make(options),
    store: InMemoryIdempotencyStore.make(),
    outcomes,
    record: (outcome: Outcome.Outcome) => Effect.sync(() => outcomes.push(outcome))
  }
}

/** Runs `consumer` (with `store`), moving the test clock by `step` until an outcome, at most `steps` times. */
const untilOutcome = <A, E extends Classification.Tagged>(
  consumer: Consumer.Consumer<A, E, IdempotencyStore.IdempotencyStore>,
  setup: ReturnType<typeof rig>,
  step: Duration.Input,
  steps: number
) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(setup.store.layer)))
    for (let i = 0; i < steps && setup.outcomes.length === 0; i++) yield* TestClock.adjust(step)
    yield* Fiber.interrupt(fiber)
  })

describe("engine: expiry", () => {
  it.effect("BE-JOB-005: expiry during the wait for an in-process retry: the retry does not run, the outcome is Expired after the wait, no effect", () =>
    Effect.gen(function*() {
      const setup = rig({ lease: "30 seconds" })
      const { broker, store, outcomes } = setup
      let runs = 0
      const now = yield* Clock.currentTimeMillis
      // Expires 150 ms from now; the first run fails and the in-process retry waits 200 ms.
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 150 }))
      yield* untilOutcome(Consumer.make({
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
        onOutcome: setup.record
      }), setup, "50 millis", 20)
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
      const setup = rig({ lease: "600 millis", faults: { extendFails: 1 } })
      const { broker, store, outcomes } = setup
      const now = yield* Clock.currentTimeMillis
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 60_000 }))
      yield* untilOutcome(Consumer.make({
        name: "lease",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(now) }),
        handle: (event) => Effect.andThen(Effect.sleep("570 millis"), IdempotencyStore.commit(event.id, Effect.void)),
        classify: { IdempotencyError: "isRetryable" },
        onOutcome: setup.record
      }), setup, "10 millis", 100)
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
      const [committed] = outcomes
      assert.strictEqual(committed?._tag === "Committed" ? committed.ackWithheld : undefined, "LeaseLost")
      assert.isFalse(committed!.confirmed)
      assert.strictEqual(store.commits().length, 1, "the effect is committed (the dedup row fences a second owner)")
      assert.isFalse(broker.events().some((e) => e._tag === "Acked"), "no ack was sent")
    }))
})

/** The `jetworker.expired` counter of consumer `name` at `stage`. */
const expiredCount = (name: string, stage: string) =>
  Effect.map(Metric.snapshot, (snapshots) =>
    snapshots
      .filter((m) => m.id === "jetworker.expired" && m.attributes?.consumer === name && m.attributes?.stage === stage)
      .reduce((sum, m) => sum + Number((m.state as { readonly count: number | bigint }).count), 0))

describe("engine: deadlines the handler checks", () => {
  it.effect("BE-JOB-005: expiry while waiting for a dependency: a handler that waited past the deadline and checks Expiry.ensure ends Expired with no business effect, counted in the expiry metric", () =>
    Effect.gen(function*() {
      const setup = rig({ lease: "30 seconds" })
      const { broker, store, outcomes } = setup
      const now = yield* Clock.currentTimeMillis
      const before = yield* expiredCount("waits", "AfterWait")
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 200 }))
      yield* untilOutcome(Consumer.make({
        name: "waits",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(now), expiresAt: DateTime.makeUnsafe(event.expiresAt) }),
        handle: (event) =>
          Effect.sleep("300 millis").pipe( // waiting for a dependency (a lock, a rate limit)
            Effect.andThen(Expiry.ensure),
            Effect.andThen(IdempotencyStore.commit(event.id, Effect.void))
          ),
        classify: { IdempotencyError: "isRetryable" }, // WorkExpired needs no entry
        onOutcome: setup.record
      }), setup, "50 millis", 20)
      assert.deepStrictEqual(outcomes.map((o) => [o._tag, o._tag === "Expired" ? o.stage : ""]), [["Expired", "AfterWait"]])
      assert.deepStrictEqual(store.commits(), [])
      assert.strictEqual((yield* expiredCount("waits", "AfterWait")) - before, 1)
    }))

  it.effect("BE-JOB-006: Lease.ensure before an irreversible step: past the local lease deadline the handler stops, the delivery is released without an ack, and the fencing token named it", () =>
    Effect.gen(function*() {
      const setup = rig({ lease: "600 millis", faults: { extendFails: 1 } })
      const { broker, outcomes } = setup
      const tokens: Array<Lease.FencingToken> = []
      let effects = 0
      const now = yield* Clock.currentTimeMillis
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 60_000 }))
      yield* untilOutcome(Consumer.make({
        name: "fenced",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(now) }),
        handle: () =>
          Effect.gen(function*() {
            tokens.push(yield* Lease.fencingToken)
            yield* Effect.sleep("570 millis") // the slow part, past the lease deadline (540 ms)
            yield* Lease.ensure
            effects++ // the irreversible step
          }),
        classify: {}, // LeaseExpired needs no entry
        onOutcome: setup.record
      }), setup, "10 millis", 100)
      assert.strictEqual(effects, 0)
      assert.deepStrictEqual(outcomes.map((o) => [o._tag, "reason" in o ? o.reason : ""]), [["Released", "LeaseLost"]])
      assert.deepStrictEqual(tokens, [{ scope: "fenced", eventId: "e1", sequence: 1, deliveryCount: 1 }])
      assert.isFalse(broker.events().some((e) => e._tag === "Acked"))
    }))
})

/**
 * A redelivery found past its event's deadline is `Expired` ("no effect") only when no earlier
 * delivery committed the effect: the ack of a committed delivery can be lost (a JetStream
 * consumer's leader being elected, a crash after the commit), and the broker then redelivers the
 * applied event after its ack wait, by then past its deadline. The engine asks this run's memory
 * and the idempotency store first: `Duplicate` when committed; released for a later check when the
 * store cannot answer. In-memory broker behind a source whose acks fail as scripted; test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Delivery, Expiry, IdempotencyStore, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.Number })
const metadata = (event: { readonly id: string; readonly expiresAt: number }) => ({
  id: event.id,
  time: DateTime.makeUnsafe(0),
  expiresAt: DateTime.makeUnsafe(event.expiresAt)
})

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/** `broker`'s source, whose first delivery's acks all fail (no responder): left to the redelivery. */
const firstAckLost = (broker: InMemoryBroker.InMemoryBroker): Source.Source => ({
  name: broker.source.name,
  open: (options) =>
    Effect.map(broker.source.open(options), (intake) => ({
      ...intake,
      take: Effect.map(intake.take, (delivery): Delivery.Delivery => ({
        ...delivery,
        ack: delivery.deliveryCount === 1
          ? Effect.fail(new Delivery.SettleError({ command: "Ack", reason: "Unavailable", message: "no responders (scripted)" }))
          : delivery.ack
      }))
    }))
})

/** Steps the test clock 10 ms at a time until `done`. */
const until = (done: () => boolean, what: () => string, maxSteps = 2_000) =>
  Effect.gen(function*() {
    for (let i = 0; i < maxSteps && !done(); i++) yield* TestClock.adjust("10 millis")
    assert.isTrue(done(), what())
  })

/** Stops `fiber`, stepping the clock while its shutdown waits on it. */
const stop = (fiber: Fiber.Fiber<unknown, unknown>) =>
  Effect.gen(function*() {
    let stopped = false
    yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
      stopped = true
    })))
    for (let i = 0; i < 3_000 && !stopped; i++) yield* TestClock.adjust("10 millis")
    assert.isTrue(stopped, "the consumer stopped")
  })

const summary = (outcomes: ReadonlyArray<Outcome.Outcome>) =>
  outcomes.map((o) => [o._tag, "reason" in o ? o.reason : "stage" in o ? o.stage : "", o.confirmed, o.message.deliveryCount])

/** A consumer of `source` whose handler is `handle` (of the event's id); failures are transient. */
const consumerOf = <R>(
  name: string,
  source: Source.Source,
  outcomes: Array<Outcome.Outcome>,
  handle: (id: string) => Effect.Effect<unknown, IdempotencyStore.IdempotencyError | Flaky | Expiry.WorkExpired, R>,
  onExpired: "ack" | "deadLetter" = "ack"
) =>
  Consumer.make({
    name,
    source,
    schema: Event,
    metadata,
    handle: (event) => handle(event.id),
    classify: { IdempotencyError: "transient", Flaky: "transient" },
    retry: Retry.exponential({ attempts: 3, base: "3 seconds", jitter: false, inProcessRetries: 0 }),
    expiry: { onExpired },
    onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
  })

/** Commits event `id` through the idempotency store, with no other effect. */
const commit = (id: string) => IdempotencyStore.commit(id, Effect.void)

describe("an expired redelivery of a committed event", () => {
  it.effect("this run committed it, its ack was lost: the redelivery past the deadline is a Duplicate, not Expired", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "t1", expiresAt: 1_000 }))
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      // The handler has its own store: the engine knows only what this run saw.
      const consumer = consumerOf("expired-after-commit-memory", firstAckLost(broker), outcomes, (id) => Effect.provide(commit(id), store.layer))
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1], ["Duplicate", "", true, 2]])
      assert.strictEqual(store.commits().length, 1)
      assert.isTrue(broker.quiescent())
    }))

  it.effect("another run committed it: the idempotency store says so, and nothing is dead-lettered under onExpired deadLetter", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "t1", expiresAt: 1_000 }))
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = consumerOf("expired-after-commit-store", firstAckLost(broker), outcomes, commit, "deadLetter")
      const first = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* stop(first)
      // Another process (or this one restarted) receives the redelivery, past the deadline.
      const second = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(second)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1], ["Duplicate", "", true, 2]])
      assert.deepStrictEqual(broker.deadLetters(), [], "no dead letter for an applied event")
      assert.isTrue(broker.quiescent())
    }))

  it.effect("a store that cannot answer: released for a later check (never Expired), then a Duplicate once it answers", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "t1", expiresAt: 1_000 }))
      const store = InMemoryIdempotencyStore.make()
      let lookups = 0
      const failingOnce = Layer.succeed(IdempotencyStore.IdempotencyStore, {
        ...store.service,
        isCommitted: (key) =>
          ++lookups === 1
            ? Effect.fail(new IdempotencyStore.IdempotencyError({ reason: "Unavailable", message: "connection refused" }))
            : store.service.isCommitted(key)
      })
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = consumerOf("expired-after-commit-store-down", firstAckLost(broker), outcomes, commit, "deadLetter")
      const first = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* stop(first)
      const second = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), failingOnce))
      yield* until(() => outcomes.length >= 3, () => JSON.stringify(summary(outcomes)), 3_000)
      yield* stop(second)
      assert.deepStrictEqual(summary(outcomes), [
        ["Committed", "", false, 1],
        ["Released", "Retrying", true, 2],
        ["Duplicate", "", true, 3]
      ])
      const released = outcomes[1]!
      assert.strictEqual(released._tag === "Released" ? released.error?.tag : undefined, "IdempotencyError")
      assert.deepStrictEqual(broker.deadLetters(), [])
    }))

  it.effect("found expired by the handler (Expiry.ensure, after a wait) on a redelivery: the store says committed, a Duplicate", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      // Redelivered at 2 s, before its deadline (3 s); the handler waits 1.5 s, then checks.
      yield* broker.publish(JSON.stringify({ id: "t1", expiresAt: 3_000 }))
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = consumerOf("expired-after-commit-after-wait", firstAckLost(broker), outcomes, (id) =>
        Effect.suspend(() => ++runs === 1 ? commit(id) : Effect.andThen(Effect.andThen(Effect.sleep("1500 millis"), Expiry.ensure), commit(id))))
      const first = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* stop(first)
      const second = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(second)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1], ["Duplicate", "", true, 2]])
      assert.strictEqual(runs, 2)
    }))

  it.effect("an expired redelivery whose effect never committed is still Expired", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "t1", expiresAt: 1_000 }))
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      // The first run fails transiently; its retry (3 s later) comes past the deadline.
      const consumer = consumerOf("expired-never-committed", broker.source, outcomes, () => Effect.fail(new Flaky({ message: "lock timeout" })))
      const fiber = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["Released", "Retrying", true, 1], ["Expired", "BeforeHandler", true, 2]])
      assert.strictEqual(store.commits().length, 0)
    }))
})

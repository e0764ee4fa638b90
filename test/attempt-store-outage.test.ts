/**
 * BE-JOB-003: an outage of the attempt store does not turn the broker's delivery count into the
 * failure count. The delivery count also counts deliveries that were no failures (naks of another
 * client of the durable, lease losses, kills, restarts): when the store cannot be read the handler
 * runs (a dependency that is down makes it fail transiently, and the message is released with a
 * backoff), and when a failure cannot be recorded the message is dead-lettered `AttemptsExhausted`
 * only on failures known to be real; the crash-loop guard (`DeliveriesExhausted`, below the
 * broker's MaxDeliver) stays the hard bound. In-memory broker, test clock, and an attempt store
 * that fails with its typed error (`PgAttemptStore` shares the handler's database, so it is down
 * exactly when the database is).
 */
import { assert, describe, it } from "@effect/vitest"
import { AttemptStore, Consumer, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Duration, Effect, Fiber, Result, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

const unavailable = (operation: string) =>
  new AttemptStore.AttemptStoreError({ message: `attempt store ${operation}: PgConnection: Failed to connect` })

/**
 * An attempt store double: `read` gives the recorded failures (or `undefined`: the read fails),
 * every record fails (the store is unavailable); the calls are counted (`failures`: the reads).
 */
const storeDouble = (read: number | undefined) => {
  const calls = { failures: 0, recordFailure: 0, clear: 0 }
  const store: AttemptStore.AttemptStoreShape = {
    read: () =>
      Effect.suspend(() => {
        calls.failures++
        return read === undefined ? Effect.fail(unavailable("read")) : Effect.succeed({ failures: read })
      }),
    recordFailure: () =>
      Effect.suspend(() => {
        calls.recordFailure++
        return Effect.fail(unavailable("record"))
      }),
    recordDeadLetter: () => Effect.fail(unavailable("record dead letter")),
    clear: () => Effect.sync(() => void calls.clear++)
  }
  return { store, calls }
}

/** Takes `count` deliveries of the broker's messages as another client of the durable and naks them. */
const nakedElsewhere = (broker: InMemoryBroker.InMemoryBroker, count: number) =>
  Effect.scoped(Effect.gen(function*() {
    const intake = yield* broker.source.open({ consumer: "elsewhere", prefetch: 1, attempts: 5, ordering: "Unordered" })
    for (let i = 0; i < count; i++) {
      const delivery = yield* intake.take
      yield* delivery.nak(Duration.zero)
    }
  }))

const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : ""

/** Runs `run` on the test clock until `done` (bounded), then stops it. */
const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(run)
    for (let i = 0; i < 5_000 && !done(); i++) yield* TestClock.adjust("100 millis")
    yield* Fiber.interrupt(fiber)
    assert.isTrue(done(), "the consumer reached the expected outcome in time")
  })

const policy = Retry.exponential({ attempts: 5, base: "1 second", cap: "30 seconds", jitter: false, inProcessRetries: 0 })

/**
 * Message e1 on a broker with MaxDeliver `maxDeliver` (default 20), delivered `nakedBefore` times
 * to another client of the durable first, consumed by `name` under `policy` with the handler
 * `handle(run)` (`run` from 1; `Flaky` is transient) and the attempt store double reading `read`,
 * on the test clock until `done(outcomes)`.
 */
const underOutage = (options: {
  readonly name: string
  readonly maxDeliver?: number
  readonly nakedBefore: number
  readonly read: number | undefined
  readonly handle: (run: number) => Effect.Effect<void, Flaky>
  readonly done: (outcomes: ReadonlyArray<Outcome.Outcome>) => boolean
}) =>
  Effect.gen(function*() {
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: options.maxDeliver ?? 20 })
    yield* broker.publish(JSON.stringify({ id: "e1" }))
    if (options.nakedBefore > 0) yield* nakedElsewhere(broker, options.nakedBefore)
    const { store, calls } = storeDouble(options.read)
    const outcomes: Array<Outcome.Outcome> = []
    let runs = 0
    const consumer = Consumer.make({
      name: options.name,
      source: broker.source,
      schema: Event,
      metadata,
      handle: () => Effect.suspend(() => options.handle(++runs)),
      classify: { Flaky: "transient" },
      retry: policy,
      onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
    })
    yield* runUntil(Effect.provideService(Consumer.run(consumer), AttemptStore.AttemptStore, store), () => options.done(outcomes))
    return { broker, outcomes, calls, runs: () => runs }
  })

const databaseUnreachable = () => Effect.fail(new Flaky({ message: "database unreachable" }))

describe("attempt store outage", () => {
  it.effect("BE-JOB-003: 5 deliveries that were no failures, store unreadable: delivery 6 runs the handler and commits (not AttemptsExhausted before it runs)", () =>
    Effect.gen(function*() {
      const { broker, outcomes, calls, runs } = yield* underOutage({
        name: "outage-commit",
        nakedBefore: 5,
        read: undefined,
        handle: () => Effect.void,
        done: (outcomes) => outcomes.length >= 1
      })
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["Committed", "", 6]],
        `dead-lettered on deliveries that were no failures: ${JSON.stringify(outcomes)}`
      )
      assert.strictEqual(runs(), 1, "the handler ran")
      assert.strictEqual(calls.failures, 1, "the store was asked")
      assert.deepStrictEqual(broker.deadLetters(), [])
    }))

  it.effect("BE-JOB-003: 3 deliveries that were no failures, store down throughout, the handler failing: released with a growing backoff, never AttemptsExhausted on the delivery count; DeliveriesExhausted at the crash-loop bound (2 x attempts = 10, below MaxDeliver 20)", () =>
    Effect.gen(function*() {
      const { broker, outcomes, runs } = yield* underOutage({
        name: "outage-bound",
        nakedBefore: 3,
        read: undefined,
        handle: databaseUnreachable,
        done: (outcomes) => outcomes.some((o) => o._tag !== "Released")
      })
      const released = outcomes.filter((o) => o._tag === "Released")
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [
          ...[4, 5, 6, 7, 8, 9, 10].map((n) => ["Released", "Retrying", n]),
          ["DeadLettered", "DeliveriesExhausted", 11]
        ],
        `not bounded by the crash-loop guard alone: ${JSON.stringify(outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]))}`
      )
      assert.strictEqual(runs(), 7, "the handler ran on every delivery up to the bound")
      // The backoff grows with the delivery count (1 s doubling, capped at 30 s), spreading the
      // deliveries left over a longer outage.
      assert.deepStrictEqual(
        released.map((o) => o._tag === "Released" && o.retryIn !== undefined ? Duration.toMillis(o.retryIn) : -1),
        [8_000, 16_000, 30_000, 30_000, 30_000, 30_000, 30_000]
      )
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["DeliveriesExhausted", 11]])
    }))

  it.effect("BE-JOB-003: store down throughout, the handler failing, MaxDeliver 8 (below 2 x attempts + 1): dead-lettered DeliveriesExhausted on the broker's last delivery, the bound MaxDeliver - 1 = 7", () =>
    Effect.gen(function*() {
      const { broker, outcomes, runs } = yield* underOutage({
        name: "outage-max-deliver",
        maxDeliver: 8,
        nakedBefore: 0,
        read: undefined,
        handle: databaseUnreachable,
        done: (outcomes) => outcomes.some((o) => o._tag !== "Released")
      })
      assert.deepStrictEqual(outcomes.at(-1) && [outcomes.at(-1)!._tag, reasonOf(outcomes.at(-1)!), outcomes.at(-1)!.message.deliveryCount], [
        "DeadLettered",
        "DeliveriesExhausted",
        8
      ])
      assert.strictEqual(runs(), 7, "the handler ran on each delivery up to the bound")
      assert.deepStrictEqual(broker.deadLetters().map((letter) => letter.reason), ["DeliveriesExhausted"])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-003: the store reads 1 failure, recording the next fails on delivery 6 (5 were no failures): released for a retry, which commits", () =>
    Effect.gen(function*() {
      const { broker, outcomes, calls } = yield* underOutage({
        name: "outage-record",
        nakedBefore: 5,
        read: 1,
        handle: (run) => (run === 1 ? databaseUnreachable() : Effect.void),
        done: (outcomes) => outcomes.some((o) => o._tag !== "Released")
      })
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["Released", "Retrying", 6], ["Committed", "", 7]],
        `dead-lettered on deliveries that were no failures: ${JSON.stringify(outcomes)}`
      )
      assert.strictEqual(calls.recordFailure, 1)
      assert.deepStrictEqual(broker.deadLetters(), [])
    }))

  it.effect("BE-JOB-003: a batch: an element delivered 5 times without failing, store unreadable, commits with the batch's other element (not AttemptsExhausted before the handler)", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 20 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* nakedElsewhere(broker, 5)
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const { store } = storeDouble(undefined)
      const outcomes: Array<Outcome.Outcome> = []
      const handled: Array<string> = []
      const consumer = Consumer.makeBatch({
        name: "outage-batch",
        source: broker.source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: "1 second" },
        handleBatch: (events) =>
          Effect.sync(() => {
            handled.push(...events.map((event) => event.id))
            return events.map(() => Result.succeed(undefined))
          }),
        classify: {},
        retry: policy,
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runUntil(Effect.provideService(Consumer.run(consumer), AttemptStore.AttemptStore, store), () => outcomes.length >= 2)
      assert.deepStrictEqual(
        outcomes.map((o) => [o.message.eventId, o._tag, reasonOf(o), o.message.deliveryCount]).sort(),
        [["e1", "Committed", "", 6], ["e2", "Committed", "", 1]],
        `dead-lettered on deliveries that were no failures: ${JSON.stringify(outcomes)}`
      )
      assert.deepStrictEqual([...handled].sort(), ["e1", "e2"])
      assert.deepStrictEqual(broker.deadLetters(), [])
    }))

  it.effect("BE-JOB-003: the store reads 4 failures and recording the 5th fails: dead-lettered AttemptsExhausted (the failures known are real)", () =>
    Effect.gen(function*() {
      const { broker, outcomes } = yield* underOutage({
        name: "outage-known",
        nakedBefore: 1,
        read: 4,
        handle: databaseUnreachable,
        done: (outcomes) => outcomes.length >= 1
      })
      assert.deepStrictEqual(outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]), [["DeadLettered", "AttemptsExhausted", 2]])
      assert.deepStrictEqual(broker.deadLetters().map((letter) => letter.reason), ["AttemptsExhausted"])
    }))
})

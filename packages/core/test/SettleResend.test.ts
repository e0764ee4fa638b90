/**
 * A decided outcome whose broker command fails in a way that may pass (no responder, no reply: a
 * JetStream consumer's leader being elected) is sent again within the lease, and a dead letter
 * stored whose term never got through is not undone by the redelivery: the handler does not run
 * again (it could now succeed, and apply a message whose dead letter is stored). In-memory broker
 * behind a source whose acks and terms fail as scripted; test clock, so the lease is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { AttemptStore, Consumer, Delivery, IdempotencyStore, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Clock, Data, DateTime, Effect, Fiber, Layer, Result, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class InsufficientFunds extends Data.TaggedError("InsufficientFunds")<{ readonly message: string }> {}
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

type Command = "Ack" | "Term"

/** What the scripted source saw: each try of a command, with its delivery count and clock time. */
interface Tried {
  readonly command: Command
  readonly deliveryCount: number
  readonly at: number
}

/**
 * `broker`'s source, whose acks and terms fail with `reason` while `fails` says so (the dead
 * letter is stored first, as JetStream's `deadLetter` publishes before it terminates). Records
 * every try and every dead letter written (with its stream sequence).
 */
const scripted = (
  broker: InMemoryBroker.InMemoryBroker,
  fails: (command: Command, delivery: Delivery.Delivery, tryNumber: number) => boolean,
  reason: Delivery.SettleFailure = "Unavailable"
) => {
  const tries: Array<Tried> = []
  const written: Array<{ readonly sequence: number; readonly record: Outcome.DeadLetterRecord }> = []
  const counts = new Map<string, number>()
  const attempt = (command: Command, delivery: Delivery.Delivery, send: Effect.Effect<void, Delivery.SettleError>) =>
    Effect.flatMap(Clock.currentTimeMillis, (at) => {
      const key = `${command}#${delivery.sequence}#${delivery.deliveryCount}`
      const n = (counts.get(key) ?? 0) + 1
      counts.set(key, n)
      tries.push({ command, deliveryCount: delivery.deliveryCount, at })
      return fails(command, delivery, n)
        ? Effect.fail(new Delivery.SettleError({ command, reason, message: `${command}: no responders (scripted)` }))
        : send
    })
  const source: Source.Source = {
    name: broker.source.name,
    open: (options) =>
      Effect.map(broker.source.open(options), (intake) => ({
        ...intake,
        take: Effect.map(intake.take, (delivery): Delivery.Delivery => ({
          ...delivery,
          ack: attempt("Ack", delivery, delivery.ack),
          deadLetter: (record) =>
            Effect.andThen(
              Effect.sync(() => void written.push({ sequence: delivery.sequence, record })),
              // Stored; the term alone may fail (the broker's own dead letter then terminates it).
              attempt("Term", delivery, delivery.deadLetter(record))
            )
        }))
      }))
  }
  return { source, tries, written }
}

/** Steps the test clock 10 ms at a time until `done` (at most `maxSteps` steps). */
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
  outcomes.map((o) => [o._tag, "reason" in o ? o.reason : "", o.confirmed, o.message.deliveryCount])

/**
 * A consumer `name` of `source` whose handler refuses its first run (no funds) and applies the
 * event on any later one (funded since); `counts` says how often it ran and applied.
 */
const refusedThenFunded = (name: string, source: Source.Source, outcomes: Array<Outcome.Outcome>) => {
  const counts = { runs: 0, applied: 0 }
  const consumer = Consumer.make({
    name,
    source,
    schema: Event,
    metadata,
    handle: () =>
      Effect.suspend(() =>
        ++counts.runs === 1
          ? Effect.fail(new InsufficientFunds({ message: "30.00 from an account holding 10.00" }))
          : Effect.sync(() => void counts.applied++)
      ),
    classify: { InsufficientFunds: "permanent" },
    onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
  })
  return { consumer, counts }
}

/**
 * One run of a process: `run` until `outcomes` holds `count` outcomes, then stopped (its memory
 * goes with it; what the attempt store in `run`'s context holds stays).
 */
const runUntil = (run: Effect.Effect<unknown, unknown>, outcomes: ReadonlyArray<Outcome.Outcome>, count: number) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(run)
    yield* until(() => outcomes.length >= count, () => JSON.stringify(summary(outcomes)))
    yield* stop(fiber)
  })

/**
 * An attempt store in memory: the failed attempts per event id (a decision alone counts none, as
 * in `PgAttemptStore`'s row), and the dead-letter decisions.
 */
const attemptStore = () => {
  const counts = new Map<string, number>()
  const decisions = new Map<string, AttemptStore.DeadLetterDecision>()
  const layer = Layer.succeed(AttemptStore.AttemptStore, {
    read: (key) =>
      Effect.sync(() => {
        const deadLetter = decisions.get(key.id)
        const failures = counts.get(key.id) ?? 0
        return deadLetter === undefined ? { failures } : { failures, deadLetter }
      }),
    recordFailure: (key) =>
      Effect.sync(() => {
        const n = (counts.get(key.id) ?? 0) + 1
        counts.set(key.id, n)
        return n
      }),
    recordDeadLetter: (key, decision) => Effect.sync(() => void decisions.set(key.id, decision)),
    clear: (key) =>
      Effect.sync(() => {
        counts.delete(key.id)
        decisions.delete(key.id)
      })
  })
  return { layer, counts, decisions }
}

describe("a decided outcome's command sent again", () => {
  it.effect("an ack without a responder is sent again after 100, 200, 400 ms: the commit is confirmed, not left to a redelivery", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { source, tries } = scripted(broker, (command, _, n) => command === "Ack" && n <= 3)
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = Consumer.make({
        name: "ack-resent",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.sync(() => void runs++),
        classify: {},
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* TestClock.adjust("3 seconds")
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", true, 1]])
      assert.deepStrictEqual(tries.map((t) => t.at), [0, 100, 300, 700])
      assert.strictEqual(runs, 1)
      assert.isTrue(broker.quiescent(), "acked, no redelivery")
    }))

  it.effect("an ack that never gets through is tried until the local lease deadline only (90% of it), then left to the broker: the redelivery is a Duplicate", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { source, tries } = scripted(broker, (command, delivery) => command === "Ack" && delivery.deliveryCount === 1)
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "ack-within-lease",
        source,
        schema: Event,
        metadata,
        handle: (event) => IdempotencyStore.commit(event.id, Effect.void),
        classify: { IdempotencyError: "transient" },
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), store.layer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1], ["Duplicate", "", true, 2]])
      // 100, 200, 400, 800 ms apart; the next (1 s later, at 2.5 s) would start past 1.8 s.
      assert.deepStrictEqual(tries.filter((t) => t.deliveryCount === 1).map((t) => t.at), [0, 100, 300, 700, 1500])
      assert.strictEqual(store.commits().length, 1)
    }))

  it.effect("a refused ack is not sent again", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { source, tries } = scripted(broker, (command, delivery) => command === "Ack" && delivery.deliveryCount === 1, "Refused")
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "ack-refused",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.void,
        classify: {},
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* TestClock.adjust("1 second")
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1]])
      assert.strictEqual(tries.length, 1)
    }))

  it.effect("a shutdown past its drain ends the tries: the consumer stops within its drain, not at the lease's end", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "60 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { source, tries } = scripted(broker, (command) => command === "Ack")
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "ack-drain",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.void,
        classify: {},
        drainTimeout: "1 second",
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => tries.length >= 2, () => `${tries.length} tries`)
      const stoppingAt = yield* Clock.currentTimeMillis
      let stopped = false
      yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
        stopped = true
      })))
      yield* until(() => stopped, () => "the consumer stopped", 500)
      const stoppedAt = yield* Clock.currentTimeMillis
      assert.isAtMost(stoppedAt - stoppingAt, 1_500, "stopped once its drain (1 s) was spent")
      assert.deepStrictEqual(summary(outcomes), [["Committed", "", false, 1]])
    }))

  it.effect("a dead letter's term without a responder is sent again (the dead letter written again with it): terminated, confirmed", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { source, tries, written } = scripted(broker, (command, _, n) => command === "Term" && n <= 2)
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "term-resent",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.fail(new InsufficientFunds({ message: "30.00 from an account holding 10.00" })),
        classify: { InsufficientFunds: "permanent" },
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      yield* TestClock.adjust("3 seconds")
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "PermanentError", true, 1]])
      assert.deepStrictEqual(tries.map((t) => [t.command, t.at]), [["Term", 0], ["Term", 100], ["Term", 300]])
      // Each try writes the dead letter of the same sequence (JetStream stores it once, by its Nats-Msg-Id).
      assert.deepStrictEqual(written.map((w) => w.sequence), [1, 1, 1])
      assert.isTrue(broker.quiescent(), "terminated, no redelivery")
    }))
})

describe("a dead letter stored whose term never got through", () => {
  it.effect("its redelivery is terminated with the same dead letter, and the handler (which would now succeed) does not run again", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "refused" }))
      const { source, written } = scripted(broker, (command, delivery) => command === "Term" && delivery.deliveryCount === 1)
      const outcomes: Array<Outcome.Outcome> = []
      const { consumer, counts } = refusedThenFunded("stored-dead-letter", source, outcomes)
      yield* runUntil(Consumer.run(consumer), outcomes, 2)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "PermanentError", false, 1], ["DeadLettered", "PermanentError", true, 2]])
      assert.deepStrictEqual([counts.runs, counts.applied], [1, 0], "the handler ran once; nothing applied")
      const second = outcomes[1]!
      assert.strictEqual(second._tag === "DeadLettered" ? second.error.tag : undefined, "InsufficientFunds")
      // The dead letter written again names the first run's cause.
      assert.deepStrictEqual([...new Set(written.map((w) => `${w.sequence} ${w.record.reason} ${w.record.error.tag}`))], [
        "1 PermanentError InsufficientFunds"
      ])
      assert.isTrue(broker.quiescent(), "terminated by the redelivery")
    }))

  it.effect("attempts exhausted: the attempt count stays while the term is unconfirmed, so another run's redelivery is dead-lettered without running the handler", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "flaky" }))
      const { source } = scripted(broker, (command, delivery) => command === "Term" && delivery.deliveryCount === 1)
      const attempts = attemptStore()
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = Consumer.make({
        name: "exhausted-elsewhere",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.suspend(() => ++runs === 1 ? Effect.fail(new Flaky({ message: "lock timeout" })) : Effect.void),
        classify: { Flaky: "transient" },
        retry: Retry.exponential({ attempts: 1, base: "1 second", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      // The first run: the dead letter is stored, the term never confirmed.
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 1)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "AttemptsExhausted", false, 1]])
      assert.deepStrictEqual([...attempts.counts], [["flaky", 1]], "the spent attempt is kept")
      // Another run (another process, or this one restarted: no memory of the dead letter).
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 2)
      assert.deepStrictEqual(summary(outcomes).slice(1), [["DeadLettered", "AttemptsExhausted", true, 2]])
      assert.strictEqual(runs, 1, "the handler did not run with a fresh budget")
      assert.deepStrictEqual([...attempts.counts], [], "cleared once settled")
      assert.isTrue(broker.quiescent())
    }))
})

describe("a dead-letter decision kept in the attempt store", () => {
  it.effect("a dead letter stored whose term was lost: another run's redelivery (funded since) is dead-lettered again with the same reason, its handler not run", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "refused" }))
      const { source, written } = scripted(broker, (command, delivery) => command === "Term" && delivery.deliveryCount === 1)
      const attempts = attemptStore()
      const outcomes: Array<Outcome.Outcome> = []
      const { consumer, counts } = refusedThenFunded("decided-elsewhere", source, outcomes)
      // The first run: the dead letter is stored, its term never confirmed.
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 1)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "PermanentError", false, 1]])
      assert.deepStrictEqual([...attempts.decisions].map(([id, d]) => [id, d.reason, d.error.tag]), [
        ["refused", "PermanentError", "InsufficientFunds"]
      ], "the decision is kept while the term is unconfirmed")
      // Another run (another process, or this one restarted: no memory of the dead letter).
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 2)
      assert.deepStrictEqual(summary(outcomes).slice(1), [["DeadLettered", "PermanentError", true, 2]])
      assert.deepStrictEqual([counts.runs, counts.applied], [1, 0], "the handler did not run again; nothing applied")
      const again = outcomes[1]!
      assert.strictEqual(again._tag === "DeadLettered" ? again.error.tag : undefined, "InsufficientFunds")
      // The dead letter written again is the first one (stored once, by its Nats-Msg-Id).
      assert.deepStrictEqual([...new Set(written.map((w) => `${w.sequence} ${w.record.reason} ${w.record.error.tag}`))], [
        "1 PermanentError InsufficientFunds"
      ])
      assert.deepStrictEqual([[...attempts.decisions], [...attempts.counts]], [[], []], "cleared once terminated")
      assert.isTrue(broker.quiescent(), "terminated by the redelivery")
    }))

  it.effect("batch: an element dead-lettered whose term was lost is dead-lettered again by another run's batch, its handler not run", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "refused" }))
      const { source } = scripted(broker, (command, delivery) => command === "Term" && delivery.deliveryCount === 1)
      const attempts = attemptStore()
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = Consumer.makeBatch({
        name: "batch-decided-elsewhere",
        source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: "100 millis" },
        // Refused the first time; a second run would apply it.
        handleBatch: (events) =>
          Effect.sync(() =>
            events.map(() =>
              ++runs === 1 ? Result.fail(new InsufficientFunds({ message: "30.00 from an account holding 10.00" })) : Result.succeed(undefined)
            )
          ),
        classify: { InsufficientFunds: "permanent" },
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 1)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "PermanentError", false, 1]])
      yield* runUntil(Effect.provide(Consumer.run(consumer), attempts.layer), outcomes, 2)
      assert.deepStrictEqual(summary(outcomes).slice(1), [["DeadLettered", "PermanentError", true, 2]])
      assert.strictEqual(runs, 1, "the batch handler did not run the element again")
      assert.deepStrictEqual([[...attempts.decisions], [...attempts.counts]], [[], []], "cleared once terminated")
      assert.isTrue(broker.quiescent())
    }))

  it.effect("a store that never answers the decision's write is cut at handlerTimeout: the dead letter is written all the same", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "refused" }))
      const hanging = Layer.succeed(AttemptStore.AttemptStore, {
        read: () => Effect.succeed({ failures: 0 }),
        recordFailure: () => Effect.succeed(1),
        recordDeadLetter: () => Effect.never,
        clear: () => Effect.void
      })
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "decision-hangs",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () => Effect.fail(new InsufficientFunds({ message: "30.00 from an account holding 10.00" })),
        classify: { InsufficientFunds: "permanent" },
        handlerTimeout: "1 second",
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const startedAt = yield* Clock.currentTimeMillis
      const fiber = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), hanging))
      yield* until(() => outcomes.length >= 1, () => JSON.stringify(summary(outcomes)))
      const settledAt = yield* Clock.currentTimeMillis
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes), [["DeadLettered", "PermanentError", true, 1]])
      assert.isAtLeast(settledAt - startedAt, 1_000, "the write was waited for up to its bound")
      assert.isAtMost(settledAt - startedAt, 1_500, "waited for the store no longer than handlerTimeout")
      assert.isTrue(broker.quiescent())
    }))

  it.effect("a dead letter whose term is confirmed leaves no record; a delivery that commits writes none", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "refused" }))
      yield* broker.publish(JSON.stringify({ id: "fine" }))
      const attempts = attemptStore()
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "decided-and-terminated",
        source: broker.source,
        schema: Event,
        metadata,
        handle: (event) =>
          event.id === "refused" ? Effect.fail(new InsufficientFunds({ message: "30.00 from an account holding 10.00" })) : Effect.void,
        classify: { InsufficientFunds: "permanent" },
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Effect.provide(Consumer.run(consumer), attempts.layer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes).sort(), [["Committed", "", true, 1], ["DeadLettered", "PermanentError", true, 1]])
      assert.deepStrictEqual([[...attempts.decisions], [...attempts.counts]], [[], []])
      assert.isTrue(broker.quiescent())
    }))
})

describe("a batch's ack sent again", () => {
  it.effect("an ack the source's ackAll could not confirm (no responder) is sent again by itself, within its lease", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "2 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const { source, tries } = scripted(broker, (command, delivery, n) => command === "Ack" && delivery.sequence === 2 && n <= 2)
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.makeBatch({
        name: "batch-ack-resent",
        source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: "100 millis" },
        handleBatch: (events) => Effect.succeed(events.map(() => Result.succeed(undefined))),
        classify: {},
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* until(() => outcomes.length >= 2, () => JSON.stringify(summary(outcomes)))
      yield* TestClock.adjust("3 seconds")
      yield* stop(fiber)
      assert.deepStrictEqual(summary(outcomes).sort(), [["Committed", "", true, 1], ["Committed", "", true, 1]])
      assert.strictEqual(tries.length, 4, "e1 once, e2 three times")
      assert.isTrue(broker.quiescent())
    }))
})

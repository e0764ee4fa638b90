/**
 * The engine's long-lived workers and its one deadline watcher, over the in-memory broker and
 * store under `TestClock`: a handler run past `handlerTimeout` is cut (its run interrupted, not
 * left running) and retried as a transient failure; a worker whose delivery lost its lease is
 * replaced, so the consumer keeps its concurrency; shutdown ends idle workers even when the
 * source would go on giving; and a source's `take` is never called concurrently with itself.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Delivery, IdempotencyStore, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Data, DateTime, Duration, Effect, Fiber, Result, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String, time: Schema.String })

/** Interrupts `fiber` (a consumer: it drains) while moving the test clock, until it has ended. */
const stop = (fiber: Fiber.Fiber<unknown, unknown>) =>
  Effect.gen(function*() {
    const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
    for (let i = 0; i < 1000 && stopping.pollUnsafe() === undefined; i++) yield* TestClock.adjust("10 millis")
    yield* Fiber.join(stopping)
  })

/** The engine's view of an event of this file: its id, no expiry. */
const metadata = (event: typeof Event.Type) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

/** A source whose intake hands out what `take` gives (acking a batch with `ackAll`, if given) and ignores `close`. */
const scripted = (name: string, take: Effect.Effect<Delivery.Delivery>, ackAll?: Source.Intake["ackAll"]): Source.Source => ({
  name,
  open: () => Effect.succeed({ lease: Duration.seconds(30), maxDeliver: undefined, take, ackAll, close: Effect.void })
})

/** `count` deliveries (`make(1)` to `make(count)`), then nothing more. */
const deliveries = (count: number, make: (n: number) => Delivery.Delivery = delivery): Effect.Effect<Delivery.Delivery> => {
  let takes = 0
  return Effect.suspend(() => (++takes <= count ? Effect.succeed(make(takes)) : Effect.never))
}

/** A batch consumer of this file's events over `source`: batches of up to `maxSize`, waiting a second to fill. */
const batchOf = (
  source: Source.Source,
  options: {
    readonly maxSize: number
    readonly handleBatch: (events: ReadonlyArray<typeof Event.Type>) => Effect.Effect<ReadonlyArray<Result.Result<unknown, Refused>>>
    readonly onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<unknown>
    readonly onOutcomeTimeout?: Duration.Input
  }
) =>
  Consumer.makeBatch({
    name: source.name,
    source,
    schema: Event,
    metadata,
    batch: { maxSize: options.maxSize, maxWait: "1 second" },
    handleBatch: options.handleBatch,
    classify: { Refused: "permanent" },
    onOutcomeTimeout: options.onOutcomeTimeout,
    onOutcome: options.onOutcome
  })

/** Every element of a batch succeeds. */
const allSucceed = (events: ReadonlyArray<unknown>) => Effect.succeed(events.map(() => Result.succeed(undefined)))

/** A consumer of this file's events over `source`, recording its outcomes in `outcomes`. */
const recording = (
  source: Source.Source,
  outcomes: Array<Outcome.Outcome>,
  options: { readonly handle: () => Effect.Effect<unknown>; readonly concurrency: number; readonly drainTimeout?: Duration.Input }
) =>
  Consumer.make({
    name: source.name,
    source,
    schema: Event,
    metadata,
    handle: options.handle,
    classify: {},
    concurrency: options.concurrency,
    drainTimeout: options.drainTimeout,
    onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
  })

const publish = (broker: InMemoryBroker.InMemoryBroker, id: string) =>
  broker.publish(JSON.stringify({ id, time: new Date(0).toISOString() }))

/** A broker holding one event `e1`, a store and an empty outcome log. */
const oneEvent = Effect.gen(function*() {
  const broker = InMemoryBroker.make({ lease: "30 seconds" })
  yield* publish(broker, "e1")
  return { broker, store: InMemoryIdempotencyStore.make(), outcomes: [] as Array<Outcome.Outcome> }
})

describe("engine: handler timeout", () => {
  it.effect("a run past handlerTimeout is interrupted (its finalizer runs) and fails as HandlerTimeout, a transient failure that the in-process retry runs again", () =>
    Effect.gen(function*() {
      const { broker, store, outcomes } = yield* oneEvent
      const runs: Array<"started" | "cut" | "done"> = []
      const consumer = Consumer.make({
        name: "timeouts",
        source: broker.source,
        schema: Event,
        metadata,
        // The first run hangs; the second commits at once.
        handle: (event) =>
          Effect.suspend(() => {
            runs.push("started")
            return runs.length === 1
              ? Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => runs.push("cut"))))
              : Effect.tap(IdempotencyStore.commit(event.id, Effect.void), () => Effect.sync(() => runs.push("done")))
          }),
        classify: { IdempotencyError: "isRetryable" },
        handlerTimeout: "2 seconds",
        retry: Retry.exponential({ attempts: 3, base: "100 millis", jitter: false, inProcessRetries: 1 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
      yield* TestClock.adjust("1900 millis")
      assert.deepStrictEqual(runs, ["started"], "still running just before its bound")
      yield* TestClock.adjust("200 millis")
      assert.deepStrictEqual(runs.slice(0, 2), ["started", "cut"], "cut at its bound, not left running")
      for (let i = 0; i < 10 && outcomes.length === 0; i++) yield* TestClock.adjust("100 millis")
      assert.deepStrictEqual(runs, ["started", "cut", "started", "done"])
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
      assert.strictEqual(store.commits().length, 1)
      yield* Fiber.interrupt(fiber)
    }))

  it.effect("a run that keeps timing out is released for a later redelivery with HandlerTimeout as its error", () =>
    Effect.gen(function*() {
      const { broker, store, outcomes } = yield* oneEvent
      const consumer = Consumer.make({
        name: "timeouts",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () => Effect.never,
        classify: {},
        handlerTimeout: "1 second",
        retry: Retry.exponential({ attempts: 3, base: "100 millis", jitter: false, inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
      for (let i = 0; i < 20 && outcomes.length === 0; i++) yield* TestClock.adjust("100 millis")
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Released"])
      const [released] = outcomes
      assert.strictEqual(released?._tag === "Released" ? released.reason : undefined, "Retrying")
      assert.strictEqual(released?._tag === "Released" ? released.error?.tag : undefined, "HandlerTimeout")
      yield* Fiber.interrupt(fiber)
    }))
})

describe("engine: workers", () => {
  it.effect("BE-JOB-006: a worker whose delivery lost its lease is replaced: with concurrency 1, the next message is still processed", () =>
    Effect.gen(function*() {
      // Every extension fails: the first run of "slow" (2 s) outlives its 600 ms lease and is cut;
      // its redelivery, and "fast", commit at once, if a worker is there to take them.
      const broker = InMemoryBroker.make({ lease: "600 millis", faults: { extendFails: 1 } })
      const store = InMemoryIdempotencyStore.make()
      const outcomes: Array<Outcome.Outcome> = []
      yield* publish(broker, "slow")
      yield* publish(broker, "fast")
      let slowRuns = 0
      const consumer = Consumer.make({
        name: "workers",
        source: broker.source,
        schema: Event,
        metadata,
        handle: (event) =>
          Effect.andThen(
            event.id === "slow" && slowRuns++ === 0 ? Effect.sleep("2 seconds") : Effect.void,
            IdempotencyStore.commit(event.id, Effect.void)
          ),
        classify: { IdempotencyError: "isRetryable" },
        concurrency: 1,
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
      for (let i = 0; i < 60 && outcomes.length < 3; i++) yield* TestClock.adjust("50 millis")
      yield* stop(fiber)
      const [first] = outcomes
      assert.strictEqual(first?.message.eventId, "slow")
      assert.strictEqual(first?._tag === "Released" ? first.reason : first?._tag, "LeaseLost")
      // The line says why the extensions were not confirmed: the broker's last answer.
      assert.strictEqual(
        first?._tag === "Released" ? first.error?.message : undefined,
        "no lease extension was confirmed in time (the last: extension failed (injected)); the handler was interrupted"
      )
      assert.deepStrictEqual(
        outcomes.slice(1).map((o) => `${o.message.eventId} ${o._tag}`).sort(),
        ["fast Committed", "slow Committed"],
        "the replacement worker took the next messages"
      )
    }))

  it.effect("shutdown ends workers waiting for a delivery even when the source's take would never fail after close", () =>
    Effect.gen(function*() {
      // A source that has three messages and ignores close: the workers must stop taking by themselves.
      const source = scripted("endless", deliveries(3))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = recording(source, outcomes, { handle: () => Effect.void, concurrency: 4, drainTimeout: "1 hour" })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* TestClock.adjust("10 millis")
      assert.strictEqual(outcomes.length, 3)
      // Without the test clock moving, the drain must end on its own: no worker is left waiting.
      const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
      for (let i = 0; i < 10; i++) yield* Effect.yieldNow
      assert.isDefined(stopping.pollUnsafe(), "the drain ended with no handler running")
      assert.strictEqual(outcomes.length, 3)
    }))

  it.effect("the workers never call the source's take concurrently with itself", () =>
    Effect.gen(function*() {
      let taking = 0
      let overlapped = false
      let sequence = 0
      // Each take waits 10 ms for its message.
      const source = scripted(
        "slow-take",
        Effect.suspend(() => {
          if (++taking > 1) overlapped = true
          return Effect.sleep("10 millis").pipe(Effect.as(delivery(++sequence)), Effect.ensuring(Effect.sync(() => taking--)))
        })
      )
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = recording(source, outcomes, { handle: () => Effect.sleep("25 millis"), concurrency: 8 })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      for (let i = 0; i < 100; i++) yield* TestClock.adjust("5 millis")
      yield* stop(fiber)
      assert.isAbove(outcomes.length, 20)
      assert.isFalse(overlapped, "take ran concurrently with itself")
    }))
})

describe("engine: a batch's acks", () => {
  it.effect("BE-JOB-007: a batch's acks go through the source's ackAll at once; an ack it could not confirm (no reply) is sent again by itself, and an element's other command is sent by itself", () =>
    Effect.gen(function*() {
      const sent: Array<string> = []
      const withCommands = (n: number): Delivery.Delivery => ({
        ...delivery(n),
        ack: Effect.sync(() => void sent.push(`own ack e${n}`)),
        deadLetter: () => Effect.sync(() => void sent.push(`dead letter e${n}`))
      })
      // The broker confirms the first ack only.
      const source = scripted("acks", deliveries(3, withCommands), (acked) =>
        Effect.sync(() => {
          sent.push(`ackAll ${acked.map((d) => `e${d.sequence}`).join(",")}`)
          return acked.map((d, i) =>
            i === 0 ? undefined : new Delivery.SettleError({ command: "Ack", reason: "Timeout", message: `no reply for e${d.sequence}` })
          )
        }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = batchOf(source, {
        maxSize: 3,
        // The third element fails for good: it alone is dead-lettered, by its own command.
        handleBatch: (events) =>
          Effect.succeed(events.map((event) => (event.id === "e3" ? Result.fail(new Refused()) : Result.succeed(undefined)))),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      for (let i = 0; i < 100 && outcomes.length < 3; i++) yield* TestClock.adjust("10 millis")
      yield* stop(fiber)
      assert.deepStrictEqual(sent.sort(), ["ackAll e1,e2", "dead letter e3", "own ack e2"])
      const byId = new Map(outcomes.map((outcome) => [outcome.message.eventId, outcome]))
      assert.deepStrictEqual([...byId.keys()].sort(), ["e1", "e2", "e3"])
      assert.deepStrictEqual([byId.get("e1")?._tag, byId.get("e1")?.confirmed], ["Committed", true])
      assert.deepStrictEqual([byId.get("e2")?._tag, byId.get("e2")?.confirmed], ["Committed", true])
      assert.deepStrictEqual([byId.get("e3")?._tag, byId.get("e3")?.confirmed], ["DeadLettered", true])
    }))
})

describe("engine: a source's ackAll that misbehaves", () => {
  for (const [what, ackAll] of [
    ["gives fewer results than deliveries", () => Effect.succeed([undefined])],
    ["dies", () => Effect.die(new Error("ackAll exploded"))]
  ] as const) {
    it.effect(`an ackAll that ${what} leaves every ack of the batch unconfirmed, and the batch still ends in its outcomes`, () =>
      Effect.gen(function*() {
        const outcomes: Array<Outcome.Outcome> = []
        const consumer = batchOf(scripted("bad-acks", deliveries(2), ackAll), {
          maxSize: 2,
          handleBatch: allSucceed,
          onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        for (let i = 0; i < 100 && outcomes.length < 2; i++) yield* TestClock.adjust("10 millis")
        yield* stop(fiber)
        assert.deepStrictEqual(outcomes.map((o) => [o.message.eventId, o._tag, o.confirmed]).sort(), [["e1", "Committed", false], ["e2", "Committed", false]])
      }))
  }
})

describe("engine: a batch's onOutcome", () => {
  it.effect("BE-JOB-007: the elements' onOutcome hooks run side by side, each bounded by onOutcomeTimeout: one that hangs is cut alone", () =>
    Effect.gen(function*() {
      const reported: Array<string> = []
      const consumer = batchOf(scripted("hooks", deliveries(3)), {
        maxSize: 3,
        handleBatch: allSucceed,
        onOutcomeTimeout: "5 seconds",
        // Each hook takes a second; e2's never ends.
        onOutcome: (outcome) =>
          outcome.message.eventId === "e2"
            ? Effect.never
            : Effect.sleep("1 second").pipe(Effect.andThen(Effect.sync(() => reported.push(outcome.message.eventId ?? "?"))))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer))
      yield* TestClock.adjust("10 millis")
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(reported.sort(), ["e1", "e3"], "both hooks ended after one second: they ran side by side")
      // The hung hook holds the batch's slot until its bound, then the consumer goes on.
      yield* TestClock.adjust("5 seconds")
      yield* stop(fiber)
      assert.deepStrictEqual(reported.sort(), ["e1", "e3"])
    }))
})

class Refused extends Data.TaggedError("Refused")<{}> {}

/** A delivery of event `e<n>` whose commands all succeed. */
const delivery = (n: number): Delivery.Delivery => ({
  subject: "endless",
  payload: new TextEncoder().encode(JSON.stringify({ id: `e${n}`, time: new Date(0).toISOString() })),
  sequence: n,
  deliveryCount: 1,
  header: () => undefined,
  ack: Effect.void,
  nak: () => Effect.void,
  deadLetter: () => Effect.void,
  extend: Effect.void
})

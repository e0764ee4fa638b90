/**
 * InMemoryBroker promises JetStream's delivery semantics, so that a unit test over it sees what a
 * consumer sees on a real JetStream consumer. Here the same scenario runs through the engine's view
 * of a broker (`Source.open`, `take`, the delivery's commands) against the in-memory broker and
 * against `JetStreamSource` over a `TestStream`, on the real clock, and both traces must be equal.
 *
 * Failed before: `maxDeliver: -1` (JetStream's "no limit", TestStream's default) dropped every
 * message before its first delivery and told the engine MaxDeliver -1; `open` ignored its options,
 * so a MaxDeliver not above the attempts and `Sequential` ordering on a broker that hands out many
 * messages at once opened, where `JetStreamSource` refuses both (ContractMismatch); and a
 * sequential consumer over the in-memory broker ran a later message while an earlier one waited
 * for its retry (a, b, a), an order the real sequential consumer never produces.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, type Delivery, type Outcome, Retry, Source } from "@jetworker/core"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Clock, Data, DateTime, Duration, Effect, Fiber, Option, Schema, type Scope } from "effect"
import { TestClock } from "effect/testing"
import { InMemoryBroker, TestStream } from "../src/index.ts"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222", name: "testing-broker-parity" })

interface Harness {
  readonly source: Source.Source<NatsConnection.NatsConnection>
  readonly publish: (payload: string) => Effect.Effect<number, unknown>
}

interface Setup {
  readonly maxDeliver?: number
  /** The in-memory broker's MaxAckPending (TestStream's consumer has 1000). */
  readonly maxAckPending?: number
}

const harness = (
  kind: "memory" | "jetstream",
  setup: Setup
): Effect.Effect<Harness, unknown, NatsConnection.NatsConnection | Scope.Scope> =>
  kind === "memory"
    ? Effect.sync(() => {
      const broker = InMemoryBroker.make({ lease: "1 second", maxDeliver: setup.maxDeliver, maxAckPending: setup.maxAckPending })
      return { source: broker.source, publish: (payload) => broker.publish(payload) }
    })
    : Effect.map(TestStream.make({ ackWait: "1 second", maxDeliver: setup.maxDeliver ?? -1 }), (stream) => ({
      source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, captureMaxDeliveries: false }),
      publish: (payload) => stream.publish("x", payload, crypto.randomUUID())
    }))

const openOptions = (overrides: Partial<Source.OpenOptions> = {}): Source.OpenOptions => ({
  consumer: "worker",
  prefetch: 1,
  concurrency: 1,
  attempts: 1,
  ordering: "Unordered",
  ...overrides
})

const label = (d: Delivery.Delivery) => `${d.sequence}#${d.deliveryCount}`

/** A take bounded by `within`: the delivery's label, or "none". */
const takeWithin = (intake: Source.Intake, within: Duration.Input) =>
  Effect.map(Effect.timeoutOption(intake.take, within), Option.match({ onNone: () => "none", onSome: label }))

/** Whether opening succeeds, or the reason it is refused with. */
const opening = (h: Harness, options: Source.OpenOptions) =>
  h.source.open(options).pipe(
    Effect.match({ onFailure: (e) => [`refused ${e.reason}`], onSuccess: () => ["opened"] })
  )

/** Runs `scenario` against both brokers and returns both traces. */
const paired = (
  setup: Setup,
  scenario: (h: Harness) => Effect.Effect<ReadonlyArray<string>, unknown, NatsConnection.NatsConnection | Scope.Scope>,
  jetstreamSetup: Setup = setup
) =>
  Effect.gen(function*() {
    const memory = yield* Effect.scoped(Effect.flatMap(harness("memory", setup), scenario))
    const jetstream = yield* Effect.scoped(Effect.flatMap(harness("jetstream", jetstreamSetup), scenario))
    return { memory, jetstream }
  })

/** Opens a bare in-memory broker with `options` and says how it went. */
const openMemory = (options: InMemoryBroker.Options, open: Partial<Source.OpenOptions> = {}) =>
  Effect.scoped(InMemoryBroker.make(options).source.open(openOptions(open))).pipe(
    Effect.match({ onFailure: (e) => `refused ${e.reason}: ${e.message}`, onSuccess: (intake) => `opened, maxDeliver ${intake.maxDeliver}` })
  )

describe("InMemoryBroker behaves like the JetStream consumer (paired scenarios)", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("maxDeliver -1 (JetStream's 'no limit', TestStream's default) delivers the message and tells the engine there is no limit", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired({ maxDeliver: -1 }, (h) =>
          Effect.gen(function*() {
            const intake = yield* h.source.open(openOptions())
            yield* h.publish("a")
            return [yield* takeWithin(intake, "3 seconds"), `intake.maxDeliver=${intake.maxDeliver}`]
          }))
        assert.deepStrictEqual(jetstream, ["1#1", "intake.maxDeliver=undefined"])
        assert.deepStrictEqual(memory, jetstream)
      }))

    it.effect("a MaxDeliver that does not exceed the attempts is refused at open (ContractMismatch) by both", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired({ maxDeliver: 3 }, (h) => opening(h, openOptions({ attempts: 5 })))
        assert.deepStrictEqual(jetstream, ["refused ContractMismatch"])
        assert.deepStrictEqual(memory, jetstream)
      }))

    it.effect("Sequential ordering on a consumer that may hand out more than one message (MaxAckPending 1000) is refused at open by both", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired(
          { maxAckPending: 1_000 },
          (h) => opening(h, openOptions({ ordering: "Sequential" })),
          {}
        )
        assert.deepStrictEqual(jetstream, ["refused ContractMismatch"])
        assert.deepStrictEqual(memory, jetstream)
      }))

    // Found sound before the fix; kept as they are cheap.
    it.effect("sound: nak with a delay redelivers after the delay (not before), delivery count 2", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired({}, (h) =>
          Effect.gen(function*() {
            const intake = yield* h.source.open(openOptions())
            yield* h.publish("a")
            const d = yield* intake.take
            yield* d.nak(Duration.millis(600))
            const t0 = yield* Clock.currentTimeMillis
            const early = yield* takeWithin(intake, "450 millis")
            const again = yield* takeWithin(intake, "2 seconds")
            const after = (yield* Clock.currentTimeMillis) - t0
            return [label(d), `early:${early}`, again, after >= 550 && after < 1_000 ? "after the delay" : `after ${after} ms`]
          }))
        assert.deepStrictEqual(jetstream, ["1#1", "early:none", "1#2", "after the delay"])
        assert.deepStrictEqual(memory, jetstream)
      }))

    it.effect("sound: an unsettled message is redelivered once its ack wait runs out, delivery count 2", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired({}, (h) =>
          Effect.gen(function*() {
            const intake = yield* h.source.open(openOptions())
            yield* h.publish("a")
            const d = yield* intake.take
            const t0 = yield* Clock.currentTimeMillis
            const early = yield* takeWithin(intake, "800 millis")
            const again = yield* takeWithin(intake, "3 seconds")
            const after = (yield* Clock.currentTimeMillis) - t0
            return [label(d), `early:${early}`, again, after >= 900 && after < 2_500 ? "after the ack wait" : `after ${after} ms`]
          }))
        assert.deepStrictEqual(jetstream, ["1#1", "early:none", "1#2", "after the ack wait"])
        assert.deepStrictEqual(memory, jetstream)
      }))

    it.effect("sound: MaxDeliver 2 above 1 attempt: two deliveries, then the message is given up", () =>
      Effect.gen(function*() {
        const { jetstream, memory } = yield* paired({ maxDeliver: 2 }, (h) =>
          Effect.gen(function*() {
            const intake = yield* h.source.open(openOptions({ attempts: 1 }))
            yield* h.publish("a")
            const first = yield* takeWithin(intake, "3 seconds")
            const second = yield* takeWithin(intake, "3 seconds")
            const third = yield* takeWithin(intake, "3 seconds")
            return [first, second, third, `intake.maxDeliver=${intake.maxDeliver}`]
          }))
        assert.deepStrictEqual(jetstream, ["1#1", "1#2", "none", "intake.maxDeliver=2"])
        assert.deepStrictEqual(memory, jetstream)
      }))
  })
})

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

describe("InMemoryBroker's options and open contract", () => {
  it.effect("maxDeliver 0 (JetStream reads it as -1) is no limit; NaN, a fraction, -2 or Infinity are refused at open naming the value", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* openMemory({ lease: "1 second", maxDeliver: 0 }), "opened, maxDeliver undefined")
      assert.strictEqual(yield* openMemory({ lease: "1 second", maxDeliver: 5 }), "opened, maxDeliver 5")
      for (const bad of [Number.NaN, 2.5, -2, Number.POSITIVE_INFINITY]) {
        const result = yield* openMemory({ lease: "1 second", maxDeliver: bad })
        assert.strictEqual(result, `refused ContractMismatch: maxDeliver must be a positive integer, or -1 for no limit, got ${bad}`)
      }
      const badPending = yield* openMemory({ lease: "1 second", maxAckPending: 1.5 })
      assert.match(badPending, /^refused ContractMismatch: maxAckPending must be a positive integer/)
    }))

  it.effect("the refusal of a MaxDeliver not above the attempts names both and the fix", () =>
    Effect.gen(function*() {
      const result = yield* openMemory({ lease: "1 second", maxDeliver: 5 }, { attempts: 5 })
      assert.match(result, /^refused ContractMismatch: .*maxDeliver 5; it must exceed the retry policy's 5 attempts.*at least 6/)
    }))

  it.effect("maxAckPending 1: a new message waits until the one delivered is settled (also while it waits for its redelivery)", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "1 second", maxAckPending: 1 })
      yield* broker.publish("a")
      yield* broker.publish("b")
      const intake = yield* Effect.scoped(broker.source.open(openOptions()))
      const first = yield* intake.take
      const waiting = yield* Effect.forkChild(intake.take)
      yield* TestClock.adjust("100 millis")
      assert.isUndefined(waiting.pollUnsafe(), "b is held back while a is in flight")
      yield* first.nak(Duration.seconds(5))
      yield* TestClock.adjust("100 millis")
      assert.isUndefined(waiting.pollUnsafe(), "b is held back while a waits for its redelivery")
      yield* TestClock.adjust("5 seconds")
      const again = yield* Fiber.join(waiting)
      assert.strictEqual(label(again), "1#2")
      yield* again.ack
      assert.strictEqual(label(yield* intake.take), "2#1")
    }))

  it.effect("a sequential consumer keeps stream order across a retry (a, a, b): MaxAckPending defaults to 1 for Sequential", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      yield* broker.publish(JSON.stringify({ id: "a" }))
      yield* broker.publish(JSON.stringify({ id: "b" }))
      const ran: Array<string> = []
      const outcomes: Array<Outcome.Outcome> = []
      let failA = true
      const consumer = Consumer.make({
        name: "sequential-memory",
        source: broker.source,
        schema: Event,
        metadata,
        ordering: "sequential",
        handle: (event) =>
          Effect.suspend(() => {
            ran.push(event.id)
            if (event.id === "a" && failA) {
              failA = false
              return Effect.fail(new Flaky({ message: "once" }))
            }
            return Effect.void
          }),
        classify: { Flaky: "transient" },
        retry: Retry.exponential({ attempts: 3, base: "1 second", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Effect.exit(Consumer.run(consumer)))
      for (let step = 0; step < 200 && !broker.quiescent(); step++) yield* TestClock.adjust("100 millis")
      const ended = fiber.pollUnsafe()
      yield* Fiber.interrupt(fiber)
      assert.isUndefined(ended, `the consumer runs: ${String(ended)}`)
      assert.isTrue(broker.quiescent(), "every message settled")
      // JetStream with max_ack_pending 1 (what JetStreamSource demands for sequential ordering)
      // holds b back until a is acked.
      assert.deepStrictEqual(ran, ["a", "a", "b"])
    }))

  it.effect("a sequential consumer over an in-memory broker with maxAckPending above 1 fails to start (ContractMismatch)", () =>
    Effect.gen(function*() {
      const result = yield* openMemory({ lease: "1 second", maxAckPending: 10 }, { ordering: "Sequential" })
      assert.match(result, /^refused ContractMismatch: .*maxAckPending 10; sequential ordering needs 1/)
    }))
})

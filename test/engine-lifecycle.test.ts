import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, Deferred, Effect, Fiber, Ref, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (id: string, n: number) => JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { n } })

/** A plain consumer of `stream` whose handler succeeds at once. */
const consumerOptions = (stream: TestStream.TestStream) => ({
  name: stream.consumer,
  source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
  schema: Event,
  handle: () => Effect.void,
  classify: {}
})

describe("engine lifecycle", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("interruption lets a running handler finish within the drain budget and releases what is buffered", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const started = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const done = yield* Ref.make<ReadonlyArray<number>>([])
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          handle: (event) =>
            Effect.gen(function*() {
              yield* Deferred.succeed(started, undefined)
              yield* Deferred.await(release)
              yield* Ref.update(done, (xs) => [...xs, event.data.n])
            }),
          classify: {},
          concurrency: 1,
          prefetch: 3,
          drainTimeout: "10 seconds",
          onOutcome: log.record
        })
        for (let n = 1; n <= 3; n++) yield* stream.publish("a", job(`j${n}`, n), `j${n}`)
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* Deferred.await(started).pipe(Effect.timeout("10 seconds"))
        // Interrupt while the first handler runs; let it finish during the drain.
        const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(stopping).pipe(Effect.timeout("15 seconds"))
        const outcomes = yield* log.all
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
        assert.deepStrictEqual(yield* Ref.get(done), [1])
        // The two buffered messages were handed back (nak), not left to time out: a new instance
        // gets them long before the 30 s ack wait.
        const next = yield* OutcomeLog.make
        const again = yield* Effect.forkChild(Consumer.run(Consumer.make({ ...consumerOptions(stream), onOutcome: next.record })))
        const both = (all: ReadonlyArray<{ readonly message: { readonly sequence: number } }>) =>
          [2, 3].every((seq) => all.some((o) => o.message.sequence === seq))
        const rest = yield* next.waitUntil(both, "5 seconds", "the released messages")
        yield* Fiber.interrupt(again)
        // Whether nats.js had already buffered them (then naked) or not yet depends on pull timing;
        // either way they come back at once and commit. (NATS 2.9 may hand a naked message out twice,
        // once as a redelivery and once as new: harmless under idempotency, so not asserted against.)
        assert.isTrue(rest.every((o) => o._tag === "Committed"), JSON.stringify(rest.map((o) => [o._tag, o.message.sequence])))
      }))

    it.effect("a handler that outlives the drain budget is interrupted: rolled back, released, never acked", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const started = yield* Deferred.make<void>()
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          handle: () => Effect.andThen(Deferred.succeed(started, undefined), Effect.never),
          classify: {},
          concurrency: 1,
          drainTimeout: "300 millis",
          handlerTimeout: "1 minute",
          onOutcome: log.record
        })
        yield* stream.publish("a", job("hung", 1), "hung")
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* Deferred.await(started).pipe(Effect.timeout("10 seconds"))
        const before = yield* Clock.currentTimeMillis
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("10 seconds"))
        const took = (yield* Clock.currentTimeMillis) - before
        const outcomes = yield* log.all
        assert.strictEqual(outcomes.length, 1)
        const [outcome] = outcomes
        assert.strictEqual(outcome!._tag, "Released")
        assert.strictEqual(outcome!._tag === "Released" && outcome!.reason, "Interrupted")
        assert.isAtLeast(took, 300)
        assert.isBelow(took, 5_000, "the drain budget bounds shutdown")
        // Released with a nak, so another instance gets it at once (the ack wait is 30 s).
        const next = yield* OutcomeLog.make
        const again = yield* Effect.forkChild(Consumer.run(Consumer.make({ ...consumerOptions(stream), onOutcome: next.record })))
        const rest = yield* next.waitUntil((all) => all.length === 1, "5 seconds", "the released message")
        yield* Fiber.interrupt(again)
        assert.deepStrictEqual(rest.map((o) => [o._tag, o.message.deliveryCount]), [["Committed", 2]])
      }))

    it.effect("the lease keeper extends the ack wait while a handler runs longer than it", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "1 second" })
        const log = yield* OutcomeLog.make
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          // The workload, not a wait: a handler longer than two real ack waits on the server;
          // without extensions the server would redeliver meanwhile.
          handle: () => Effect.sleep("2500 millis"), // wait: the handler's own duration
          classify: {},
          retry: Retry.exponential({ attempts: 3 }),
          concurrency: 2,
          onOutcome: log.record
        })
        yield* stream.publish("a", job("long", 1), "long")
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const outcomes = yield* log.waitUntil((all) => all.length >= 1, "10 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => [o._tag, o.message.deliveryCount]), [["Committed", 1]])
        const info = yield* stream.info
        assert.strictEqual(info.num_redelivered, 0)
        assert.strictEqual(info.num_ack_pending, 0)
      }))
  })
})

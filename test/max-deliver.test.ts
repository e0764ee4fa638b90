/**
 * MaxDeliver has a defined, observable result (INT-NATS-002): a message whose every delivery went
 * unsettled (each holder died before settling it) is given up by the server at MaxDeliver, which
 * says so only in an advisory. The advisory is captured into a stream while no jetworker process
 * runs, and the consumer's source, once started, stores the message in the dead-letter stream
 * from it, counted and logged.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource, MaxDeliveries, NatsConnection } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Logger, Metric, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (id: string, n: number) => JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { n } })

const deadLetteredCount = (consumer: string) =>
  Effect.map(Metric.snapshot, (snapshots) =>
    snapshots
      .filter((m) => m.id === "jetworker.dead_lettered" && m.attributes?.consumer === consumer && m.attributes?.reason === "DeliveriesExhausted")
      .reduce((sum, m) => sum + Number((m.state as { readonly count?: number }).count ?? 0), 0))

describe("MaxDeliver (INT-NATS-002)", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("INT-NATS-002: redelivery, exhaustion and terminal result: a message whose every delivery went unsettled up to MaxDeliver is stored in the dead-letter stream from the captured advisory, counted and logged", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "1 second", maxDeliver: 2 })
        const { jetstream } = yield* NatsConnection.NatsConnection
        // As a worker's first start does: from now on the server's advisories are kept.
        yield* MaxDeliveries.ensure(stream.stream, stream.consumer)
        const seq = yield* stream.publish("a", job("j1", 1), "j1")
        // Two holders that took the message and died without settling it (delivery 1, then 2
        // after the ack wait): a raw pull that never acks.
        const raw = yield* Effect.promise(() => jetstream.consumers.get(stream.stream, stream.consumer))
        for (const expected of [1, 2]) {
          const msg = yield* Effect.promise(() => raw.next({ expires: 5_000 }))
          assert.strictEqual(msg?.info.deliveryCount, expected)
        }
        // A third pull, with no jetworker process running: the server gives up on the message
        // after the second ack wait; its advisory is captured all the same.
        assert.isNull(yield* Effect.promise(() => raw.next({ expires: 3_000 })))
        const { manager } = yield* NatsConnection.NatsConnection
        const captured = Effect.promise(() =>
          manager.streams.info(MaxDeliveries.captureStream(stream.stream, stream.consumer)).then((info) => info.state.messages))
        yield* Eventually.holds("the advisory captured", Effect.map(captured, (n) => n === 1), "5 seconds")
        const lines: Array<string> = []
        const capture = Logger.make(({ message }) => {
          lines.push(String(Array.isArray(message) ? message[0] : message))
        })
        const before = yield* deadLetteredCount(stream.consumer)
        const log = yield* OutcomeLog.make
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, lagInterval: "200 millis" }),
          schema: Event,
          handle: () => Effect.void,
          classify: {},
          retry: Retry.exponential({ attempts: 1 }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(Logger.layer([capture]))))
        // The worker, once started, stores the message the server gave up on.
        const dead = yield* Eventually.poll(
          "the dead letter",
          // The source creates the dead-letter stream when it opens.
          DeadLetter.list(stream.deadLetterStream).pipe(
            Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed([]))
          ),
          (all) => all.length > 0,
          { timeout: "15 seconds", interval: "200 millis" }
        )
        yield* Eventually.holds("the log line", Effect.sync(() => lines.includes("dead-letter.max-deliveries")), "5 seconds")
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(dead.length, 1)
        assert.deepInclude(dead[0]!, { sourceSequence: seq, reason: "DeliveriesExhausted", outcome: "DeadLettered", consumer: stream.consumer })
        assert.deepStrictEqual(yield* log.all, [], "the handler never ran: the server no longer delivers it")
        assert.strictEqual((yield* deadLetteredCount(stream.consumer)) - before, 1)
        assert.strictEqual(yield* captured, 0, "the advisory was handled and removed")
        const info = yield* stream.info
        assert.deepStrictEqual([info.num_pending, info.num_ack_pending], [0, 0])
      }))

    it.effect("INT-NATS-002: an advisory whose dead letter is already stored (the engine wrote it and died before acking, or the advisory was handled twice) only has its advisory removed: not counted, logged or reported as a new dead letter", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ maxDeliver: 2 })
        const { jetstream, manager } = yield* NatsConnection.NatsConnection
        yield* MaxDeliveries.ensure(stream.stream, stream.consumer)
        const seq = yield* stream.publish("a", job("j1", 1), "j1")
        // The dead letter is stored first (the same Nats-Msg-Id as the engine's own).
        const first = yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence: seq })
        assert.isFalse(first.duplicate)
        // Then the server's MaxDeliver advisory of the same message is captured.
        yield* Effect.promise(() =>
          jetstream.publish(
            MaxDeliveries.advisorySubject(stream.stream, stream.consumer),
            new TextEncoder().encode(JSON.stringify({ type: "io.nats.jetstream.advisory.v1.max_deliver", stream: stream.stream, consumer: stream.consumer, stream_seq: seq, deliveries: 2 }))
          )
        )
        const lines: Array<string> = []
        const capture = Logger.make(({ message }) => {
          lines.push(String(Array.isArray(message) ? message[0] : message))
        })
        const before = yield* deadLetteredCount(stream.consumer)
        const recovered = yield* MaxDeliveries.recoverCaptured({ stream: stream.stream, consumer: stream.consumer }).pipe(
          Effect.provide(Logger.layer([capture]))
        )
        assert.strictEqual((yield* deadLetteredCount(stream.consumer)) - before, 0, "one dead letter counted twice")
        assert.deepStrictEqual(recovered.map((r) => r.sequence), [], "nothing new was stored")
        assert.notInclude(lines, "dead-letter.max-deliveries")
        const count = (name: string) => Effect.promise(() => manager.streams.info(name).then((info) => info.state.messages))
        assert.strictEqual(yield* count(stream.deadLetterStream), 1, "one dead letter in the stream")
        assert.strictEqual(yield* count(MaxDeliveries.captureStream(stream.stream, stream.consumer)), 0, "the advisory was removed")
      }).pipe(Effect.scoped))
  })
})

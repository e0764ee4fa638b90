import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, OutcomeLog, TestStream } from "@jetworker/testing"
import { Context, Data, Effect, Fiber, Layer, Logger, Ref, Schema } from "effect"
import type { Delivery } from "@jetworker/core"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

const Event = Envelope.schema("test.event", Schema.Struct({ n: Schema.Number }))

class Boom extends Data.TaggedError("Boom")<{ readonly permanent: boolean }> {
  get isRetryable(): boolean {
    return !this.permanent
  }
}

/** A logger that keeps each message's text, and its layer (which replaces the default loggers). */
const captureLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push(String(Array.isArray(message) ? message[0] : message))
  })
  return { lines, layer: Logger.layer([logger]) }
}

/**
 * An intake on `stream` opened over a connection through a fault proxy to the real server (with
 * `prefetch`, logging into `logged`), with the proxy that can freeze or cut that connection.
 */
const openThroughProxy = (stream: TestStream.TestStream, prefetch: number) =>
  Effect.gen(function*() {
    const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } })
    const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}` }))
    const logged = captureLogs()
    const intake = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, captureMaxDeliveries: false })
      .open({ consumer: stream.consumer, prefetch, attempts: 3, ordering: "Unordered" })
      .pipe(Effect.provide(viaProxy), Effect.provide(logged.layer))
    // A round trip through the proxy: what the server sent before it has been read by the client.
    const { connection } = Context.get(viaProxy, NatsConnection.NatsConnection)
    const flushed = Effect.promise(() => connection.flush())
    return { proxy, intake, logged, flushed }
  })

/**
 * The pulls sent to `stream`'s consumer (their reply subjects, in the order the server read them),
 * as the server passes them on to any subscriber of the consumer's next-message subject. The server
 * serves a client's pull as it reads it, before it passes it on: a pull seen here is on the server.
 */
const tapPulls = (stream: TestStream.TestStream) =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const replies: Array<string> = []
    const tap = connection.subscribe(`$JS.API.CONSUMER.MSG.NEXT.${stream.stream}.${stream.consumer}`, {
      callback: (_, msg) => {
        if (msg.reply !== undefined) replies.push(msg.reply)
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => tap.unsubscribe()))
    // Known to the server before the intake's first pull.
    yield* Effect.promise(() => connection.flush())
    return replies
  })

/** The inbox of a pull's reply subject (each pull's reply is its inbox plus an id of its own). */
const inboxOf = (reply: string) => reply.slice(0, reply.lastIndexOf("."))

const envelope = (id: string, n: number) =>
  JSON.stringify({ id, type: "test.event", time: new Date().toISOString(), data: { n } })

describe("JetStreamSource", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a missing stream or consumer at start-up fails with the step that declares it; the durable defaults to the consumer's name", () =>
      Effect.gen(function*() {
        const open = (source: ReturnType<typeof JetStreamSource.make>, consumer: string) =>
          Effect.scoped(source.open({ consumer, prefetch: 1, attempts: 3, ordering: "Unordered" }))
        const noStream = yield* Effect.flip(open(JetStreamSource.make({ stream: "NO_SUCH_STREAM_JW" }), "shipper"))
        assert.strictEqual(noStream.reason, "StreamNotFound")
        assert.include(noStream.message, "stream NO_SUCH_STREAM_JW does not exist")
        assert.include(noStream.message, `Topology.ensureStream({ name: "NO_SUCH_STREAM_JW"`)
        const stream = yield* TestStream.make()
        // No consumer given: the durable is the opening consumer's name, which this stream lacks.
        const noConsumer = yield* Effect.flip(open(JetStreamSource.make({ stream: stream.stream }), "shipper"))
        assert.strictEqual(noConsumer.reason, "ConsumerNotFound")
        assert.include(noConsumer.message, `stream ${stream.stream} has no durable consumer shipper`)
        assert.include(noConsumer.message, `Topology.ensureConsumer({ stream: "${stream.stream}", name: "shipper" })`)
        // Named like the stream's consumer, the same source opens.
        const intake = yield* Effect.scoped(
          Effect.map(JetStreamSource.make({ stream: stream.stream }).open({ consumer: stream.consumer, prefetch: 1, attempts: 3, ordering: "Unordered" }), (intake) => intake.maxDeliver)
        )
        assert.isAbove(intake ?? Number.POSITIVE_INFINITY, 3)
      }))

    it.effect("settles valid, duplicate-free and malformed messages with their outcomes", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const log = yield* OutcomeLog.make
        const seen = yield* Ref.make<ReadonlyArray<number>>([])
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          handle: (event) =>
            Effect.gen(function*() {
              if (event.data.n < 0) return yield* new Boom({ permanent: true })
              yield* Ref.update(seen, (ns) => [...ns, event.data.n])
            }),
          classify: { Boom: "isRetryable" },
          retry: Retry.exponential({ attempts: 3, base: "10 millis" }),
          concurrency: 4,
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* stream.publish("a", envelope("e1", 1), "e1")
        yield* stream.publish("a", envelope("e2", 2), "e2")
        yield* stream.publish("a", "{not json", "bad1")
        yield* stream.publish("a", envelope("e3", -1), "e3")
        const outcomes = yield* log.waitUntil((all) => all.length === 4, "20 seconds")
        yield* Fiber.interrupt(fiber)
        const counts = OutcomeLog.countByTag(outcomes)
        assert.deepStrictEqual(counts, { Committed: 2, Duplicate: 0, Expired: 0, Rejected: 1, DeadLettered: 1, Released: 0 })
        assert.deepStrictEqual([...(yield* Ref.get(seen))].sort(), [1, 2])
        for (const outcome of outcomes) assert.isTrue(outcome.confirmed, `${outcome._tag} confirmed`)
        const dead = yield* DeadLetter.list(stream.deadLetterStream)
        assert.strictEqual(dead.length, 2)
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
        assert.strictEqual(info.num_pending, 0)
      }))

    it.effect("a consumer deleted while no pull is open ends the intake: a pull to a deleted consumer gets no answer at all, so a silent pull is followed by a check that the consumer exists", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        for (const n of [1, 2, 3, 4]) yield* stream.publish("a", envelope(`e${n}`, n), `e${n}`)
        // Heartbeats every 500 ms: a pull is silent after 1.5 s.
        const intake = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, pullExpires: "1 second" })
          .open({ consumer: stream.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
        // The first pull brought all four: the buffer is full and no pull is open on the server,
        // which would otherwise answer the deletion with a 409 (the case that always worked).
        yield* Eventually.holds("the four messages delivered", Effect.map(stream.info, (info) => info.num_ack_pending === 4))
        const connection = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => connection.manager.consumers.delete(stream.stream, stream.consumer))
        for (const n of [1, 2, 3, 4]) assert.strictEqual((yield* intake.take).sequence, n, "the buffered messages are still taken")
        // Taking them pulled again, from the deleted consumer.
        const ended = yield* Effect.flip(intake.take).pipe(
          Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.die(new Error("the intake never noticed the deleted consumer")) })
        )
        // The same reason as when an open pull hears of the deletion.
        assert.strictEqual(ended.reason, "ConsumerDeleted", ended.message)
        assert.include(ended.message, `${stream.stream}/${stream.consumer}: consumer deleted`)
      }).pipe(Effect.scoped))

    it.effect("BE-JOB-004: after a link that froze without breaking, the intake holds at most prefetch: a pull written off as silent may still be open on the server, so it is dropped there before the room is pulled again", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "60 seconds" })
        const prefetch = 10
        const pulls = yield* tapPulls(stream)
        // Pulls live 30 s, with heartbeats every 5 s: a pull is written off after 10.5 s of silence.
        const { flushed, logged, proxy } = yield* openThroughProxy(stream, prefetch)
        yield* Eventually.holds("the first pull waits on the server", Effect.map(stream.info, (info) => info.num_waiting === 1))
        yield* Eventually.holds("the first pull seen", Effect.sync(() => pulls.length > 0))
        const firstInbox = inboxOf(pulls[0] ?? "")
        // TCP stays up, nothing passes: the server keeps the pull, the intake hears nothing until
        // it writes the pull off, and the operator reads that in the log.
        yield* proxy.pause
        yield* Eventually.holds(
          "the pull written off",
          Effect.sync(() => logged.lines.some((line) => /no word from the server .* pulls are given up/.test(line))),
          "20 seconds"
        )
        yield* proxy.resume
        // The intake wrote the pull off during the freeze (its inbox with it) and checks the
        // consumer (after its pause, at most 5 s) before it pulls the room again, on a new inbox.
        yield* Eventually.holds(
          "the room pulled again after the freeze",
          Effect.sync(() => pulls.some((reply) => inboxOf(reply) !== firstInbox)),
          "20 seconds"
        )
        for (let n = 0; n < 4 * prefetch; n++) yield* stream.publish("a", envelope(`f${n}`, n), `f${n}`)
        yield* Eventually.holds("the intake's room is filled", Effect.map(stream.info, (info) => info.num_ack_pending >= prefetch))
        // A round trip through the intake's connection: a pull it sent with the first is on the
        // server now. Once no pull waits there, every pull has been filled: a second one (the
        // written-off pull still open, or another of the intake's) would have been handed its share.
        yield* flushed.pipe(Effect.timeout("5 seconds"))
        const info = yield* Eventually.poll(
          "the intake's room filled and no pull waiting",
          stream.info,
          (info) => info.num_ack_pending >= prefetch && info.num_waiting === 0,
          { timeout: "15 seconds" }
        )
        assert.strictEqual(info.num_ack_pending, prefetch, `handed out ${info.num_ack_pending} with prefetch ${prefetch}`)
      }).pipe(Effect.scoped), { timeout: 60_000 })

    it.effect("BE-JOB-004: after a reconnect the intake pulls its whole room again: a pull sent while disconnected is lost with the client's outbound buffer, and is not counted for ever", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "60 seconds" })
        const prefetch = 10
        for (let n = 0; n < 5; n++) yield* stream.publish("a", envelope(`r${n}`, n), `r${n}`)
        const { intake, logged, proxy, flushed } = yield* openThroughProxy(stream, prefetch)
        // The first pull (10) brought the 5 there are and stays open for the rest.
        yield* Eventually.holds("five delivered", Effect.map(stream.info, (info) => info.num_ack_pending === 5))
        // Sent is not yet read: on a loaded machine the fifth could still be in the proxy when it is
        // cut, and the takes below would wait for it for ever.
        yield* flushed.pipe(Effect.timeout("5 seconds"))
        yield* proxy.cut
        // Taking them frees room: the intake pulls it while disconnected, and that pull is lost.
        for (let n = 0; n < 5; n++) yield* intake.take
        yield* proxy.restore
        yield* Eventually.holds("reconnected", proxy.connections.pipe(Effect.map((n) => n === 1)), "10 seconds")
        for (let n = 5; n < 5 + 3 * prefetch; n++) yield* stream.publish("a", envelope(`r${n}`, n), `r${n}`)
        // The whole room is pulled again, well before two heartbeats (10.5 s) of silence.
        yield* Eventually.holds(
          `the intake holds prefetch (${prefetch}) again`,
          Effect.map(stream.info, (info) => info.num_ack_pending >= 5 + prefetch),
          "6 seconds"
        )
        // And no more: a pull that survived the reconnect was dropped before the room was pulled.
        // After a round trip through the intake's connection (a pull it sent with the room's is on
        // the server), once no pull waits there, every pull has been filled, that one included.
        yield* flushed.pipe(Effect.timeout("5 seconds"))
        const info = yield* Eventually.poll(
          "no pull waiting",
          stream.info,
          (info) => info.num_ack_pending >= 5 + prefetch && info.num_waiting === 0,
          { timeout: "15 seconds" }
        )
        assert.strictEqual(info.num_ack_pending, 5 + prefetch)
        assert.isTrue(logged.lines.some((line) => /reconnected; .* given up/.test(line)), logged.lines.join("\n"))
      }).pipe(Effect.scoped), { timeout: 60_000 })

    it.effect("ackAll acks a batch's deliveries at once, each confirmed on its own: an ack the broker cannot take fails alone, and a delivery of another source is acked by its own ack", () =>
      Effect.gen(function*() {
        const kept = yield* TestStream.make()
        const dropped = yield* TestStream.make()
        for (const n of [1, 2]) yield* kept.publish("a", envelope(`k${n}`, n), `k${n}`)
        yield* dropped.publish("a", envelope("d1", 1), "d1")
        const options = { prefetch: 2, attempts: 3, ordering: "Unordered" } as const
        const fromKept = yield* JetStreamSource.make({ stream: kept.stream, consumer: kept.consumer }).open({ ...options, consumer: kept.consumer })
        const fromDropped = yield* JetStreamSource.make({ stream: dropped.stream, consumer: dropped.consumer }).open({ ...options, consumer: dropped.consumer })
        const k1 = yield* fromKept.take
        const k2 = yield* fromKept.take
        const d1 = yield* fromDropped.take
        // Nobody answers the acks of a deleted consumer.
        const connection = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => connection.manager.consumers.delete(dropped.stream, dropped.consumer))
        let ownAcks = 0
        const foreign: Delivery.Delivery = {
          subject: k1.subject,
          payload: k1.payload,
          sequence: k1.sequence,
          deliveryCount: 1,
          header: () => undefined,
          ack: Effect.sync(() => void ownAcks++),
          nak: () => Effect.void,
          deadLetter: () => Effect.void,
          extend: Effect.void
        }
        const ackAll = fromKept.ackAll
        assert.isDefined(ackAll)
        if (ackAll === undefined) return
        const results = yield* ackAll([k1, d1, k2])
        assert.deepStrictEqual(results.map((error) => error?.reason), [undefined, "Unavailable", undefined])
        assert.strictEqual(results[1]?.command, "Ack")
        const info = yield* kept.info
        assert.strictEqual(info.num_ack_pending, 0, "both acks of the kept consumer were applied")
        assert.strictEqual(info.num_pending, 0)
        assert.deepStrictEqual(yield* ackAll([foreign]), [undefined])
        assert.strictEqual(ownAcks, 1)
        assert.deepStrictEqual(yield* ackAll([]), [])
      }).pipe(Effect.scoped))
  })
})

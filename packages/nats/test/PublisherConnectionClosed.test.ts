/**
 * A publish in flight when its connection closes for good (INT-NATS-007: a broken connection is
 * retried while the connection can come back; a closed one cannot). nats.js rejects every request
 * in flight with `RequestError` "connection closed", which `NatsError` maps to `Unknown`. Before:
 * the publish failed with that `Unknown` (final, saying nothing of the connection), and a publish
 * whose stream look-up was in flight failed with `StreamNotFound` "no stream captures subject …",
 * although the stream was there. Now both fail with `ConnectionClosed`, and at once: this publish
 * does not retry over a connection that cannot come back.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Eventually, FaultProxy, TestStream } from "@jetworker/testing"
import { Context, Effect, Fiber, Layer } from "effect"

const natsUrl = new URL(process.env.NATS_URL ?? "nats://127.0.0.1:4222")
const NatsLive = NatsConnection.layer({ servers: natsUrl.href })
const encoder = new TextEncoder()

/**
 * A connection of its own through a proxy whose replies are held back (requests reach the server,
 * answers wait): a new service object, so the publisher's cache of look-ups starts empty.
 */
const heldReplies = Effect.gen(function*() {
  const proxy = yield* FaultProxy.make({ target: { host: natsUrl.hostname, port: Number(natsUrl.port || 4222) } })
  const context = yield* Layer.build(NatsConnection.layer({ servers: `nats://${proxy.address.host}:${proxy.address.port}` }))
  yield* proxy.pauseToClient
  return { proxy, service: Context.get(context, NatsConnection.NatsConnection) }
})

describe("Publisher: the connection closes while a publish waits for its answer", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-007: the publish in flight fails at once with ConnectionClosed, not a final Unknown", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { service } = yield* heldReplies
        const publishing = yield* Publisher.publish(stream.subject("x"), encoder.encode("1"), {
          msgId: "closed-1",
          stream: stream.stream,
          timeout: "10 seconds"
        }).pipe(Effect.provideService(NatsConnection.NatsConnection, service), Effect.flip, Effect.forkChild)
        // Stored, its PubAck held back: the result is unknown to the publisher when the connection closes.
        yield* Eventually.holds("the publish reached the stream", Effect.map(stream.stored, (n) => n === 1), "10 seconds")
        const closedAt = Date.now()
        yield* Effect.promise(() => service.connection.close())
        const error = yield* Fiber.join(publishing).pipe(Effect.timeout("5 seconds"))
        assert.strictEqual(error.reason, "ConnectionClosed", error.message)
        assert.include(error.message, "closed")
        // The counted retries' delays alone add up to more than a second: none was made.
        assert.isBelow(Date.now() - closedAt, 1_000)
        assert.strictEqual(yield* stream.stored, 1)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a stream look-up in flight fails with ConnectionClosed, never 'no stream captures subject'", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { proxy, service } = yield* heldReplies
        const sent = (yield* proxy.stats).bytesToTarget
        const publishing = yield* Publisher.publish(stream.subject("x"), encoder.encode("1"), {
          msgId: "closed-2",
          timeout: "10 seconds"
        }).pipe(Effect.provideService(NatsConnection.NatsConnection, service), Effect.flip, Effect.forkChild)
        // The look-up (STREAM.NAMES) went out; its answer is held back.
        yield* Eventually.holds("the look-up reached the server", Effect.map(proxy.stats, (stats) => stats.bytesToTarget > sent), "10 seconds")
        const closedAt = Date.now()
        yield* Effect.promise(() => service.connection.close())
        const error = yield* Fiber.join(publishing).pipe(Effect.timeout("5 seconds"))
        assert.strictEqual(error.reason, "ConnectionClosed", error.message)
        assert.notInclude(error.message, "no stream captures")
        assert.isBelow(Date.now() - closedAt, 1_000)
        assert.strictEqual(yield* stream.stored, 0, "the publish itself was never sent")
      }).pipe(Effect.scoped))
  })
})

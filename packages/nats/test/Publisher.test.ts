import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Eventually, FaultProxy, TestStream } from "@jetworker/testing"
import { Context, Effect, Fiber, Layer } from "effect"

const natsUrl = new URL(process.env.NATS_URL ?? "nats://127.0.0.1:4222")
const NatsLive = NatsConnection.layer({ servers: natsUrl.href })
const encoder = new TextEncoder()

describe("Publisher", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("publishes in flight on a connection are bounded by maxPublishesInFlight; the others wait their turn", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const proxy = yield* FaultProxy.make({ target: { host: natsUrl.hostname, port: Number(natsUrl.port || 4222) } })
        const proxied = yield* Layer.build(NatsConnection.layer({
          servers: `nats://${proxy.address.host}:${proxy.address.port}`,
          maxPublishesInFlight: 2
        }))
        // Replies held back: every publish sent stays in flight until they flow again.
        yield* proxy.pauseToClient
        const publishing = yield* Effect.forEach(
          [1, 2, 3, 4, 5],
          (n) => Publisher.publish(stream.subject("x"), encoder.encode(`${n}`), { msgId: `m${n}`, stream: stream.stream, timeout: "10 seconds" }),
          { concurrency: "unbounded" }
        ).pipe(Effect.provideService(NatsConnection.NatsConnection, Context.get(proxied, NatsConnection.NatsConnection)), Effect.forkChild)
        yield* Eventually.holds("two publishes reached the stream", Effect.map(stream.stored, (n) => n === 2), "10 seconds")
        // The other three wait for a permit: a bounded wait that nothing more is stored is the assertion.
        yield* Eventually.holds("a third publish", Effect.map(stream.stored, (n) => n > 2), "500 millis").pipe(Effect.flip)
        yield* proxy.resume
        const acks = yield* Fiber.join(publishing).pipe(Effect.timeout("20 seconds"))
        assert.deepStrictEqual(acks.map((ack) => ack.duplicate), [false, false, false, false, false])
        assert.strictEqual(yield* stream.stored, 5)
      }))

    it.effect("without a stream, a publish expects the stream that captures its subject; a subject no stream captures says so", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const first = yield* Publisher.publish(stream.subject("found"), encoder.encode("1"), { msgId: "found-1" })
        assert.strictEqual(first.stream, stream.stream)
        assert.isFalse(first.duplicate)
        // The same id again: the stream found (now from the cache) deduplicates it.
        const again = yield* Publisher.publish(stream.subject("found"), encoder.encode("1"), { msgId: "found-1" })
        assert.strictEqual(again.stream, stream.stream)
        assert.isTrue(again.duplicate)
        assert.strictEqual(yield* stream.stored, 1)
        const nowhere = `nowhere.${stream.stream.toLowerCase()}.x`
        const error = yield* Effect.flip(Publisher.publish(nowhere, encoder.encode("1"), { msgId: "lost-1", attempts: 1 }))
        assert.strictEqual(error.reason, "StreamNotFound")
        assert.include(error.message, `no stream captures subject ${nowhere}`)
      }))

    it.effect("INT-NATS-007: a header value that mentions Nats-Msg-Id does not hide the id: NATS 2.9 takes the first occurrence in the header block, so the id goes first", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const options = { msgId: "noted-1", stream: stream.stream, headers: [["X-Note", "the client sets Nats-Msg-Id"]] as const }
        const first = yield* Publisher.publish(stream.subject("noted"), encoder.encode("1"), options)
        const again = yield* Publisher.publish(stream.subject("noted"), encoder.encode("1"), options)
        assert.isFalse(first.duplicate)
        assert.isTrue(again.duplicate, "the retry with the same id was stored again")
        assert.strictEqual(yield* stream.stored, 1)
      }))

    it.effect("a stream found for a subject and since replaced: the publish that finds it gone asks again within its attempt and is stored in the new one", () =>
      Effect.gen(function*() {
        const { manager } = yield* NatsConnection.NatsConnection
        const tag = Math.random().toString(36).slice(2, 10)
        const subjects = [`moved.${tag}.>`]
        const subject = `moved.${tag}.x`
        const [first, second] = [`MOVED_A_${tag}`.toUpperCase(), `MOVED_B_${tag}`.toUpperCase()]
        const remove = (name: string) => Effect.promise(() => manager.streams.delete(name).catch(() => false))
        yield* Effect.addFinalizer(() => Effect.andThen(remove(first), remove(second)))
        yield* Effect.promise(() => manager.streams.add({ name: first, subjects }))
        assert.strictEqual((yield* Publisher.publish(subject, encoder.encode("1"), { msgId: "moved-1" })).stream, first)
        yield* remove(first)
        yield* Effect.promise(() => manager.streams.add({ name: second, subjects }))
        // The cached stream is gone: the refusal costs no attempt (PublisherStaleStream.test.ts).
        assert.strictEqual((yield* Publisher.publish(subject, encoder.encode("2"), { msgId: "moved-2", attempts: 1 })).stream, second)
        assert.strictEqual((yield* Publisher.publish(subject, encoder.encode("3"), { msgId: "moved-3" })).stream, second)
      }).pipe(Effect.scoped))

    it.effect("an invalid maxPublishesInFlight is refused when the connection is made", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(Layer.build(NatsConnection.layer({ servers: natsUrl.href, maxPublishesInFlight: 0 })))
        assert.include(error.message, "maxPublishesInFlight must be an integer from 1 to 100000")
      }))
  })
})

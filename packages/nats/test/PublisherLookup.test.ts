import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream"
import type { Msg } from "@nats-io/transport-node"
import { Duration, Effect, Result } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })
const encoder = new TextEncoder()
const tag = () => Math.random().toString(36).slice(2, 10)

const namesReply = (streams: ReadonlyArray<string>) =>
  encoder.encode(JSON.stringify({ type: "io.nats.jetstream.api.v1.stream_names_response", total: streams.length, offset: 0, limit: 1024, streams }))

const unavailableReply = encoder.encode(JSON.stringify({
  type: "io.nats.jetstream.api.v1.stream_names_response",
  error: { code: 503, err_code: 10008, description: "JetStream system temporarily unavailable" }
}))

/**
 * The connection with a JetStream API of the test's own for the stream look-up (the real server
 * answers `$JS.API`): `answer` replies to each `STREAM.NAMES` request (by its 1-based number), or
 * leaves it unanswered with `undefined`. Publishes still go to the real server. A new service
 * object, so the publisher's per-connection cache of look-ups starts empty.
 */
const withLookUp = (answer: (request: number) => Uint8Array | undefined) =>
  Effect.gen(function*() {
    const shape = yield* NatsConnection.NatsConnection
    const prefix = `lookup.${tag()}.API`
    const requests: Array<number> = []
    const responder = shape.connection.subscribe(`${prefix}.STREAM.NAMES`, {
      callback: (_, msg: Msg) => {
        requests.push(Date.now())
        const reply = answer(requests.length)
        if (reply !== undefined) msg.respond(reply)
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => responder.unsubscribe()))
    const manager: JetStreamManager = yield* Effect.promise(() =>
      jetstreamManager(shape.connection, { apiPrefix: prefix, checkAPI: false, timeout: shape.apiTimeoutMillis })
    )
    return { service: { ...shape, manager }, requests }
  })

describe("Publisher: the look-up of the stream that captures a subject", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-007: a look-up answered 'JetStream system temporarily unavailable' (10008) is asked again within the publish's attempts; the publish is stored once", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { service, requests } = yield* withLookUp((n) => n === 1 ? unavailableReply : namesReply([stream.stream]))
        const ack = yield* Publisher.publish(stream.subject("x"), encoder.encode("1"), { msgId: "lookup-1", attempts: 3, timeout: "5 seconds" }).pipe(
          Effect.provideService(NatsConnection.NatsConnection, service)
        )
        assert.strictEqual(ack.stream, stream.stream)
        assert.isFalse(ack.duplicate)
        assert.strictEqual(requests.length, 2)
        assert.strictEqual(yield* stream.stored, 1)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a look-up nobody answers is bounded by the attempt's timeout and asked again; a look-up that never answers fails as Timeout within the republish horizon", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        // The first look-up unanswered: the attempt's 1 s bounds it (not the 5 s API timeout).
        const once = yield* withLookUp((n) => n === 1 ? undefined : namesReply([stream.stream]))
        const options = { msgId: "lookup-2", attempts: 3, timeout: "1 second" } as const
        const started = Date.now()
        const ack = yield* Publisher.publish(stream.subject("x"), encoder.encode("1"), options).pipe(
          Effect.provideService(NatsConnection.NatsConnection, once.service)
        )
        assert.strictEqual(ack.stream, stream.stream)
        assert.strictEqual(once.requests.length, 2)
        assert.isBelow(Date.now() - started, Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon(options))))
        // Never answered: every attempt asks once, and the publish gives up within its horizon.
        const never = yield* withLookUp(() => undefined)
        const bounded = { msgId: "lookup-3", attempts: 2, timeout: "500 millis" } as const
        const start = Date.now()
        const error = yield* Effect.flip(
          Publisher.publish(stream.subject("y"), encoder.encode("2"), bounded).pipe(Effect.provideService(NatsConnection.NatsConnection, never.service))
        )
        const elapsed = Date.now() - start
        assert.strictEqual(error.reason, "Timeout")
        assert.isTrue(error.isRetryable)
        assert.include(error.message, stream.subject("y"))
        assert.strictEqual(never.requests.length, 2)
        // The horizon (2 × 500 ms + 120 ms), plus leeway for a loaded machine's scheduling.
        assert.isBelow(elapsed, Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon(bounded))) + 500)
        assert.strictEqual(yield* stream.stored, 1)
      }).pipe(Effect.scoped))

    it.effect("a look-up that finds no stream for the subject is final: the publish fails at once with StreamNotFound, asking once", () =>
      Effect.gen(function*() {
        const { service, requests } = yield* withLookUp(() => namesReply([]))
        const subject = `lookup.${tag()}.nowhere`
        const error = yield* Effect.flip(
          Publisher.publish(subject, encoder.encode("1"), { msgId: "lookup-4", attempts: 5 }).pipe(
            Effect.provideService(NatsConnection.NatsConnection, service)
          )
        )
        assert.strictEqual(error.reason, "StreamNotFound")
        assert.isFalse(error.isRetryable)
        assert.include(error.message, `no stream captures subject ${subject}`)
        assert.strictEqual(requests.length, 1)
      }).pipe(Effect.scoped))
  })
})

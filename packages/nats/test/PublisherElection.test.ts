/**
 * A publish with default options rides out a stream-leader election. A leader cannot be killed on
 * a single node, so a stand-in answers for the stream: "no responders" (the stream has no leader)
 * or 503/10008 ("temporarily unavailable") at once for the first 3 s, then a PubAck. The default
 * attempts (5, 100 ms doubling) alone gave up after about 1.4 s.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream"
import { headers as natsHeaders, type Msg } from "@nats-io/transport-node"
import { Duration, Effect, Result } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })
const encoder = new TextEncoder()
const tag = () => Math.random().toString(36).slice(2, 10)

const outageMillis = 3_000

type Refusal = "NoResponders" | "Unavailable"

const refuse = (msg: Msg, refusal: Refusal, stream: string) =>
  refusal === "NoResponders"
    // What the server sends when nobody listens: an empty reply with status 503.
    ? msg.respond(new Uint8Array(0), { headers: natsHeaders(503, "No Responders") })
    : msg.respond(encoder.encode(JSON.stringify({
      stream,
      error: { code: 503, err_code: 10008, description: "JetStream system temporarily unavailable" }
    })))

/**
 * A stand-in stream on its own subject, refusing every publish made within `outageMillis` of the
 * first (forever with `Infinity`), then storing it (a PubAck); and a JetStream API of the test's
 * own whose stream look-up names that stream, so a publish nobody answered stays a retryable
 * `NoResponders` (a leader election), not a final `StreamNotFound`.
 */
const withOutage = (refusal: Refusal, outage: number) =>
  Effect.gen(function*() {
    const shape = yield* NatsConnection.NatsConnection
    const stream = `ELECTION_${tag().toUpperCase()}`
    const subject = `election.${tag()}.x`
    const prefix = `election.${tag()}.API`
    const requests: Array<{ readonly at: number; readonly id: string | undefined }> = []
    const publishes = shape.connection.subscribe(subject, {
      callback: (_, msg: Msg) => {
        const at = Date.now()
        requests.push({ at, id: msg.headers?.get("Nats-Msg-Id") })
        if (at - requests[0]!.at < outage) refuse(msg, refusal, stream)
        else msg.respond(encoder.encode(JSON.stringify({ stream, seq: 1 })))
      }
    })
    const lookUps = shape.connection.subscribe(`${prefix}.STREAM.NAMES`, {
      callback: (_, msg: Msg) => {
        msg.respond(encoder.encode(JSON.stringify({
          type: "io.nats.jetstream.api.v1.stream_names_response",
          total: 1,
          offset: 0,
          limit: 1024,
          streams: [stream]
        })))
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => (publishes.unsubscribe(), lookUps.unsubscribe())))
    const manager: JetStreamManager = yield* Effect.promise(() =>
      jetstreamManager(shape.connection, { apiPrefix: prefix, checkAPI: false, timeout: shape.apiTimeoutMillis })
    )
    return { service: { ...shape, manager }, stream, subject, requests }
  })

describe("Publisher: a publish through a stream-leader election", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    for (const refusal of ["NoResponders", "Unavailable"] as const) {
      it.effect(`INT-NATS-007: with default options, a publish answered at once with ${refusal} for ${outageMillis} ms (a leader election) is sent again with the same id until the PubAck, within the republish horizon`, () =>
        Effect.gen(function*() {
          const { requests, service, stream, subject } = yield* withOutage(refusal, outageMillis)
          const msgId = `election-${tag()}`
          const ack = yield* Publisher.publish(subject, encoder.encode("1"), { msgId, stream }).pipe(
            Effect.provideService(NatsConnection.NatsConnection, service)
          )
          assert.strictEqual(ack.stream, stream)
          assert.strictEqual(ack.seq, 1)
          assert.isAbove(requests.length, 5, "more attempts than the default 5 were made, by time")
          assert.deepStrictEqual(new Set(requests.map((request) => request.id)), new Set([msgId]))
          const last = requests[requests.length - 1]!.at - requests[0]!.at
          assert.isAtLeast(last, outageMillis)
          assert.isAtMost(last, Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon({}, service.apiTimeoutMillis))))
        }).pipe(Effect.scoped))
    }

    it.effect("INT-NATS-007: an outage that does not end fails with the retryable NoResponders, the last attempt still ending within the republish horizon", () =>
      Effect.gen(function*() {
        const { requests, service, stream, subject } = yield* withOutage("NoResponders", Number.POSITIVE_INFINITY)
        const options = { attempts: 2, timeout: "1 second" } as const
        const horizon = Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon(options)))
        const started = Date.now()
        const error = yield* Effect.flip(
          Publisher.publish(subject, encoder.encode("1"), { ...options, msgId: "election-never", stream }).pipe(
            Effect.provideService(NatsConnection.NatsConnection, service)
          )
        )
        const elapsed = Date.now() - started
        assert.strictEqual(error.reason, "NoResponders")
        assert.isTrue(error.isRetryable)
        assert.include(error.message, `stream ${stream} captures subject ${subject} but did not answer`)
        // Answered at once: more attempts than the two counted, while one more still fit the horizon.
        assert.isAbove(requests.length, 2)
        assert.deepStrictEqual(new Set(requests.map((request) => request.id)), new Set(["election-never"]))
        // The horizon, plus leeway for a loaded machine's scheduling.
        assert.isBelow(elapsed, horizon + 500)
      }).pipe(Effect.scoped))
  })
})

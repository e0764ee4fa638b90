import { assert, describe, it, layer } from "@effect/vitest"
import { NatsConnection, NatsError, Publisher } from "@jetworker/nats"
import { JetStreamApiError, jetstreamManager } from "@nats-io/jetstream"
import { headers as natsHeaders } from "@nats-io/transport-node"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })
const encoder = new TextEncoder()
const tag = () => Math.random().toString(36).slice(2, 10)

/** A JetStream API error reply as nats-server writes it (server/errors.json). */
const apiError = (status: number, errCode: number, description: string) => ({ code: status, err_code: errCode, description })

// nats-server's codes for "not now": 10008 while the meta group elects a leader, 10163 while a
// new stream leader catches up (2.11 pre-releases), 10167 when a stream's ingest queue is full.
const notNow = [
  apiError(503, 10008, "JetStream system temporarily unavailable"),
  apiError(503, 10163, "expected last sequence per subject temporarily unavailable"),
  apiError(429, 10167, "too many requests")
]

describe("NatsError: JetStream temporarily unavailable", () => {
  it("the API codes that mean 'try again' are a retryable Unavailable; codes of a lasting state stay final", () => {
    for (const error of notNow) {
      const mapped = NatsError.fromUnknown("stream info ORDERS", new JetStreamApiError(error))
      assert.strictEqual(mapped.reason, "Unavailable", `${error.err_code}`)
      assert.isTrue(mapped.isRetryable, `${error.err_code} is retryable`)
      assert.strictEqual(mapped.code, error.err_code)
      assert.strictEqual(mapped.message, error.description)
    }
    const lasting = [
      apiError(503, 10076, "JetStream not enabled"),
      apiError(503, 10023, "insufficient resources"),
      apiError(500, 10118, "stream is offline"),
      apiError(400, 10071, "wrong last sequence: 4"),
      apiError(503, 10063, "expected stream sequence does not match")
    ]
    for (const error of lasting) {
      const mapped = NatsError.fromUnknown("publish orders.x", new JetStreamApiError(error))
      assert.strictEqual(mapped.reason, "ApiError", `${error.err_code}`)
      assert.isFalse(mapped.isRetryable, `${error.err_code} is final`)
      assert.strictEqual(mapped.code, error.err_code)
    }
  })

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a stream info answered 'JetStream system temporarily unavailable' (10008, a leader election) fails with a retryable Unavailable", () =>
      Effect.gen(function*() {
        const { connection } = yield* NatsConnection.NatsConnection
        // A JetStream API of the test's own (the real server answers $JS.API): nats.js reads the
        // reply and rejects as it does with the server's.
        const prefix = `unavailable.${tag()}.API`
        const responder = connection.subscribe(`${prefix}.>`, {
          callback: (_, msg) => {
            msg.respond(encoder.encode(JSON.stringify({ type: "io.nats.jetstream.api.v1.stream_info_response", error: notNow[0] })))
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => responder.unsubscribe()))
        const manager = yield* Effect.promise(() => jetstreamManager(connection, { apiPrefix: prefix, checkAPI: false, timeout: 5_000 }))
        const error = yield* Effect.flip(NatsError.tryPromise("stream info ORDERS", () => manager.streams.info("ORDERS")))
        assert.strictEqual(error.reason, "Unavailable")
        assert.isTrue(error.isRetryable)
        assert.strictEqual(error.code, 10008)
        assert.include(error.message, "temporarily unavailable")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a publish answered 'temporarily unavailable' or 'too many requests' is sent again with the same id until the stream stores it", () =>
      Effect.gen(function*() {
        const { connection } = yield* NatsConnection.NatsConnection
        const subject = `unavailable.${tag()}.x`
        const stream = "UNAVAILABLE_TEST"
        // A stand-in for the stream: "not now" twice, then the PubAck.
        const ids: Array<string | undefined> = []
        const responder = connection.subscribe(subject, {
          callback: (_, msg) => {
            ids.push(msg.headers?.get("Nats-Msg-Id"))
            const refusal = notNow[ids.length === 1 ? 0 : 2]
            if (ids.length <= 2 && refusal !== undefined) {
              const status = natsHeaders(refusal.code, refusal.description)
              msg.respond(encoder.encode(JSON.stringify({ stream, error: refusal })), refusal.code === 429 ? { headers: status } : {})
            } else msg.respond(encoder.encode(JSON.stringify({ stream, seq: 1 })))
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => responder.unsubscribe()))
        const ack = yield* Publisher.publish(subject, encoder.encode("1"), { msgId: "unavailable-1", stream, attempts: 3, timeout: "5 seconds" })
        assert.strictEqual(ack.stream, stream)
        assert.strictEqual(ack.seq, 1)
        assert.deepStrictEqual(ids, ["unavailable-1", "unavailable-1", "unavailable-1"])
      }).pipe(Effect.scoped))
  })
})

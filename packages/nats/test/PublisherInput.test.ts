import { assert, describe, layer } from "@effect/vitest"
import { Envelope, Outbox } from "@jetworker/core"
import { NatsConnection, type NatsError, Publisher } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { DateTime, Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })
const encoder = new TextEncoder()

describe("Publisher", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-007: a subject that is not a literal NATS subject (a wildcard, an empty token) is refused before it is sent, for good, with Outbox.problems' wording", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const subjects = [
          stream.subject("*"),
          stream.subject(">"),
          stream.subject("orders.*.eu"),
          `${stream.subjectPrefix}..b`,
          stream.subject("a."),
          stream.subject("a b")
        ]
        for (const subject of subjects) {
          for (const options of [{ stream: stream.stream }, {}]) {
            const error: NatsError.NatsError = yield* Effect.flip(
              Publisher.publish(subject, encoder.encode("{}"), { msgId: "subject-1", ...options })
            )
            assert.deepInclude(error, { reason: "ApiError", operation: `publish ${subject}` })
            assert.isFalse(error.isRetryable, `${subject}: ${error.message}`)
            const [expected] = Outbox.problems({ subject, id: "subject-1", payload: new Uint8Array() })
            assert.strictEqual(error.message, expected)
          }
        }
        assert.strictEqual(yield* stream.stored, 0)
        // A literal subject still goes through.
        const ack = yield* Publisher.publish(stream.subject("a.b"), encoder.encode("{}"), { msgId: "subject-2", stream: stream.stream })
        assert.strictEqual(ack.seq, 1)
      }).pipe(Effect.scoped))

    it.effect("publishEnvelope: an envelope JSON cannot write (bigint data, an expiry outside the Date range) fails with a NatsError when run, never throws, and sends nothing", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const time = DateTime.makeUnsafe(1_700_000_000_000)
        const unwritable = [
          ["BigInt", { id: "e-big", type: "order.placed", time, data: { amount: 10n } }],
          ["Invalid time value", { id: "e-far", type: "order.placed", time, expiresAt: DateTime.addDuration(time, "200000000 days"), data: {} }]
        ] as const
        for (const [cause, event] of unwritable) {
          let built: Effect.Effect<unknown, NatsError.NatsError, NatsConnection.NatsConnection> | undefined
          assert.doesNotThrow(() => {
            built = Publisher.publishEnvelope(stream.subject("placed"), event, { stream: stream.stream })
          })
          const error = yield* Effect.flip(built!)
          assert.strictEqual(error.reason, "ApiError")
          assert.isFalse(error.isRetryable)
          assert.include(error.message, event.id)
          assert.include(error.message, cause)
        }
        assert.strictEqual(yield* stream.stored, 0)
        const event = yield* Envelope.make({ type: "order.placed", id: "e-ok", data: { amount: 10 }, ttl: "Infinity" })
        const ack = yield* Publisher.publishEnvelope(stream.subject("placed"), event, { stream: stream.stream })
        assert.strictEqual(ack.seq, 1)
      }).pipe(Effect.scoped))
  })
})

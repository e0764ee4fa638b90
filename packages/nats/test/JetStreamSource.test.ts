import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, Effect, Fiber, Ref, Schema } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

const Event = Envelope.schema("test.event", Schema.Struct({ n: Schema.Number }))

class Boom extends Data.TaggedError("Boom")<{ readonly permanent: boolean }> {
  get isRetryable(): boolean {
    return !this.permanent
  }
}

const envelope = (id: string, n: number) =>
  JSON.stringify({ id, type: "test.event", time: new Date().toISOString(), data: { n } })

describe("JetStreamSource", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
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
  })
})

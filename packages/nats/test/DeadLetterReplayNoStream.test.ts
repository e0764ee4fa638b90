/**
 * `DeadLetter.replay` of a dead letter no stream takes any more. Before, it failed with nats.js's
 * own words for a publish nobody answered, "jetstream is not enabled" (`NoResponders`, retryable),
 * of a server that runs JetStream: `jetworker dlq replay` printed only that. It now looks up the
 * subject's stream, as `Publisher.publish` does: none is a final `StreamNotFound` that names the
 * subject and what became of the source stream; the dead letter is kept.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  name: "jetworker-test-deadletter-replay-no-stream"
})

/** A fresh source stream with one dead letter (#1 of its dead-letter stream) of subject `<prefix>.a`. */
const oneDeadLetter = Effect.gen(function*() {
  const stream = yield* TestStream.make({ prefix: "REPLAYNS" })
  const sequence = yield* stream.publish("a", `{"id":"A"}`, "A")
  yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence })
  const kept = Effect.map(DeadLetter.list(stream.deadLetterStream), (letters) => letters.length)
  return { stream, kept }
})

describe("DeadLetter.replay when no stream captures the subject", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("the source stream was deleted: StreamNotFound, final, naming the subject and the missing source stream; the dead letter is kept", () =>
      Effect.gen(function*() {
        const { stream, kept } = yield* oneDeadLetter
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.delete(stream.stream))

        const error = yield* Effect.flip(DeadLetter.replay(stream.deadLetterStream, 1))
        assert.strictEqual(error.reason, "StreamNotFound", error.message)
        assert.isFalse(error.isRetryable)
        assert.strictEqual(
          error.message,
          `no stream captures subject ${stream.subject("a")} (source stream ${stream.stream} does not exist)`
        )
        assert.notInclude(error.message.toLowerCase(), "jetstream is not enabled")
        assert.strictEqual(yield* kept, 1)
      }).pipe(Effect.scoped), 30_000)

    it.effect("the source stream no longer captures the subject: StreamNotFound, naming its subjects now; the dead letter is kept", () =>
      Effect.gen(function*() {
        const { stream, kept } = yield* oneDeadLetter
        const { manager } = yield* NatsConnection.NatsConnection
        const info = yield* Effect.promise(() => manager.streams.info(stream.stream))
        const moved = `${stream.subjectPrefix}.b`
        yield* Effect.promise(() => manager.streams.update(stream.stream, { ...info.config, subjects: [moved] }))

        const error = yield* Effect.flip(DeadLetter.replay(stream.deadLetterStream, 1))
        assert.strictEqual(error.reason, "StreamNotFound", error.message)
        assert.strictEqual(
          error.message,
          `no stream captures subject ${stream.subject("a")} (source stream ${stream.stream} captures only ${moved})`
        )
        assert.strictEqual(yield* kept, 1)
      }).pipe(Effect.scoped), 30_000)
  })
})

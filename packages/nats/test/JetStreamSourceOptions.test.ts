/**
 * `JetStreamSource`'s durations (`settleTimeout`, `lagInterval`, `pullExpires`) are checked when
 * the source opens, before any request to the server: a value that cannot work fails the open with
 * a `SourceError` naming the option and the value given, instead of unconfirmed acks, a flood of
 * consumer-info requests or a consumer that dies on its first pull.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, Envelope } from "@jetworker/core"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Duration, Effect, Schema } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

// A stream that does not exist: a check made after the first request would fail with
// StreamNotFound instead of naming the option.
const missing = "NO_SUCH_STREAM_JW_OPTIONS"

const open = (options: JetStreamSource.Options, consumer = "options-test") =>
  Effect.scoped(Effect.asVoid(JetStreamSource.make(options).open({ consumer, prefetch: 1, attempts: 3, ordering: "Unordered" })))

// Values a typed config cannot produce but a cast one can (`as Duration.Input`).
const cast = (value: unknown) => value as Duration.Input

const refused: ReadonlyArray<readonly [Partial<JetStreamSource.Options>, string]> = [
  [{ settleTimeout: 0 }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got 0"],
  [{ settleTimeout: "-1 second" }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"-1 second\""],
  [{ settleTimeout: Duration.infinity }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got Infinity"],
  [{ settleTimeout: "30 days" }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"30 days\""],
  [{ settleTimeout: cast("5 secs") }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"5 secs\""],
  [{ settleTimeout: Number.NaN }, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got NaN"],
  [{ lagInterval: 0 }, "lagInterval must be a duration from 100 milliseconds to 2147483647 ms, got 0"],
  [{ lagInterval: "10 millis" }, "lagInterval must be a duration from 100 milliseconds to 2147483647 ms, got \"10 millis\""],
  [{ lagInterval: "Infinity" }, "lagInterval must be a duration from 100 milliseconds to 2147483647 ms, got \"Infinity\""],
  [{ pullExpires: Duration.infinity }, "pullExpires must be a duration from 1 second to 2147483647 ms, got Infinity"],
  [{ pullExpires: Number.NaN }, "pullExpires must be a duration from 1 second to 2147483647 ms, got NaN"],
  [{ pullExpires: { seconds: Number.NaN } }, "pullExpires must be a duration from 1 second to 2147483647 ms, got { seconds: NaN }"],
  [{ pullExpires: "500 millis" }, "pullExpires must be a duration from 1 second to 2147483647 ms, got \"500 millis\""],
  [{ pullExpires: cast("soon") }, "pullExpires must be a duration from 1 second to 2147483647 ms, got \"soon\""]
]

describe("JetStreamSource options", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a duration that cannot work fails the open with the option's name and the value given, before any request to the server", () =>
      Effect.gen(function*() {
        for (const [options, text] of refused) {
          // `make` itself never throws, whatever it is given.
          const source = JetStreamSource.make({ stream: missing, ...options })
          const error = yield* Effect.flip(
            Effect.scoped(Effect.asVoid(source.open({ consumer: "options-test", prefetch: 1, attempts: 3, ordering: "Unordered" })))
          )
          assert.strictEqual(error._tag, "SourceError", JSON.stringify(options))
          assert.strictEqual(error.reason, "ContractMismatch", `${JSON.stringify(options)}: ${error.message}`)
          assert.include(error.message, text)
          assert.include(error.message, `JetStreamSource ${missing}`)
        }
      }))

    it.effect("the bounds themselves are accepted: the source opens", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        yield* open({ stream: stream.stream, consumer: stream.consumer, settleTimeout: "1 millis", lagInterval: "100 millis", pullExpires: "1 second" })
        yield* open({ stream: stream.stream, consumer: stream.consumer, settleTimeout: 2 ** 31 - 1, lagInterval: 2 ** 31 - 1, pullExpires: 2 ** 31 - 1 })
      }))
  })

  it.effect("Consumer.run fails with the same SourceError, and no connection is needed to find it", () =>
    Effect.gen(function*() {
      const consumer = Consumer.make({
        name: "options-test",
        source: JetStreamSource.make({ stream: missing, settleTimeout: 0 }),
        schema: Envelope.schema("test.event", Schema.Struct({ n: Schema.Number })),
        handle: () => Effect.void,
        classify: {}
      })
      // A connection that was never made: touching it is a defect, not the typed failure.
      const untouched = new Proxy({}, {
        get: (_target, property) => {
          throw new Error(`the connection was used (${String(property)}) before the options were checked`)
        }
      }) as NatsConnection.Shape
      const error = yield* Effect.flip(Consumer.run(consumer)).pipe(Effect.provideService(NatsConnection.NatsConnection, untouched))
      assert.strictEqual(error._tag, "SourceError")
      assert.include(error.message, "settleTimeout must be a duration from 1 millisecond to 2147483647 ms, got 0")
    }))
})

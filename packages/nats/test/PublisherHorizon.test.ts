import { assert, describe, it, layer } from "@effect/vitest"
import { NatsConnection, NatsError, Publisher } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Duration, Effect, Result } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

const timeoutProblem = (shown: string) =>
  `timeout must be a duration from 1 millis to ${Publisher.maxTimeoutMillis} millis (about 24.8 days), such as "5 seconds", got ${shown}`

describe("Publisher.republishHorizon", () => {
  it("is every attempt's timeout plus the longest delays between them", () => {
    // 5 attempts of 5 s, and 4 delays of at most 120, 240, 480 and 960 ms (jitter included).
    assert.strictEqual(Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon())), 26_800)
    assert.strictEqual(Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon({ attempts: 2, timeout: "1 second" }))), 2_120)
    assert.strictEqual(Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon({ attempts: 1 }, 2_000))), 2_000)
  })

  it("options publish would refuse are a failure naming the option and the value, never a throw", () => {
    const cases: ReadonlyArray<readonly [Parameters<typeof Publisher.republishHorizon>[0], string]> = [
      [{ timeout: "banana" as Duration.Input }, timeoutProblem(`"banana"`)],
      [{ timeout: Number.NaN }, timeoutProblem("NaN")],
      [{ timeout: "-5 seconds" }, timeoutProblem(`"-5 seconds"`)],
      [{ timeout: Duration.infinity }, timeoutProblem("Infinity")],
      [{ attempts: 0 }, "attempts must be an integer from 1 to 100, got 0"],
      [{ attempts: Number.NaN }, "attempts must be an integer from 1 to 100, got NaN"]
    ]
    for (const [options, message] of cases) {
      let result: Result.Result<Duration.Duration, NatsError.NatsError> | undefined
      assert.doesNotThrow(() => {
        result = Publisher.republishHorizon(options)
      }, undefined, undefined, JSON.stringify(options))
      assert.isTrue(result !== undefined && Result.isFailure(result), `${JSON.stringify(options)}: ${String(result)}`)
      if (result === undefined || Result.isSuccess(result)) continue
      assert.instanceOf(result.failure, NatsError.NatsError)
      assert.deepInclude(result.failure, { reason: "ApiError", operation: "republish horizon", message })
      assert.isFalse(result.failure.isRetryable)
    }
  })

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("checkHorizon fails with a NatsError naming a timeout that is not a duration, instead of dying", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const error = yield* Effect.flip(Publisher.checkHorizon(stream.stream, { timeout: "soon" as Duration.Input }))
        assert.deepInclude(error, { _tag: "NatsError", reason: "ApiError", message: timeoutProblem(`"soon"`) })
        // Good options still compare the window: the test stream keeps the default 2 minutes.
        const check = yield* Publisher.checkHorizon(stream.stream, { attempts: 2, timeout: "1 second" })
        assert.deepStrictEqual([Duration.toMillis(check.horizon), check.covered], [2_120, true])
      }).pipe(Effect.scoped))
  })
})

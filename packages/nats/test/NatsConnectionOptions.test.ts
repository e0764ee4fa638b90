/**
 * `NatsConnection`'s settings are checked before connecting: a duration nats.js cannot use
 * (unparsable, NaN, negative, infinite, longer than a timer holds) and a server list with no server
 * in it fail at once with a typed error naming the option and the value given, instead of API
 * calls that time out in 1 ms, a first connection that "could not connect" within 2 ms, a drain
 * that never waits, or a silent connection to nats.js's default 127.0.0.1:4222.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { ConfigProvider, Duration, Effect, Layer } from "effect"

// Nothing listens there: a setting that is not checked first ends in "could not connect".
const nowhere = "nats://127.0.0.1:1"

const refusal = (options: NatsConnection.Options) =>
  Effect.flip(Layer.build(NatsConnection.layer(options))).pipe(Effect.scoped, Effect.timeout("10 seconds"))

// Values a typed config cannot produce but a cast one can (`as Duration.Input`).
const cast = (value: unknown) => value as Duration.Input

describe("NatsConnection options", () => {
  it.live("a duration nats.js cannot use is refused before connecting, naming the option and the value given", () =>
    Effect.gen(function*() {
      for (const [options, text] of [
        [{ apiTimeout: "30 days" }, "apiTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"30 days\""],
        [{ apiTimeout: Duration.infinity }, "apiTimeout must be a duration from 1 millisecond to 2147483647 ms, got Infinity"],
        [{ apiTimeout: -1 }, "apiTimeout must be a duration from 1 millisecond to 2147483647 ms, got -1"],
        [{ apiTimeout: 0 }, "apiTimeout must be a duration from 1 millisecond to 2147483647 ms, got 0"],
        [{ apiTimeout: cast("5 secs") }, "apiTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"5 secs\""],
        [{ connectTimeout: "30 days" }, "connectTimeout must be a duration from 1 millisecond to 2147483647 ms, got \"30 days\""],
        [{ connectTimeout: Number.POSITIVE_INFINITY }, "connectTimeout must be a duration from 1 millisecond to 2147483647 ms, got Infinity"],
        [{ connectTimeout: -1 }, "connectTimeout must be a duration from 1 millisecond to 2147483647 ms, got -1"],
        [{ drainTimeout: Number.NaN }, "drainTimeout must be a duration from 0 to 2147483647 ms, got NaN"],
        [{ drainTimeout: "-1 second" }, "drainTimeout must be a duration from 0 to 2147483647 ms, got \"-1 second\""],
        [{ reconnectTimeWait: "Infinity" }, "reconnectTimeWait must be a duration from 0 to 2147483647 ms, got \"Infinity\""],
        [{ reconnectTimeWait: [Number.NaN, 0] as const }, "reconnectTimeWait must be a duration from 0 to 2147483647 ms, got [NaN, 0]"],
        [{ pingInterval: cast("5 secs") }, "pingInterval must be from 1 second to 10 minutes, got \"5 secs\""],
        [{ pingInterval: Number.NaN }, "pingInterval must be from 1 second to 10 minutes, got NaN"]
      ] as const) {
        const error = yield* refusal({ servers: nowhere, ...options })
        assert.strictEqual(error._tag, "NatsError", JSON.stringify(options))
        assert.include(error.message, text)
        assert.isFalse(error.isRetryable, error.message)
      }
    }))

  it.live("maxReconnectAttempts other than -1 (for ever) or a whole number of 0 or more is refused, naming the value", () =>
    Effect.gen(function*() {
      for (const value of [Number.NaN, 1.5, -2, Number.POSITIVE_INFINITY]) {
        const error = yield* refusal({ servers: nowhere, maxReconnectAttempts: value })
        assert.include(error.message, `maxReconnectAttempts must be -1 (for ever) or an integer from 0 to 1000000, got ${value}`)
        assert.isFalse(error.isRetryable, error.message)
      }
      for (const value of [-1, 0, 10]) {
        const error = yield* refusal({ servers: nowhere, maxReconnectAttempts: value })
        assert.include(error.message, "could not connect to nats://127.0.0.1:1", String(value))
      }
    }))

  it.live("the bounds themselves are accepted: zero waits to reconnect and to drain, and timeouts of 1 ms and 2147483647 ms", () =>
    Effect.gen(function*() {
      // Accepted settings reach the connection attempt: nothing listens at `nowhere`.
      const accepted: ReadonlyArray<Partial<NatsConnection.Options>> = [
        { reconnectTimeWait: 0, drainTimeout: 0, apiTimeout: 2 ** 31 - 1, connectTimeout: "1 millis" },
        { reconnectTimeWait: 2 ** 31 - 1, drainTimeout: 2 ** 31 - 1, apiTimeout: "1 millis", connectTimeout: 2 ** 31 - 1 }
      ]
      for (const options of accepted) {
        const error = yield* refusal({ servers: nowhere, ...options })
        assert.include(error.message, "could not connect to nats://127.0.0.1:1", JSON.stringify(options))
      }
    }))

  it.live("no server (an empty list, an empty or blank string, only commas) is refused instead of connecting to 127.0.0.1:4222", () =>
    Effect.gen(function*() {
      for (const servers of [[], "", "  ", " , ", ["", " "]]) {
        const error = yield* refusal({ servers })
        assert.include(error.message, "servers is empty", JSON.stringify(servers))
        assert.include(error.message, "NATS_URL", JSON.stringify(servers))
        assert.isFalse(error.isRetryable)
      }
    }))

  it.live("a NATS_URL of only commas and blanks is refused too; empty entries of a list are dropped", () =>
    Effect.gen(function*() {
      const fromEnv = (env: Record<string, string>) =>
        Effect.flip(Layer.build(NatsConnection.layerConfig({ connectTimeout: "2 seconds" }))).pipe(
          Effect.scoped,
          Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env })),
          Effect.timeout("10 seconds")
        )
      // (`NATS_URL=""` is unset to Effect's ConfigProvider, as every empty variable: the default.)
      for (const url of [",", " , ", " ,, "]) {
        const error = yield* fromEnv({ NATS_URL: url })
        assert.include(error.message, "servers is empty", JSON.stringify(url))
        assert.include(error.message, "NATS_URL", JSON.stringify(url))
      }
      // The empty entries are dropped, and the servers left are the ones tried.
      const error = yield* fromEnv({ NATS_URL: `${nowhere},, ` })
      assert.include(error.message, "could not connect to nats://127.0.0.1:1")
    }))
})

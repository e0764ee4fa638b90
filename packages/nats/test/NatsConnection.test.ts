import { assert, describe, it } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { Effect, Layer } from "effect"

describe("NatsConnection", () => {
  it.live("a first connection that fails says where it tried and what to set, without the credentials in the URL", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(
        Layer.build(NatsConnection.layer({ servers: "nats://worker:s3cret@127.0.0.1:1", connectTimeout: "2 seconds" }))
      ).pipe(Effect.scoped, Effect.timeout("20 seconds"))
      assert.include(error.message, "could not connect to nats://127.0.0.1:1")
      assert.include(error.message, "Set NATS_URL")
      assert.notInclude(error.message, "s3cret")
      assert.isTrue(error.isRetryable)
    }))

  it("server addresses are shown without credentials: with or without a scheme, with an @ in the password, in a list", () => {
    assert.strictEqual(NatsConnection.describeServers("nats://alice:s3cret@127.0.0.1:4222"), "nats://127.0.0.1:4222")
    assert.strictEqual(NatsConnection.describeServers("alice:s3cret@127.0.0.1:4222"), "127.0.0.1:4222")
    assert.strictEqual(NatsConnection.describeServers("nats://alice:p@ss@127.0.0.1:4222"), "nats://127.0.0.1:4222")
    assert.strictEqual(NatsConnection.describeServers("tls://token@a:4222, b:4222"), "tls://a:4222, b:4222")
    assert.strictEqual(NatsConnection.describeServers(["nats://127.0.0.1:4222", "u:p@[::1]:4222"]), "nats://127.0.0.1:4222, [::1]:4222")
  })

  it.effect("pingInterval and maxPingsOut out of range are refused, naming the option", () =>
    Effect.gen(function*() {
      for (const [options, text] of [
        [{ pingInterval: "100 millis" }, "pingInterval must be from 1 second to 10 minutes"],
        [{ pingInterval: "1 hour" }, "pingInterval must be from 1 second to 10 minutes"],
        [{ maxPingsOut: 0 }, "maxPingsOut must be an integer from 1 to 100"],
        [{ maxPingsOut: 1.5 }, "maxPingsOut must be an integer from 1 to 100"]
      ] as const) {
        const error = yield* Effect.flip(Layer.build(NatsConnection.layer({ servers: "nats://127.0.0.1:1", ...options }))).pipe(Effect.scoped)
        assert.include(error.message, text)
      }
    }))
})

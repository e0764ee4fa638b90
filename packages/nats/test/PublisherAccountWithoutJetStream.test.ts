/**
 * A publish from an account without JetStream, on a server that runs it. The stream look-up is
 * answered with an API error (10039, "jetstream not enabled for account"), which said "no stream
 * captures subject ...", as if the stream were missing: an operator would go looking for a stream
 * that exists, in another account. The server's own words are kept now.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { NatsServer } from "@jetworker/testing"
import { Effect, Layer } from "effect"

describe("Publisher from an account without JetStream", () => {
  it.live("keeps the server's words (not 'no stream captures subject'), final", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({
        config: [
          "accounts {",
          "  APP: { jetstream: enabled, users: [{ user: app, password: app-pw }] }",
          "  PLAIN: { users: [{ user: plain, password: plain-pw }] }",
          "}"
        ].join("\n")
      })
      const nats = yield* Layer.build(
        NatsConnection.layer({ servers: `nats://plain:plain-pw@127.0.0.1:${server.port}`, apiTimeout: "2 seconds" })
      )
      const error = yield* Effect.flip(
        Effect.provide(Publisher.publish("orders.created", new Uint8Array(), { msgId: "o-1", attempts: 1 }), nats)
      )
      assert.notInclude(error.message, "no stream captures subject", error.message)
      assert.match(error.message.toLowerCase(), /jetstream not enabled for account/, error.message)
      assert.strictEqual(error.code, 10039, error.message)
      assert.isFalse(error.isRetryable)
    }).pipe(Effect.scoped), 30_000)
})

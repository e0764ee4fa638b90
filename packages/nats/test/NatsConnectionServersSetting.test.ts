/**
 * `serversSetting`: a tool whose servers come from its own flag (the CLI's `--server`) has the next
 * steps of a failed connection name that flag, not a worker's `NATS_URL` and servers option; a value
 * that cannot be named in one line is refused before connecting. Against real loopback ports.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, type NatsError } from "@jetworker/nats"
import { Effect, Layer, Redacted } from "effect"
import * as Net from "node:net"

/** A loopback port nothing listens on (taken, then given back). */
const closedPort = Effect.callback<number>((resume) => {
  const listener = Net.createServer()
  listener.listen(0, "127.0.0.1", () => {
    const port = (listener.address() as Net.AddressInfo).port
    listener.close(() => resume(Effect.succeed(port)))
  })
})

const failure = (options: NatsConnection.Options) =>
  Effect.flip(
    Layer.build(NatsConnection.layer({ connectTimeout: "1 second", maxReconnectAttempts: 0, ...options }))
  ).pipe(Effect.scoped, Effect.timeout("15 seconds"))

const namesOnly = (error: NatsError.NatsError, setting: string) => {
  assert.include(error.message, setting, error.message)
  assert.notInclude(error.message, "servers option", error.message)
  assert.notInclude(error.message, "NATS_URL", error.message)
}

describe("NatsConnection serversSetting", () => {
  it.live("a refused connection's next step names the given setting", () =>
    Effect.gen(function*() {
      const port = yield* closedPort
      const error = yield* failure({ servers: `nats://127.0.0.1:${port}`, serversSetting: "--server" })
      assert.strictEqual(error.reason, "ConnectionRefused")
      assert.include(error.message, "Set --server to where it runs")
      namesOnly(error, "--server")
    }), 30_000)

  it.live("without it, a worker's settings are named, as before", () =>
    Effect.gen(function*() {
      const port = yield* closedPort
      const error = yield* failure({ servers: `nats://127.0.0.1:${port}` })
      assert.include(error.message, "Set NATS_URL, or the servers option, to where it runs")
    }), 30_000)

  it.effect("no servers, or URL credentials that clash with other credentials: the message names the given setting", () =>
    Effect.gen(function*() {
      const empty = yield* failure({ servers: " , ", serversSetting: "--server" })
      assert.include(empty.message, "set --server to the server URLs")
      namesOnly(empty, "--server")
      const clash = yield* failure({
        servers: "nats://alice:pw@127.0.0.1:4222",
        token: Redacted.make("other"),
        serversSetting: "--server"
      })
      assert.include(clash.message, "either in the URL (--server) or in the other settings")
      assert.notInclude(clash.message, "servers option")
    }))

  it.effect("a setting that is blank, longer than 100 characters or more than one line is refused before connecting, naming serversSetting", () =>
    Effect.gen(function*() {
      for (const serversSetting of ["", "  ", "x".repeat(101), "--server\nSet evil"]) {
        const error = yield* failure({ servers: "nats://127.0.0.1:4222", serversSetting })
        assert.strictEqual(error.reason, "ApiError")
        assert.include(error.message, "serversSetting must be one line of 1 to 100 characters")
      }
    }))
})

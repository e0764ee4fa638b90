/**
 * A worker whose NATS is behind a proxy that resets connections while the server is not there
 * yet (a load balancer with no backend during a rollout) waits for it at start-up, as for a
 * refused connection, instead of failing at once: the reset is a passing state. Real NATS behind a
 * loopback `FaultProxy` that resets every new connection until it is restored, under a managed
 * lifecycle whose start-up deadline bounds the wait.
 */
import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { NatsConnection, NatsError } from "@jetworker/nats"
import { Eventually, FaultProxy } from "@jetworker/testing"
import { Effect, Fiber, Layer, Logger, Result } from "effect"

const natsUrl = new URL(process.env.NATS_URL ?? "nats://127.0.0.1:4222")

describe("NatsConnection at start-up", () => {
  it.live("connections reset before the server is there: start-up waits (startup.waiting), and connects once they pass", () =>
    Effect.gen(function*() {
      const proxy = yield* FaultProxy.make({ target: { host: natsUrl.hostname, port: Number(natsUrl.port || 4222) } })
      yield* proxy.cut
      const lines: Array<{ readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => void lines.push({ message: entry.message, annotations: entry.annotations }))
      const lifecycle = yield* Lifecycle.makeManaged({
        budget: Result.getOrThrow(Lifecycle.makeBudget({})),
        startupTimeout: "30 seconds"
      })
      const connecting = yield* Effect.forkChild(
        Layer.build(NatsConnection.layer({ servers: `nats://${proxy.address.host}:${proxy.address.port}`, connectTimeout: "1 second" })).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.provide(Logger.layer([logger]))
        )
      )
      // Before, the first reset failed the start-up at once (reason Unknown).
      yield* Eventually.poll(
        "a startup.waiting line for the reset",
        Effect.sync(() => lines.filter((l) => l.message === "startup.waiting")),
        (waiting) => waiting.length > 0 || connecting.pollUnsafe() !== undefined,
        { timeout: "10 seconds", interval: "50 millis" }
      )
      const early = connecting.pollUnsafe()
      assert.isUndefined(early, `start-up ended while the connections were reset: ${JSON.stringify(early)}`)
      const waiting = lines.find((l) => l.message === "startup.waiting")!
      assert.strictEqual(waiting.annotations.dependency, "nats")
      assert.include(String(waiting.annotations.error), "reset the connection")
      yield* proxy.restore
      const context = yield* Fiber.join(connecting).pipe(Effect.timeout("20 seconds"))
      const { connection } = yield* NatsConnection.NatsConnection.pipe(Effect.provideContext(context))
      assert.isFalse(connection.isClosed())
      const failure = NatsError.fromUnknown("connect", Object.assign(new Error("connect ECONNRESET"), { code: "ECONNRESET" }))
      assert.isTrue(failure.isRetryable)
    }).pipe(Effect.scoped), 60_000)
})

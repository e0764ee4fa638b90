import { assert, describe, it } from "@effect/vitest"
import { HealthServer } from "@jetworker/node"
import { Duration, Effect, Exit } from "effect"

const readiness = () => ({ ready: true, phase: "running" as const, components: [] })

describe("HealthServer", () => {
  it.live("a maxEventLoopLag that is not positive and finite is refused before listening, naming the option (0 fails every liveness probe)", () =>
    Effect.gen(function*() {
      for (const maxEventLoopLag of [0, "0 millis", Duration.seconds(-5), Duration.infinity] as const) {
        const exit = yield* HealthServer.make({ port: 0, host: "127.0.0.1", maxEventLoopLag, readiness }).pipe(
          Effect.scoped,
          Effect.exit
        )
        assert.isTrue(Exit.isFailure(exit), String(maxEventLoopLag))
        assert.include(
          String(Exit.isFailure(exit) ? exit.cause : ""),
          "HealthServer.make: maxEventLoopLag must be a positive, finite duration"
        )
      }
    }))
})

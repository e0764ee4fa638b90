/**
 * `worker.ready`'s `startupMs` is a duration: a step of the wall clock during start-up (NTP
 * stepping a drifted host, a VM resumed) must not be counted in it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { Duration, Effect, Layer } from "effect"
import { capturingStdout } from "./support/stdout.ts"

describe("Worker", () => {
  it.live("a wall-clock step forward during start-up is not counted in worker.ready's startupMs", () =>
    Effect.gen(function*() {
      const realNow = Date.now
      const { lines, result } = yield* capturingStdout(
        Worker.run(Effect.void, {
          settings: {
            healthPort: "off",
            // Far past the step, so that the start-up deadline (on the wall clock) is not what is tested.
            startupTimeout: Duration.minutes(10),
            budget: Duration.seconds(3),
            readinessGrace: Duration.zero,
            close: Duration.millis(500),
            telemetry: Duration.millis(500),
            reserve: Duration.millis(500)
          },
          readyWhen: "started",
          // Building the resources, the system clock is stepped one minute forward.
          layer: Layer.effectDiscard(Effect.sync(() => {
            Date.now = () => realNow() + 60_000
          }))
        })
      ).pipe(Effect.ensuring(Effect.sync(() => {
        Date.now = realNow
      })))
      assert.strictEqual(result, Worker.exitCodes.success, JSON.stringify(lines))
      const ready = lines.filter((l) => l.message === "worker.ready")
      assert.strictEqual(ready.length, 1, JSON.stringify(lines))
      assert.isAtLeast(Number(ready[0]!.startupMs), 0)
      assert.isBelow(Number(ready[0]!.startupMs), 10_000, JSON.stringify(ready[0]))
    }))
})

/**
 * `Worker.settingsProblems` holds every check `Worker.run` makes on its settings (and
 * `Worker.readSettings` the reading too), so that `jetworker config check` can make the same ones.
 *
 * Before: the checks were written inline in `Worker.run`, which stopped at the first; nothing else
 * could ask for them, and `HEALTH_PORT=abc` read as `NaN`, refused without the value given.
 */
import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { ConfigProvider, Duration, Effect } from "effect"

const fromEnv = (env: Record<string, string>) =>
  Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))

describe("Worker.settingsProblems and Worker.readSettings", () => {
  it.effect("the defaults have no problem, and readSettings gives their budget", () =>
    Effect.gen(function*() {
      const read = yield* Worker.readSettings().pipe(fromEnv({}))
      assert.deepStrictEqual(Worker.settingsProblems(read.settings), [])
      assert.strictEqual(read.budget.totalMillis, 25_000)
    }))

  it.effect("every problem is found, in the order run checks them, each naming the variable and the value", () =>
    Effect.gen(function*() {
      const failed = yield* Worker.readSettings().pipe(
        fromEnv({
          HEALTH_HOST: "localhost:8080",
          LOG_BUFFER_BYTES: "1000",
          HEALTH_MAX_EVENT_LOOP_LAG: "0 seconds",
          STARTUP_TIMEOUT: "Infinity",
          SHUTDOWN_BUDGET: "5 seconds"
        }),
        Effect.flip
      )
      assert.strictEqual(failed._tag, "InvalidSettings")
      assert.deepStrictEqual(failed.problems.map((p) => /[A-Z][A-Z_]+/.exec(p.error)?.[0]), [
        "HEALTH_HOST",
        "LOG_BUFFER_BYTES",
        "HEALTH_MAX_EVENT_LOOP_LAG",
        "STARTUP_TIMEOUT",
        "SHUTDOWN_BUDGET"
      ])
      assert.include(failed.problems[0]!.nextStep ?? "", "set HEALTH_HOST")
      assert.include(failed.problems[1]!.error, "got 1000")
      assert.include(failed.problems[3]!.error, "got Infinity")
      assert.include(failed.problems[4]!.error, "(total is SHUTDOWN_BUDGET")
    }))

  it.effect("HEALTH_PORT that is no port is refused as read, naming the value; one given in code is refused too", () =>
    Effect.gen(function*() {
      for (const raw of ["abc", "70000", "1e3", "-1"]) {
        const failed = yield* Worker.readSettings().pipe(fromEnv({ HEALTH_PORT: raw }), Effect.flip)
        assert.deepStrictEqual(failed.problems, [{ error: `HEALTH_PORT must be a port (0-65535) or "off", got ${JSON.stringify(raw)}` }])
      }
      assert.strictEqual((yield* Worker.readSettings().pipe(fromEnv({ HEALTH_PORT: "OFF" }))).settings.healthPort, "off")
      const inCode = yield* Worker.readSettings({ healthPort: Number.NaN }).pipe(fromEnv({}), Effect.flip)
      assert.deepStrictEqual(inCode.problems, [{ error: `HEALTH_PORT must be a port (0-65535) or "off", got NaN` }])
    }))

  it.effect("overrides given in code are checked as the environment's are", () =>
    Effect.gen(function*() {
      const failed = yield* Worker.readSettings({ startupTimeout: Duration.zero }).pipe(fromEnv({}), Effect.flip)
      assert.deepStrictEqual(failed.problems, [{ error: "STARTUP_TIMEOUT must be a positive, finite duration, got 0" }])
    }))
})

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
      assert.include(failed.problems[1]!.error, `got "1000"`)
      assert.include(failed.problems[3]!.error, `got "Infinity"`)
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

  it.effect("every numeric or duration setting's refusal quotes the value given, as HEALTH_PORT's does", () =>
    Effect.gen(function*() {
      for (
        const [name, raw, words] of [
          ["LOG_BUFFER_BYTES", "abc", "LOG_BUFFER_BYTES must be an integer from 65536 to 1073741824"],
          ["LOG_BUFFER_BYTES", "0x10000", "LOG_BUFFER_BYTES must be an integer from 65536 to 1073741824"],
          ["LOG_BUFFER_BYTES", "1.5", "LOG_BUFFER_BYTES must be an integer from 65536 to 1073741824"],
          ["LOG_BUFFER_BYTES", "1000", "LOG_BUFFER_BYTES must be from 65536 to 1073741824"],
          ["LOG_BUFFER_BYTES", "99999999999", "LOG_BUFFER_BYTES must be from 65536 to 1073741824"],
          ["STARTUP_TIMEOUT", "0 seconds", "STARTUP_TIMEOUT must be a positive, finite duration"],
          ["STARTUP_TIMEOUT", "-1 seconds", "STARTUP_TIMEOUT must be a positive, finite duration"],
          ["STARTUP_TIMEOUT", "Infinity", "STARTUP_TIMEOUT must be a positive, finite duration"],
          ["STARTUP_TIMEOUT", "soon", "STARTUP_TIMEOUT must be a duration such as"],
          ["HEALTH_MAX_EVENT_LOOP_LAG", "0 millis", "HEALTH_MAX_EVENT_LOOP_LAG must be a positive, finite duration"],
          ["HEALTH_MAX_CONNECTIONS", "0", "HEALTH_MAX_CONNECTIONS must be from 1 to 65535"],
          ["HEALTH_MAX_CONNECTIONS", "70000", "HEALTH_MAX_CONNECTIONS must be from 1 to 65535"],
          ["HEALTH_MAX_CONNECTIONS", "many", "HEALTH_MAX_CONNECTIONS must be an integer from 1 to 65535"],
          ["SHUTDOWN_CLOSE", "-3 seconds", "SHUTDOWN_CLOSE must not be negative"],
          ["SHUTDOWN_RESERVE", "Infinity", "reserve must be a finite duration"],
          ["SHUTDOWN_BUDGET", "5 seconds", "leaves no drain share"],
          ["SHUTDOWN_READINESS_GRACE", "30 seconds", "leaves no drain share"]
        ] as const
      ) {
        const failed = yield* Worker.readSettings().pipe(fromEnv({ [name]: raw }), Effect.flip)
        assert.strictEqual(failed.problems.length, 1, JSON.stringify(failed.problems))
        const { error } = failed.problems[0]!
        assert.include(error, words, `${name}=${raw}`)
        assert.include(error, `${name}`, `${name}=${raw}`)
        assert.include(error, JSON.stringify(raw), `${name}=${raw}: the value given is quoted in ${error}`)
      }
      // The shares of a budget that does not add up are each named with what was given.
      const budget = yield* Worker.readSettings().pipe(fromEnv({ SHUTDOWN_BUDGET: "5 seconds", SHUTDOWN_CLOSE: "4 seconds" }), Effect.flip)
      assert.include(budget.problems[0]!.error, `total is SHUTDOWN_BUDGET "5 seconds"`)
      assert.include(budget.problems[0]!.error, `close SHUTDOWN_CLOSE "4 seconds"`)
      // Accepted as before: an integer in exponent notation, and surrounding spaces (as for every variable).
      assert.strictEqual((yield* Worker.readSettings().pipe(fromEnv({ LOG_BUFFER_BYTES: "1e6" }))).settings.logBufferBytes, 1_000_000)
      assert.strictEqual((yield* Worker.readSettings().pipe(fromEnv({ LOG_BUFFER_BYTES: " 70000 " }))).settings.logBufferBytes, 70_000)
      assert.strictEqual((yield* Worker.readSettings().pipe(fromEnv({}))).settings.healthMaxConnections, 64)
      assert.strictEqual((yield* Worker.readSettings().pipe(fromEnv({ HEALTH_MAX_CONNECTIONS: "2" }))).settings.healthMaxConnections, 2)
    }))

  it.effect("a value given in code, over the environment's, is shown as given in code, not as the environment's text", () =>
    Effect.gen(function*() {
      const failed = yield* Worker.readSettings({ startupTimeout: Duration.zero, logBufferBytes: 10 }).pipe(
        fromEnv({ STARTUP_TIMEOUT: "60 seconds", LOG_BUFFER_BYTES: "70000" }),
        Effect.flip
      )
      assert.deepStrictEqual(failed.problems.map((p) => p.error), [
        "LOG_BUFFER_BYTES must be from 65536 to 1073741824, got 10",
        "STARTUP_TIMEOUT must be a positive, finite duration, got 0"
      ])
    }))

  it.effect("overrides given in code are checked as the environment's are", () =>
    Effect.gen(function*() {
      const failed = yield* Worker.readSettings({ startupTimeout: Duration.zero }).pipe(fromEnv({}), Effect.flip)
      assert.deepStrictEqual(failed.problems, [{ error: "STARTUP_TIMEOUT must be a positive, finite duration, got 0" }])
    }))
})

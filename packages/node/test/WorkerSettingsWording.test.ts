/**
 * Worker settings read from the environment are refused in words an operator can act on: one
 * `worker.invalid_settings` line, exit 1, naming the variable, the value given and an example.
 *
 * Before: `LOG_LEVEL=debug` was refused (case-sensitive, while the CLI takes `--log-level debug`)
 * as a raw `ConfigError(SchemaError(Expected "All" | "Fatal" | ... at ["LOG_LEVEL"]))`;
 * `SHUTDOWN_BUDGET=25` or `STARTUP_TIMEOUT=5s` as `Expected a valid Duration string at [...]`
 * (neither the value nor an example); `SHUTDOWN_BUDGET=-5 seconds` as "total must be a finite
 * duration, got -5000 millis"; `HEALTH_HOST=localhost:8080` failed to listen with a next step
 * naming HEALTH_PORT; and an unset required variable read as `Expected string at ["X"]`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { Config, ConfigProvider, Duration, Effect } from "effect"
import { describeConfigError } from "../src/internal/settingsFromEnv.ts"
import { capturingStdout } from "./support/stdout.ts"

/** A worker that would stop at once, with its settings from `env`. */
const runWith = (env: Record<string, string>) =>
  capturingStdout(
    Worker.run(Effect.void, { readyWhen: "started" }).pipe(
      Effect.provide(ConfigProvider.layer(ConfigProvider.fromEnv({ env: { HEALTH_PORT: "off", ...env } })))
    )
  )

/** The refusal of `env`: exit 1 and exactly one `worker.invalid_settings` line; its `error`. */
const refusal = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const { lines, result } = yield* runWith(env)
    const refused = lines.filter((line) => line.message === "worker.invalid_settings")
    assert.strictEqual(result, Worker.exitCodes.failure, JSON.stringify(lines))
    assert.strictEqual(refused.length, 1, JSON.stringify(lines))
    return { error: String(refused[0]!.error), nextStep: refused[0]!.nextStep }
  })

describe("Worker settings from the environment", () => {
  it.live("LOG_LEVEL is read in any case, as the CLI's --log-level is (debug, WARN, info)", () =>
    Effect.gen(function*() {
      const settings = yield* Effect.forEach(
        ["debug", "WARN", "info"],
        (level) => Worker.settings.parse(ConfigProvider.fromEnv({ env: { LOG_LEVEL: level } }))
      )
      assert.deepStrictEqual(settings.map((s) => s.logLevel), ["Debug", "Warn", "Info"])
    }))

  it.live("an unknown LOG_LEVEL names the variable, the value and the levels, not a schema error", () =>
    Effect.gen(function*() {
      const { error } = yield* refusal({ LOG_LEVEL: "Loud" })
      assert.strictEqual(error, `LOG_LEVEL must be one of All, Trace, Debug, Info, Warn, Error, Fatal, None (any case), got "Loud"`)
    }))

  it.live("a duration that does not parse names the variable, an example and the value: SHUTDOWN_BUDGET=25, STARTUP_TIMEOUT=5s", () =>
    Effect.gen(function*() {
      assert.strictEqual(
        (yield* refusal({ SHUTDOWN_BUDGET: "25" })).error,
        `SHUTDOWN_BUDGET must be a duration such as "25 seconds", got "25"`
      )
      assert.strictEqual(
        (yield* refusal({ STARTUP_TIMEOUT: "5s" })).error,
        `STARTUP_TIMEOUT must be a duration such as "60 seconds", got "5s"`
      )
    }))

  it.live("a negative shutdown share says it must not be negative, naming the variable: SHUTDOWN_BUDGET=-5 seconds", () =>
    Effect.gen(function*() {
      assert.strictEqual(
        (yield* refusal({ SHUTDOWN_BUDGET: "-5 seconds" })).error,
        `SHUTDOWN_BUDGET must not be negative, got "-5 seconds"`
      )
    }))

  it.live("HEALTH_HOST with a port (localhost:8080) is refused naming HEALTH_HOST, not HEALTH_PORT", () =>
    Effect.gen(function*() {
      const { error, nextStep } = yield* refusal({ HEALTH_PORT: "0", HEALTH_HOST: "localhost:8080" })
      assert.include(error, `HEALTH_HOST must be a host name or address without a port, got "localhost:8080"`)
      assert.include(String(nextStep), "HEALTH_HOST")
      assert.notInclude(`${error} ${String(nextStep)}`, "set HEALTH_PORT")
    }))

  it.live("a host that does not resolve fails start-up with a next step naming HEALTH_HOST, not HEALTH_PORT", () =>
    Effect.gen(function*() {
      const { lines, result } = yield* runWith({ HEALTH_PORT: "0", HEALTH_HOST: "no-such-host.invalid" })
      const failed = lines.filter((line) => line.message === "worker.startup_failed")
      assert.strictEqual(result, Worker.exitCodes.failure)
      assert.strictEqual(failed.length, 1, JSON.stringify(lines))
      assert.include(String(failed[0]!.nextStep), "set HEALTH_HOST")
    }))

  it.live("a negative shutdown share given in code is refused as negative, not as not finite", () =>
    Effect.gen(function*() {
      const { lines, result } = yield* capturingStdout(Worker.run(Effect.void, { settings: { healthPort: "off", budget: Duration.seconds(-5) } }))
      const refused = lines.filter((line) => line.message === "worker.invalid_settings")
      assert.strictEqual(result, Worker.exitCodes.failure)
      assert.strictEqual(refused.length, 1, JSON.stringify(lines))
      assert.include(String(refused[0]!.error), "total must not be negative, got -5s")
    }))

  it.effect("an unset required variable reads \"<NAME> is not set\"", () =>
    Effect.gen(function*() {
      const failed = yield* Effect.flip(Config.String("DATABASE_URL").parse(ConfigProvider.fromEnv({ env: {} })))
      assert.strictEqual(describeConfigError(failed), "DATABASE_URL is not set")
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger, type LogLevel } from "effect"
import * as LifecycleEvents from "../src/internal/lifecycleEvents.ts"

/** The messages `log` writes through a collecting logger under `LOG_LEVEL` `level`. */
const written = (level: LogLevel.LogLevel, log: Effect.Effect<void>) =>
  Effect.gen(function*() {
    const lines: Array<string> = []
    const collect = Logger.make<unknown, void>(({ logLevel, message }) => {
      lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`)
    })
    yield* log.pipe(LifecycleEvents.withLevel(level), Effect.provide(Logger.layer([collect])))
    return lines
  })

const lines = Effect.all([
  Effect.logDebug("Committed orders#1"),
  Effect.logInfo("consumer orders started"),
  Effect.logInfo("shutdown.started"),
  Effect.logInfo("health.listening"),
  Effect.logInfo("dependency db is back").pipe(Effect.annotateLogs({ event: "dependency.up" })),
  Effect.logInfo("consumer orders: 3 Committed").pipe(Effect.annotateLogs({ event: "consumer.progress" })),
  Effect.logInfo("consumer orders resumed after 5000 ms paused").pipe(Effect.annotateLogs({ event: "consumer.resumed" })),
  Effect.logWarning("broker command failed")
], { discard: true })

describe("LOG_LEVEL and the lifecycle events", () => {
  it.effect("Warn keeps the problems and every lifecycle event, at its own level", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* written("Warn", lines), [
        "Info shutdown.started",
        "Info health.listening",
        "Info dependency db is back",
        "Info consumer orders resumed after 5000 ms paused",
        "Warn broker command failed"
      ])
    }))

  it.effect("None keeps only the lifecycle events", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* written("None", lines), [
        "Info shutdown.started",
        "Info health.listening",
        "Info dependency db is back",
        "Info consumer orders resumed after 5000 ms paused"
      ])
    }))

  it.effect("Debug writes everything, as before", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* written("Debug", lines)).length, 8)
    }))
})

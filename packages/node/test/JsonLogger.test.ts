import { assert, describe, it } from "@effect/vitest"
import { JsonLogger } from "@jetworker/node"
import { Effect, Logger, Redacted, References } from "effect"

/** Runs `effect` with the JSON formatter and returns the parsed lines. */
const capture = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const lines: Array<string> = []
    const logger = Logger.map(JsonLogger.formatter, (line) => {
      lines.push(line)
    })
    yield* effect.pipe(Effect.provide(Logger.layer([logger])), Effect.ignore)
    return lines.map((line) => JSON.parse(line) as Record<string, unknown>)
  })

describe("JsonLogger", () => {
  it.effect("one object per line: timestamp, level, message, then the annotations as keys of their own", () =>
    Effect.gen(function*() {
      const [line] = yield* capture(
        Effect.logInfo("shutdown.completed").pipe(Effect.annotateLogs({ result: "success", durationMs: 812 }))
      )
      assert.deepStrictEqual(Object.keys(line!), ["timestamp", "level", "message", "result", "durationMs"])
      assert.deepInclude(line!, { level: "INFO", message: "shutdown.completed", result: "success", durationMs: 812 })
      assert.match(String(line!.timestamp), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
    }))

  it.effect("levels are upper case; further arguments go to details; a cause is printed in full", () =>
    Effect.gen(function*() {
      const lines = yield* capture(Effect.gen(function*() {
        yield* Effect.logWarning("w", { n: 1 })
        yield* Effect.logError("e", 1, 2)
        yield* Effect.logDebug("d")
        yield* Effect.fail(new Error("boom")).pipe(Effect.tapCause((cause) => Effect.logError("failed", cause)))
      }).pipe(Effect.provideService(References.MinimumLogLevel, "Debug")))
      assert.deepStrictEqual(lines.map((l) => l.level), ["WARN", "ERROR", "DEBUG", "ERROR"])
      assert.deepStrictEqual(lines[0]!.details, { n: 1 })
      assert.deepStrictEqual(lines[1]!.details, [1, 2])
      assert.match(String(lines[3]!.cause), /boom/)
    }))

  it.effect("secrets print as <redacted>; reserved keys are not shadowed by annotations; bigints are strings", () =>
    Effect.gen(function*() {
      const [line] = yield* capture(
        Effect.logInfo("m").pipe(
          Effect.annotateLogs({ url: Redacted.make("postgres://u:secret@h/db"), message: "evil", level: "x", n: 10n })
        )
      )
      assert.strictEqual(line!.url, "<redacted>")
      assert.strictEqual(line!.message, "m")
      assert.strictEqual(line!.level, "INFO")
      assert.strictEqual(line!["annotation.message"], "evil")
      assert.strictEqual(line!.n, "10")
      assert.notInclude(JSON.stringify(line), "secret")
    }))

  it.effect("lines written inside a span carry its trace and span ids; lines outside carry none", () =>
    Effect.gen(function*() {
      const lines = yield* capture(Effect.gen(function*() {
        yield* Effect.logInfo("outside")
        yield* Effect.logInfo("inside").pipe(Effect.withSpan("work"))
      }))
      assert.notProperty(lines[0]!, "traceId")
      assert.match(String(lines[1]!.traceId), /^[0-9a-f]{32}$/)
      assert.match(String(lines[1]!.spanId), /^[0-9a-f]{16}$/)
    }))
})

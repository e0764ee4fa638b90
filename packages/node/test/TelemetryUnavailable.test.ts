import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { Duration, Effect, Layer } from "effect"

const password = "S3cretPw"

/** Runs `effect` with `process.stdout.write` captured; returns its result and the lines written. */
const capturingStdout = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const original = process.stdout.write
      const chunks: Array<string> = []
      process.stdout.write = ((chunk: string | Uint8Array, ...rest: Array<unknown>) => {
        chunks.push(typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8"))
        const callback = rest.find((arg) => typeof arg === "function") as (() => void) | undefined
        if (callback !== undefined) queueMicrotask(callback)
        return true
      }) as typeof process.stdout.write
      return { original, chunks }
    }),
    ({ chunks }) =>
      Effect.map(effect, (result) => ({
        result,
        lines: chunks.join("").split("\n").filter((line) => line !== "").map((line) => JSON.parse(line) as Record<string, unknown>)
      })),
    ({ original }) => Effect.sync(() => void (process.stdout.write = original))
  )

const quick = {
  healthPort: "off" as const,
  budget: Duration.seconds(3),
  readinessGrace: Duration.zero,
  close: Duration.millis(500),
  telemetry: Duration.millis(500),
  reserve: Duration.millis(500)
}

describe("Worker", () => {
  it.live("telemetry that fails quoting an endpoint's credentials: telemetry.unavailable says why without them", () =>
    Effect.gen(function*() {
      const endpoint = `http://otel:${password}@[otel-collector:4318/v1/traces`
      const { lines, result } = yield* capturingStdout(Worker.run(Effect.void, {
        settings: quick,
        readyWhen: "started",
        telemetry: Layer.effectDiscard(Effect.die(new Error(`Configuration: Could not parse user-provided export URL: '${endpoint}'`)))
      }))
      assert.strictEqual(result, Worker.exitCodes.success)
      const unavailable = lines.filter((l) => l.message === "telemetry.unavailable")
      assert.strictEqual(unavailable.length, 1, JSON.stringify(lines))
      assert.include(String(unavailable[0]!.error), "Could not parse user-provided export URL: 'http://[otel-collector:4318/v1/traces'")
      assert.notInclude(JSON.stringify(lines), password)
    }))

  it.live("telemetry that fails without credentials keeps its cause on telemetry.unavailable", () =>
    Effect.gen(function*() {
      const { lines } = yield* capturingStdout(Worker.run(Effect.void, {
        settings: quick,
        readyWhen: "started",
        telemetry: Layer.effectDiscard(Effect.die(new Error("Configuration: Could not parse user-provided export URL: 'http://[bad/v1/traces'")))
      }))
      const unavailable = lines.filter((l) => l.message === "telemetry.unavailable")
      assert.strictEqual(unavailable.length, 1)
      assert.include(String(unavailable[0]!.error), "http://[bad/v1/traces")
      assert.include(String(unavailable[0]!.cause), "http://[bad/v1/traces")
    }))
})

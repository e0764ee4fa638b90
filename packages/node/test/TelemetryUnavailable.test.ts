import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { Duration, Effect, Layer } from "effect"
import { capturingStdout } from "./support/stdout.ts"

const password = "S3cretPw"

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

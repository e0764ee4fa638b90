/**
 * Credentials in an OTLP endpoint never reach the log. Node sends the `user:password@` of an
 * endpoint URL as basic auth, so it is a secret: the ledger worker runs as a child process with
 * such an endpoint, malformed (telemetry refused at start-up) or unreachable (every export fails),
 * and no line it writes, on stdout or stderr, contains the password, while the lines still say
 * which variable to fix.
 */
import { assert, describe, layer } from "@effect/vitest"
import { FaultProxy, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const password = "S3cretPw"

/** Short exports, so that failures happen while the test watches; a short shutdown. */
const exportOften = {
  OTEL_SERVICE_NAME: "ledger-under-test",
  OTEL_BSP_SCHEDULE_DELAY: "50",
  OTEL_BLRP_SCHEDULE_DELAY: "50",
  OTEL_METRIC_EXPORT_INTERVAL: "100",
  OTEL_EXPORTER_OTLP_TIMEOUT: "1000",
  ...W.quickBudget
}

/** Every line the child wrote, stdout and stderr. */
const everything = (worker: W.Worker) =>
  Effect.gen(function*() {
    return [...(yield* worker.child.lines), ...(yield* worker.child.stderr)]
  })

describe("telemetry credentials", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("a malformed endpoint with a password: telemetry.unavailable names the variable and the endpoint without its credentials; no line holds the password", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...exportOften,
          OTEL_EXPORTER_OTLP_ENDPOINT: `http://otel:${password}@[otel-collector:4318`
        })
        yield* W.waitReady(worker)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const lines = yield* everything(worker)
        const leaking = lines.filter((line) => line.includes(password))
        assert.deepStrictEqual(leaking, [], "no line contains the password")
        const unavailable = W.withMessage(yield* worker.logs, "telemetry.unavailable")
        assert.strictEqual(unavailable.length, 1)
        assert.include(String(unavailable[0]!.error), "OTEL_EXPORTER_OTLP_ENDPOINT")
        assert.include(String(unavailable[0]!.error), "http://[otel-collector:4318")
      }))

    it.effect("an unreachable endpoint with a password: the export failures are logged, none with the password", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        // A loopback port with nothing behind it.
        const port = yield* Effect.scoped(
          Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } }), (proxy) => proxy.port)
        )
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...exportOften,
          OTEL_EXPORTER_OTLP_ENDPOINT: `http://otel:${password}@127.0.0.1:${port}`
        })
        yield* W.waitReady(worker)
        yield* worker.waitForLog("telemetry.error", "10 seconds")
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const lines = yield* everything(worker)
        assert.deepStrictEqual(lines.filter((line) => line.includes(password)), [], "no line contains the password")
        assert.strictEqual(W.withMessage(yield* worker.logs, "telemetry.unavailable").length, 0)
      }))
  })
})

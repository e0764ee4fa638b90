/**
 * `telemetry.error` lines (the OpenTelemetry SDK's own diagnostics: failed exports) follow
 * `LOG_LEVEL` like every other line that is not a lifecycle event: the ledger worker runs as a
 * child process exporting often to a loopback collector that drops every connection, with
 * `LOG_LEVEL=Error` (the failures are written) and `LOG_LEVEL=None` (only the lifecycle events).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { type AddressInfo, createServer } from "node:net"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

/** A loopback server that resets every connection at once, counting them: each one is a failed export. */
const droppingCollector = Effect.acquireRelease(
  Effect.callback<{ readonly port: number; readonly connections: () => number; readonly close: () => void }>((resume) => {
    let connections = 0
    const server = createServer((socket) => {
      connections++
      socket.resetAndDestroy()
    })
    server.listen(0, "127.0.0.1", () =>
      resume(Effect.succeed({
        port: (server.address() as AddressInfo).port,
        connections: () => connections,
        close: () => void server.close()
      })))
  }),
  (collector) => Effect.sync(collector.close)
)

describe("telemetry log level", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("failed exports are written as telemetry.error at LOG_LEVEL=Error, and not at all at LOG_LEVEL=None, which still writes the lifecycle events", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const collector = yield* droppingCollector
        const env = {
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...W.quickBudget,
          OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${collector.port}`,
          OTEL_BSP_SCHEDULE_DELAY: "50",
          OTEL_BLRP_SCHEDULE_DELAY: "50",
          OTEL_METRIC_EXPORT_INTERVAL: "100",
          OTEL_EXPORTER_OTLP_TIMEOUT: "1000"
        }
        /** Runs the worker at `level` until `exports` more exports have failed, then stops it; its lines. */
        const run = (level: string, exports: number) =>
          Effect.gen(function*() {
            const worker = yield* W.start({ ...env, LOG_LEVEL: level })
            yield* W.waitReady(worker)
            const from = collector.connections()
            yield* Eventually.holds(
              `${exports} failed exports at LOG_LEVEL=${level}`,
              Effect.sync(() => collector.connections() - from >= exports),
              "20 seconds"
            )
            yield* worker.child.kill("SIGTERM")
            assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null }, level)
            return yield* worker.logs
          })

        // Error: the failures are ERROR lines, so they are written (this also shows the scenario
        // produces them before the worker is stopped).
        const loud = W.withMessage(yield* run("Error", 10), "telemetry.error")
        assert.isAbove(loud.length, 0, "LOG_LEVEL=Error writes the failed exports")
        assert.isTrue(loud.every((l) => l.level === "ERROR" || l.level === "WARN"))

        // None: as many failures write nothing but the lifecycle events.
        const quiet = yield* run("None", 10)
        assert.deepStrictEqual(W.withMessage(quiet, "telemetry.error"), [], "LOG_LEVEL=None writes no telemetry.error")
        for (const event of ["health.listening", "worker.ready", "shutdown.started", "shutdown.completed"]) {
          assert.lengthOf(W.withMessage(quiet, event), 1, event)
        }
        assert.isAbove(quiet.filter((l) => l.message === "shutdown.stage" && l.stage === "telemetry").length, 0)
      }), 90_000)
  })
})

/**
 * `Otlp.settings` as an operator configures it from the `OTEL_*` environment: a value it cannot
 * honour is refused at start-up with a `ConfigError` naming the variable, never replaced by a
 * default or another exporter in silence; OTLP headers are read as secrets. And the SDK's
 * diagnostics never quote a header's value.
 */
import { assert, describe, it } from "@effect/vitest"
import { Otlp } from "@jetworker/opentelemetry"
import { Eventually } from "@jetworker/testing"
import { ConfigProvider, Effect, Layer, Logger, Redacted, Result } from "effect"
import { createRequire } from "node:module"
import { type AddressInfo, createServer, type Server, type Socket } from "node:net"

// The API is a dependency of the opentelemetry package, not of the workspace root; it keeps its
// diagnostic logger in a process-wide global, so this copy is the one the layer sets.
const { diag } = createRequire(import.meta.resolve("@jetworker/opentelemetry"))("@opentelemetry/api") as {
  readonly diag: { readonly error: (message: string) => void; readonly warn: (message: string) => void }
}

const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" }

const read = (env: Record<string, string>) => Effect.result(Otlp.settings.parse(ConfigProvider.fromUnknown({ ...endpoint, ...env })))

/** The message of the failure reading `env`, or fails the test when it is read. */
const refusal = (env: Record<string, string>) =>
  Effect.map(read(env), (result) => {
    assert.isTrue(Result.isFailure(result), `${JSON.stringify(env)} was accepted`)
    return Result.isFailure(result) ? result.failure.message : ""
  })

const accepted = (env: Record<string, string>) =>
  Effect.map(read(env), (result) => {
    assert.isTrue(Result.isSuccess(result), Result.isFailure(result) ? result.failure.message : "")
    return Result.getOrThrow(result)
  })

const secret = "sk-live-9f8e7d6c5b4a"

describe("Otlp.settings", () => {
  it.effect("a number that is zero, negative, fractional or past what a timer holds is refused, naming the variable and the value", () =>
    Effect.gen(function*() {
      for (
        const [variable, value] of [
          ["OTEL_BSP_MAX_QUEUE_SIZE", "0"],
          ["OTEL_BLRP_MAX_QUEUE_SIZE", "-5"],
          ["OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1.5"],
          ["OTEL_EXPORTER_OTLP_TIMEOUT", "0"],
          ["OTEL_EXPORTER_OTLP_TIMEOUT", "99999999999999"],
          ["OTEL_BSP_SCHEDULE_DELAY", "-1"],
          ["OTEL_METRIC_EXPORT_INTERVAL", "3000000000"],
          ["OTEL_BLRP_SCHEDULE_DELAY", "5s"]
        ] as const
      ) {
        const message = yield* refusal({ [variable]: value })
        assert.include(message, variable)
        assert.include(message, value)
      }
    }))

  it.effect("an empty number is the default; a valid one is kept", () =>
    Effect.gen(function*() {
      const s = yield* accepted({ OTEL_BSP_MAX_QUEUE_SIZE: "", OTEL_EXPORTER_OTLP_TIMEOUT: "2500", OTEL_BLRP_MAX_QUEUE_SIZE: " 64 " })
      assert.strictEqual(s.spanQueueSize, 2048)
      assert.strictEqual(s.exportTimeoutMillis, 2500)
      assert.strictEqual(s.logQueueSize, 64)
    }))

  it.effect("an exporter other than otlp or none is refused rather than replaced by OTLP", () =>
    Effect.gen(function*() {
      for (const [variable, value] of [["OTEL_TRACES_EXPORTER", "zipkin"], ["OTEL_METRICS_EXPORTER", "prometheus"], ["OTEL_LOGS_EXPORTER", "console"]] as const) {
        const message = yield* refusal({ [variable]: value })
        assert.include(message, `${variable}`)
        assert.include(message, value)
      }
      const s = yield* accepted({ OTEL_TRACES_EXPORTER: "OTLP", OTEL_METRICS_EXPORTER: "none", OTEL_LOGS_EXPORTER: "otlp" })
      assert.strictEqual(s.tracesEndpoint, "http://127.0.0.1:4318/v1/traces")
      assert.strictEqual(s.metricsEndpoint, undefined)
    }))

  it.effect("a channel's own timeout (OTEL_EXPORTER_OTLP_<CHANNEL>_TIMEOUT) and the processors' export timeouts are read, not ignored", () =>
    Effect.gen(function*() {
      const s = yield* accepted({
        OTEL_EXPORTER_OTLP_TIMEOUT: "4000",
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "300",
        OTEL_BLRP_EXPORT_TIMEOUT: "700",
        OTEL_METRIC_EXPORT_TIMEOUT: "900"
      })
      assert.deepStrictEqual(
        [s.exportTimeoutMillis, s.tracesTimeoutMillis, s.metricsTimeoutMillis, s.spanExportTimeoutMillis, s.logExportTimeoutMillis, s.metricExportTimeoutMillis],
        [4000, 300, undefined, undefined, 700, 900]
      )
      assert.include(yield* refusal({ OTEL_EXPORTER_OTLP_LOGS_TIMEOUT: "0" }), "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT")
      assert.include(yield* refusal({ OTEL_BSP_EXPORT_TIMEOUT: "soon" }), "OTEL_BSP_EXPORT_TIMEOUT")
    }))

  it.effect("OTEL_SDK_DISABLED=true builds no channel at all; a value that is not a boolean is refused", () =>
    Effect.gen(function*() {
      for (const value of ["true", "TRUE"]) {
        const s = yield* accepted({ OTEL_SDK_DISABLED: value, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://127.0.0.1:4318/v1/traces" })
        assert.deepStrictEqual([s.tracesEndpoint, s.metricsEndpoint, s.logsEndpoint], [undefined, undefined, undefined], value)
      }
      const on = yield* accepted({ OTEL_SDK_DISABLED: "false" })
      assert.strictEqual(on.tracesEndpoint, "http://127.0.0.1:4318/v1/traces")
      assert.include(yield* refusal({ OTEL_SDK_DISABLED: "yes" }), "OTEL_SDK_DISABLED")
    }))

  it.effect("a protocol other than OTLP/HTTP (grpc) is refused for a channel in use", () =>
    Effect.gen(function*() {
      assert.include(yield* refusal({ OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" }), "OTEL_EXPORTER_OTLP_PROTOCOL")
      assert.include(yield* refusal({ OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: "grpc" }), "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
      yield* accepted({ OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" })
      yield* accepted({ OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf" })
      yield* accepted({ OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "grpc", OTEL_TRACES_EXPORTER: "none" })
    }))

  it.effect("OTLP headers are read as secrets: the settings hold them redacted, a channel's own header wins", () =>
    Effect.gen(function*() {
      const s = yield* accepted({
        OTEL_EXPORTER_OTLP_HEADERS: `x-api-key=${secret}, x-tenant=acme`,
        OTEL_EXPORTER_OTLP_LOGS_HEADERS: "x-tenant=logs%20team"
      })
      const plain = (headers: Otlp.Headers | undefined) =>
        Object.fromEntries(Object.entries(headers ?? {}).map(([name, value]) => [name, Redacted.value(value)]))
      assert.deepStrictEqual(plain(s.tracesHeaders), { "x-api-key": secret, "x-tenant": "acme" })
      assert.deepStrictEqual(plain(s.logsHeaders), { "x-api-key": secret, "x-tenant": "logs team" })
      assert.notInclude(JSON.stringify(s), secret)
      assert.notInclude(String(s.tracesHeaders?.["x-api-key"]), secret)
    }))

  it.effect("a malformed header list is refused, naming the variable and the entry's position, never the value", () =>
    Effect.gen(function*() {
      for (const value of [`x-api-key${secret}`, `x-api-key=${secret}%zz`, `x api key=${secret}`, `=${secret}`, `x-api-key=${secret}\nX-Injected: 1`]) {
        const message = yield* refusal({ OTEL_EXPORTER_OTLP_HEADERS: value })
        assert.include(message, "OTEL_EXPORTER_OTLP_HEADERS")
        assert.notInclude(message, secret)
      }
    }))
})

describe("Otlp diagnostics", () => {
  it.live("a trace export to a collector that never answers is cut at OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, not the shared timeout", () =>
    Effect.gen(function*() {
      const lines: Array<Readonly<Record<string, unknown>>> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => {
        if (entry.message === "telemetry.error") lines.push(entry.annotations)
      })
      // Accepts connections and never answers.
      const sockets = new Set<Socket>()
      const server = yield* Effect.acquireRelease(
        Effect.callback<Server>((resume) => {
          const s = createServer((socket) => {
            sockets.add(socket)
          })
          s.listen(0, "127.0.0.1", () => resume(Effect.succeed(s)))
        }),
        (s) => Effect.sync(() => {
          for (const socket of sockets) socket.destroy()
          s.close()
        })
      )
      const port = (server.address() as AddressInfo).port
      const s = yield* accepted({
        OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
        OTEL_METRICS_EXPORTER: "none",
        OTEL_LOGS_EXPORTER: "none",
        OTEL_EXPORTER_OTLP_TIMEOUT: "60000",
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "300",
        OTEL_BSP_SCHEDULE_DELAY: "50"
      })
      const context = yield* Layer.build(Otlp.layer(s)).pipe(Effect.provide(Logger.layer([logger])))
      yield* Effect.void.pipe(Effect.withSpan("one.span"), Effect.provideContext(context))
      // 300 ms for the request, and the 50 ms delay before it: far inside 5 s, far from 60 s.
      yield* Eventually.holds("the export failed", Effect.sync(() => lines.length > 0), "5 seconds")
      assert.match(JSON.stringify(lines), /Timeout|timed out/)
    }).pipe(Effect.scoped))

  it.live("a header's value quoted by the SDK or the collector (an echoed API key) is written redacted", () =>
    Effect.gen(function*() {
      const lines: Array<Readonly<Record<string, unknown>>> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => {
        if (entry.message === "telemetry.error") lines.push(entry.annotations)
      })
      const s = yield* accepted({
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:1",
        OTEL_EXPORTER_OTLP_HEADERS: `x-api-key=${encodeURIComponent(`${secret}/+`)}`,
        OTEL_BSP_SCHEDULE_DELAY: "600000",
        OTEL_BLRP_SCHEDULE_DELAY: "600000",
        OTEL_METRIC_EXPORT_INTERVAL: "600000",
        // The scope's final flush to a port where nothing listens gives up after this.
        OTEL_EXPORTER_OTLP_TIMEOUT: "500"
      })
      yield* Layer.build(Otlp.layer(s)).pipe(Effect.provide(Logger.layer([logger])))
      const body = JSON.stringify({ message: `invalid api key ${secret}/+` })
      diag.error(JSON.stringify({ message: "Unauthorized", code: "401", data: body }))
      diag.warn(`sent ${encodeURIComponent(`${secret}/+`)}`)
      yield* Eventually.holds("two telemetry.error lines", Effect.sync(() => lines.length === 2), "5 seconds")
      assert.notInclude(JSON.stringify(lines), secret)
      assert.include(String(lines[0]!.error), "invalid api key <redacted>")
      assert.include(String(lines[1]!.error), "sent <redacted>")
    }).pipe(Effect.scoped))
})

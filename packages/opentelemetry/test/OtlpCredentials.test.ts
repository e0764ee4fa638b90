import { assert, describe, it } from "@effect/vitest"
import { Otlp } from "@jetworker/opentelemetry"
import { Eventually } from "@jetworker/testing"
import { diag } from "@opentelemetry/api"
import { ConfigProvider, Effect, Layer, Logger, Result } from "effect"

const password = "S3cretPw"

const read = (env: Record<string, string>) => Effect.result(Otlp.settings.parse(ConfigProvider.fromUnknown(env)))

describe("Otlp", () => {
  it.effect("an endpoint that is not an http(s) URL is refused, naming the variable and the endpoint without its credentials", () =>
    Effect.gen(function*() {
      for (
        const [variable, value, shown] of [
          ["OTEL_EXPORTER_OTLP_ENDPOINT", `http://otel:${password}@[otel-collector:4318`, "http://[otel-collector:4318"],
          ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", `http://otel:${password}@otel collector:4318/v1/traces`, "http://otel collector:4318/v1/traces"],
          ["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "otel-collector:4318", "otel-collector:4318"]
        ] as const
      ) {
        const result = yield* read({ [variable]: value })
        assert.isTrue(Result.isFailure(result), value)
        const message = Result.isFailure(result) ? result.failure.message : ""
        assert.include(message, `${variable} must be an http:// or https:// URL, got ${shown}`)
        assert.notInclude(message, password)
      }
    }))

  it.effect("the endpoint of a channel turned off is not checked", () =>
    Effect.gen(function*() {
      const result = yield* read({
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://[bad",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://collector:4318/v1/traces",
        OTEL_METRICS_EXPORTER: "none",
        OTEL_LOGS_EXPORTER: "none"
      })
      assert.isTrue(Result.isSuccess(result))
      assert.strictEqual(Result.getOrThrow(result).tracesEndpoint, "http://collector:4318/v1/traces")
    }))

  it.effect("valid endpoints pass, credentials and all (they are sent as basic auth)", () =>
    Effect.gen(function*() {
      const result = yield* read({
        OTEL_EXPORTER_OTLP_ENDPOINT: `https://otel:${password}@otel-collector:4318/`,
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: "http://[::1]:4318/v1/metrics"
      })
      assert.isTrue(Result.isSuccess(result))
      const settings = Result.getOrThrow(result)
      assert.strictEqual(settings.tracesEndpoint, `https://otel:${password}@otel-collector:4318/v1/traces`)
      assert.strictEqual(settings.metricsEndpoint, "http://[::1]:4318/v1/metrics")
    }))

  it.live("the SDK's diagnostics go to the loggers in effect, without the credentials of the URLs they quote", () =>
    Effect.gen(function*() {
      const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => {
        lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
      })
      const settings = Result.getOrThrow(yield* read({
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `http://otel:${password}@127.0.0.1:1/v1/traces`,
        OTEL_BSP_SCHEDULE_DELAY: "600000"
      }))
      yield* Layer.build(Otlp.layer(settings)).pipe(Effect.provide(Logger.layer([logger])))
      diag.error(`export to 'http://otel:${password}@127.0.0.1:1/v1/traces' failed`, new Error(`posting to http://u:p@ss@h/x`))
      diag.warn(`retrying "https://a:${password}@h:4318"`)
      yield* Eventually.holds("two telemetry.error lines", Effect.sync(() => lines.filter((l) => l.message === "telemetry.error").length === 2), "5 seconds")
      const [error, warning] = lines.filter((l) => l.message === "telemetry.error")
      assert.strictEqual(error!.level, "ERROR")
      assert.strictEqual(error!.annotations.error, "export to 'http://127.0.0.1:1/v1/traces' failed posting to http://h/x")
      assert.strictEqual(warning!.level, "WARN")
      assert.strictEqual(warning!.annotations.error, `retrying "https://h:4318"`)
      assert.notInclude(JSON.stringify(lines), password)
    }).pipe(Effect.scoped))

  it.live("the SDK's diagnostics are one line each, with the message, code and data of an error but never its stack", () =>
    Effect.gen(function*() {
      const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => {
        lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
      })
      const settings = Result.getOrThrow(yield* read({
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://127.0.0.1:1/v1/traces",
        OTEL_EXPORTER_OTLP_HEADERS: `x-api-key=${password}`,
        OTEL_BSP_SCHEDULE_DELAY: "600000"
      }))
      yield* Layer.build(Otlp.layer(settings)).pipe(Effect.provide(Logger.layer([logger])))
      const stack = "Error: x\n    at foo (file.js:1:1)\n    at bar (file.js:2:2)"
      // An error-like plain object, as an exporter hands over.
      diag.error("export failed:", { message: "export failed", code: 500, data: `refused key ${password}`, stack })
      // An Error whose cause has a stack, with the fields of the SDK's OTLPExporterError.
      const inner = new Error("socket hang up")
      diag.error("export failed:", Object.assign(new Error("Bad Request", { cause: inner }), { code: 400, data: "bad body" }))
      // What the SDK's default global error handler logs: the error flattened to JSON, stack and all.
      diag.error(JSON.stringify({ stack, message: "Service Unavailable", code: "503", data: "busy", constructor: "class OTLPExporterError extends Error { constructor(message, code, data) { super(message) } }" }))
      // A nested cause with a stack, several levels down.
      diag.warn("export retried:", { message: "retrying", cause: { message: "reset", code: "ECONNRESET", stack, cause: { stack } } })
      // A stack as a plain string.
      diag.error(`export failed\n${inner.stack ?? stack}`)
      // A stack quoted in a message, which JSON escapes.
      diag.error("export failed:", { message: `upstream said ${stack}`, code: 502 })
      yield* Eventually.holds("six telemetry.error lines", Effect.sync(() => lines.filter((l) => l.message === "telemetry.error").length === 6), "5 seconds")
      const errors = lines.filter((l) => l.message === "telemetry.error").map((l) => String(l.annotations.error))
      for (const error of errors) {
        assert.notInclude(error, "    at ", error)
        assert.notInclude(error, " at foo", error)
        assert.notInclude(error, "file.js", error)
        assert.notInclude(error, "\n", error)
        assert.notInclude(error, "stack", error)
        assert.notInclude(error, "constructor", error)
        assert.notInclude(error, password, error)
      }
      const [plain, withCause, flattened, nested, text, quoted] = errors
      assert.include(plain, "export failed")
      assert.include(plain, "500")
      assert.include(plain, "refused key <redacted>")
      assert.include(withCause, "Bad Request")
      assert.include(withCause, "400")
      assert.include(withCause, "bad body")
      assert.include(withCause, "socket hang up")
      assert.include(flattened, "Service Unavailable")
      assert.include(flattened, "503")
      assert.include(flattened, "busy")
      assert.include(nested, "retrying")
      assert.include(nested, "ECONNRESET")
      assert.strictEqual(text, "export failed Error: socket hang up")
      assert.strictEqual(quoted, `export failed: {"message":"upstream said Error: x","code":502}`)
    }).pipe(Effect.scoped))
})

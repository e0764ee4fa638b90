/**
 * Telemetry export as one scoped resource: traces, metrics and logs sent over OTLP/HTTP (JSON)
 * by the OpenTelemetry SDK, configured from the standard `OTEL_*` environment. Effect's tracer,
 * metrics and loggers feed it through `@effect/opentelemetry`; core and the adapters never see
 * the SDK.
 *
 * - A channel whose endpoint is not set (neither `OTEL_EXPORTER_OTLP_ENDPOINT` nor the channel's
 *   own `OTEL_EXPORTER_OTLP_<CHANNEL>_ENDPOINT`), or whose `OTEL_<CHANNEL>_EXPORTER` is `none`,
 *   is not built at all: nothing is buffered for it.
 * - Every buffer is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BLRP_MAX_QUEUE_SIZE`, default 2048:
 *   past it new records are dropped, never the process's memory) and every export request is
 *   bounded by `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds, default 5000).
 * - Under `Worker.runMain` each channel registers its flush with the lifecycle: the worker runs
 *   them in its `telemetry` stage, each bounded by the telemetry share, one stage line per
 *   channel. A slow or unreachable collector never holds the exit past the budget, and a failed
 *   flush changes no result.
 * - The SDK's own errors (an export that failed) are written as `telemetry.error` lines (ERROR,
 *   or WARN for its warnings) by the loggers in effect where the layer is built (under
 *   `Worker.runMain`, the JSON lines on stdout, so `LOG_LEVEL` applies), at most 10 a minute, and
 *   never sent through the telemetry they are about, so an unreachable collector yields a bounded
 *   number of lines, not a loop.
 * - Every endpoint must be an `http://` or `https://` URL: another value fails `settings` with a
 *   `ConfigError` naming the variable. Credentials in an endpoint (`http://user:password@host`,
 *   sent as basic auth) never appear in a message or a line: they are removed first.
 *
 * There is no separate error reporter: errors are log lines and span statuses.
 *
 * @since 0.2.0
 */
import { OtelLogger, OtelMetrics, OtelTracer, Resource } from "@effect/opentelemetry"
import { ErrorSummary, Lifecycle } from "@jetworker/core"
import { diag, type DiagLogger, DiagLogLevel } from "@opentelemetry/api"
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-http"
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import { BatchLogRecordProcessor, LoggerProvider } from "@opentelemetry/sdk-logs"
import { PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics"
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Config, ConfigProvider, type Context, Duration, Effect, Layer, Option } from "effect"

/** The telemetry settings; `settings` reads them from the `OTEL_*` environment. */
export interface Settings {
  /** `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`. */
  readonly tracesEndpoint: string | undefined
  /** `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/metrics`. */
  readonly metricsEndpoint: string | undefined
  /** `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/logs`. */
  readonly logsEndpoint: string | undefined
  /** `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), default 5000: bound on one export request. */
  readonly exportTimeoutMillis: number
  /** `OTEL_BSP_SCHEDULE_DELAY` (milliseconds), default 5000: how long spans wait before export. */
  readonly spanDelayMillis: number
  /** `OTEL_BSP_MAX_QUEUE_SIZE`, default 2048: spans buffered at most. */
  readonly spanQueueSize: number
  /** `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, default 512 (at most the queue size): spans per export; a full batch is sent at once. */
  readonly spanBatchSize: number
  /** `OTEL_BLRP_SCHEDULE_DELAY` (milliseconds), default 1000: how long log records wait before export. */
  readonly logDelayMillis: number
  /** `OTEL_BLRP_MAX_QUEUE_SIZE`, default 2048: log records buffered at most. */
  readonly logQueueSize: number
  /** `OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`, default 512 (at most the queue size): log records per export. */
  readonly logBatchSize: number
  /** `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds), default 60000: how often metrics are exported. */
  readonly metricIntervalMillis: number
}

const optionalString = (name: string) =>
  Config.String(name).pipe(Config.option, Config.map((o) => (Option.isSome(o) && o.value.trim() !== "" ? o.value.trim() : undefined)))

const positiveInt = (name: string, fallback: number) =>
  Config.Int(name).pipe(Config.withDefault(fallback), Config.map((n) => (n > 0 ? n : fallback)))

const endpoint = (base: string | undefined, own: string | undefined, exporter: string | undefined, path: string) => {
  if (exporter !== undefined && exporter.toLowerCase() === "none") return undefined
  if (own !== undefined) return own
  return base === undefined ? undefined : `${base.replace(/\/+$/, "")}${path}`
}

/**
 * Why the endpoint in `variable` cannot be exported to (not an `http:` or `https:` URL), naming the
 * variable and the endpoint without its credentials; `undefined` when it can.
 */
const endpointProblem = (variable: string, value: string | undefined): string | undefined => {
  if (value === undefined) return undefined
  const url = URL.canParse(value) ? new URL(value) : undefined
  return url !== undefined && (url.protocol === "http:" || url.protocol === "https:")
    ? undefined
    : `${variable} must be an http:// or https:// URL, got ${ErrorSummary.withoutCredentials(value)}`
}

/**
 * Reads {@link Settings} from the environment. An endpoint variable that is set but is not an
 * `http://` or `https://` URL fails with a `ConfigError` naming the variable and the value, with
 * its credentials removed.
 */
export const settings: Config.Config<Settings> = Config.all({
  base: optionalString("OTEL_EXPORTER_OTLP_ENDPOINT"),
  traces: optionalString("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
  metrics: optionalString("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
  logs: optionalString("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
  tracesExporter: optionalString("OTEL_TRACES_EXPORTER"),
  metricsExporter: optionalString("OTEL_METRICS_EXPORTER"),
  logsExporter: optionalString("OTEL_LOGS_EXPORTER"),
  exportTimeoutMillis: positiveInt("OTEL_EXPORTER_OTLP_TIMEOUT", 5_000),
  spanDelayMillis: positiveInt("OTEL_BSP_SCHEDULE_DELAY", 5_000),
  spanQueueSize: positiveInt("OTEL_BSP_MAX_QUEUE_SIZE", 2_048),
  spanBatchSize: positiveInt("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
  logDelayMillis: positiveInt("OTEL_BLRP_SCHEDULE_DELAY", 1_000),
  logQueueSize: positiveInt("OTEL_BLRP_MAX_QUEUE_SIZE", 2_048),
  logBatchSize: positiveInt("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", 512),
  metricIntervalMillis: positiveInt("OTEL_METRIC_EXPORT_INTERVAL", 60_000)
}).pipe(
  // Checked here, before any SDK constructor sees them: a malformed endpoint would otherwise throw
  // from inside the SDK, and its message (and the SDK's warnings) would carry the URL as given,
  // credentials included.
  // Only the variables a built channel uses: one turned off (`none`) is never read.
  Config.mapEffect((c) => {
    const used = (own: string | undefined, exporter: string | undefined) =>
      exporter?.toLowerCase() === "none" ? undefined : own
    const channels = [[c.traces, c.tracesExporter], [c.metrics, c.metricsExporter], [c.logs, c.logsExporter]] as const
    const baseUsed = channels.some(([own, exporter]) => own === undefined && exporter?.toLowerCase() !== "none")
    const problems = [
      endpointProblem("OTEL_EXPORTER_OTLP_ENDPOINT", baseUsed ? c.base : undefined),
      endpointProblem("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", used(c.traces, c.tracesExporter)),
      endpointProblem("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", used(c.metrics, c.metricsExporter)),
      endpointProblem("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", used(c.logs, c.logsExporter))
    ].filter((problem) => problem !== undefined)
    return problems.length === 0
      ? Effect.succeed(c)
      : Effect.fail(new Config.ConfigError(new ConfigProvider.SourceError({ message: problems.join("; ") })))
  }),
  Config.map((c): Settings => ({
    tracesEndpoint: endpoint(c.base, c.traces, c.tracesExporter, "/v1/traces"),
    metricsEndpoint: endpoint(c.base, c.metrics, c.metricsExporter, "/v1/metrics"),
    logsEndpoint: endpoint(c.base, c.logs, c.logsExporter, "/v1/logs"),
    exportTimeoutMillis: c.exportTimeoutMillis,
    spanDelayMillis: c.spanDelayMillis,
    spanQueueSize: c.spanQueueSize,
    spanBatchSize: Math.min(c.spanBatchSize, c.spanQueueSize),
    logDelayMillis: c.logDelayMillis,
    logQueueSize: c.logQueueSize,
    logBatchSize: Math.min(c.logBatchSize, c.logQueueSize),
    metricIntervalMillis: c.metricIntervalMillis
  }))
)

// The SDK reports failed exports through its diagnostic logger. Its lines go to the loggers in
// effect where this layer is built (under `Worker.runMain`, the stdout JSON logger filtered by
// LOG_LEVEL), never to the loggers this layer adds (the OTLP log exporter, which may be the one
// failing), rate limited, and without the credentials of any URL they quote.
const MAX_ERRORS_PER_MINUTE = 10
const boundedDiagLogger = (context: Context.Context<never>): DiagLogger => {
  const log = (effect: Effect.Effect<void>) => void Effect.runForkWith(context)(effect)
  let windowStart = 0
  let written = 0
  let suppressed = 0
  const write = (level: "Error" | "Warn") => (message: string, ...args: Array<unknown>) => {
    const now = Date.now()
    if (now - windowStart >= 60_000) {
      if (suppressed > 0) log(Effect.logWarning("telemetry.error").pipe(Effect.annotateLogs({ suppressed })))
      windowStart = now
      written = 0
      suppressed = 0
    }
    if (written >= MAX_ERRORS_PER_MINUTE) {
      suppressed++
      return
    }
    written++
    const detail = args.map((a) => (a instanceof Error ? a.message : typeof a === "string" ? a : safeJson(a))).join(" ")
    const error = ErrorSummary.withoutCredentials(`${message} ${detail}`.trim()).slice(0, 1_000)
    log((level === "Error" ? Effect.logError : Effect.logWarning)("telemetry.error").pipe(Effect.annotateLogs({ error })))
  }
  const ignore = () => undefined
  return { error: write("Error"), warn: write("Warn"), info: ignore, debug: ignore, verbose: ignore }
}

const safeJson = (value: unknown): string => {
  try {
    return JSON.stringify(value)
  } catch {
    return String(value)
  }
}

/**
 * Flushes then shuts down a channel, once. Registered with the lifecycle (bounded by the
 * telemetry share there) and run again, bounded by `timeout`, by the layer's finalizer for use
 * outside a worker.
 */
const channel = (name: string, flush: () => Promise<unknown>, shutdown: () => Promise<unknown>, timeout: number) =>
  Effect.gen(function*() {
    let done: Promise<unknown> | undefined
    const once = Effect.promise(() => (done ??= flush().catch(() => undefined).then(() => shutdown()).catch(() => undefined)))
    const lifecycle = yield* Lifecycle.Lifecycle
    yield* Effect.addFinalizer(() => once.pipe(Effect.timeoutOption(Duration.millis(timeout))))
    yield* lifecycle.telemetry(name, once)
  })

/** The telemetry of `settings`; a channel without an endpoint is not built. */
export const layer = (settings: Settings): Layer.Layer<never> => {
  const timeout = settings.exportTimeoutMillis
  const any = settings.tracesEndpoint !== undefined || settings.metricsEndpoint !== undefined ||
    settings.logsEndpoint !== undefined
  if (!any) return Layer.empty

  const diagnostics = Layer.effectDiscard(Effect.flatMap(Effect.context<never>(), (context) =>
    Effect.sync(() =>
      diag.setLogger(boundedDiagLogger(context), { logLevel: DiagLogLevel.WARN, suppressOverrideMessage: true })
    )))

  const traces = settings.tracesEndpoint === undefined ? Layer.empty : OtelTracer.layerWithoutOtelTracer.pipe(
    Layer.provide(OtelTracer.layerTracer),
    Layer.provide(Layer.effect(
      OtelTracer.OtelTracerProvider,
      Effect.gen(function*() {
        const resource = yield* Resource.Resource
        const provider = new BasicTracerProvider({
          resource,
          spanProcessors: [
            new BatchSpanProcessor(new OTLPTraceExporter({ url: settings.tracesEndpoint!, timeoutMillis: timeout }), {
              maxQueueSize: settings.spanQueueSize,
              maxExportBatchSize: settings.spanBatchSize,
              scheduledDelayMillis: settings.spanDelayMillis,
              exportTimeoutMillis: timeout
            })
          ]
        })
        yield* channel("traces", () => provider.forceFlush(), () => provider.shutdown(), timeout)
        return provider
      })
    ))
  )

  const metrics = settings.metricsEndpoint === undefined ? Layer.empty : Layer.unwrap(Effect.gen(function*() {
    const reader = new PeriodicExportingMetricReader({
      exporter: new OTLPMetricExporter({ url: settings.metricsEndpoint!, timeoutMillis: timeout }),
      exportIntervalMillis: settings.metricIntervalMillis,
      exportTimeoutMillis: Math.min(timeout, settings.metricIntervalMillis)
    })
    yield* channel("metrics", () => reader.forceFlush(), () => reader.shutdown(), timeout)
    return OtelMetrics.layer(() => reader, { shutdownTimeout: timeout })
  }))

  const logs = settings.logsEndpoint === undefined ? Layer.empty : OtelLogger.layer({ mergeWithExisting: true }).pipe(
    Layer.provide(Layer.effect(
      OtelLogger.OtelLoggerProvider,
      Effect.gen(function*() {
        const resource = yield* Resource.Resource
        const provider = new LoggerProvider({
          resource,
          processors: [
            new BatchLogRecordProcessor({
              exporter: new OTLPLogExporter({ url: settings.logsEndpoint!, timeoutMillis: timeout }),
              maxQueueSize: settings.logQueueSize,
              maxExportBatchSize: settings.logBatchSize,
              scheduledDelayMillis: settings.logDelayMillis,
              exportTimeoutMillis: timeout
            })
          ]
        })
        yield* channel("logs", () => provider.forceFlush(), () => provider.shutdown(), timeout)
        return provider
      })
    ))
  )

  return Layer.mergeAll(traces, metrics, logs).pipe(
    Layer.provide(Resource.layerFromEnv()),
    Layer.provide(diagnostics)
  )
}

/** {@link layer} with the settings read from the `OTEL_*` environment. */
export const layerFromEnv: Layer.Layer<never, Config.ConfigError> = Layer.unwrap(
  Effect.gen(function*() {
    return layer(yield* settings)
  })
)

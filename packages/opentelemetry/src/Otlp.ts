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
 *   bounded by `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds, default 5000), or the channel's own
 *   `OTEL_EXPORTER_OTLP_<CHANNEL>_TIMEOUT`; one export as a whole by `OTEL_BSP_EXPORT_TIMEOUT`,
 *   `OTEL_BLRP_EXPORT_TIMEOUT`, `OTEL_METRIC_EXPORT_TIMEOUT` when set.
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
 * - Every other value the settings read is checked too, and one that cannot be honoured fails
 *   `settings` with a `ConfigError` naming the variable, never replaced in silence: a number that
 *   is not a whole number from 1 to 2147483647, an exporter other than `otlp` or `none`, a
 *   protocol other than OTLP/HTTP (`grpc`), a malformed header list. `OTEL_SDK_DISABLED=true`
 *   builds nothing.
 * - OTLP headers (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_<CHANNEL>_HEADERS`, such as an
 *   API key) are read as `Redacted` values, and their values never appear in a line: the SDK's
 *   diagnostics (and a collector's error quoting one back) are written with `<redacted>` instead.
 * - jetworker's metrics are exported with their units (`ms` for durations, `{delivery}` or
 *   `{message}` for counts) rather than the dimensionless `1` the Effect bridge gives every
 *   metric.
 *
 * There is no separate error reporter: errors are log lines and span statuses.
 *
 * @since 0.1.0
 */
import { OtelLogger, OtelMetrics, OtelTracer, Resource } from "@effect/opentelemetry"
import { Lifecycle } from "@jetworker/core"
import { diag, DiagLogLevel } from "@opentelemetry/api"
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-http"
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import { BatchLogRecordProcessor, LoggerProvider } from "@opentelemetry/sdk-logs"
import { PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics"
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Config, ConfigProvider, Duration, Effect, Layer } from "effect"
import { boundedDiagLogger, secretForms } from "./internal/diagnostics.ts"
import { endpoint, endpointProblem, exporterOff, optionalSecret, optionalString, positiveInt, protocolProblem } from "./internal/envValues.ts"
import { type Headers, parseHeaders, plainHeaders, redact } from "./internal/headers.ts"
import { withUnits } from "./internal/metricUnits.ts"

export type { Headers } from "./internal/headers.ts"

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
  /** `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` (milliseconds): the traces' own request bound, else `exportTimeoutMillis`. */
  readonly tracesTimeoutMillis?: number | undefined
  /** `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT` (milliseconds): the metrics' own request bound, else `exportTimeoutMillis`. */
  readonly metricsTimeoutMillis?: number | undefined
  /** `OTEL_EXPORTER_OTLP_LOGS_TIMEOUT` (milliseconds): the logs' own request bound, else `exportTimeoutMillis`. */
  readonly logsTimeoutMillis?: number | undefined
  /** `OTEL_BSP_EXPORT_TIMEOUT` (milliseconds): bound on one span export, else the traces' request bound. */
  readonly spanExportTimeoutMillis?: number | undefined
  /** `OTEL_BLRP_EXPORT_TIMEOUT` (milliseconds): bound on one log export, else the logs' request bound. */
  readonly logExportTimeoutMillis?: number | undefined
  /** `OTEL_METRIC_EXPORT_TIMEOUT` (milliseconds): bound on one metric export (at most the interval), else the metrics' request bound. */
  readonly metricExportTimeoutMillis?: number | undefined
  /** `OTEL_EXPORTER_OTLP_HEADERS` with `OTEL_EXPORTER_OTLP_TRACES_HEADERS` over it; none when absent. */
  readonly tracesHeaders?: Headers | undefined
  /** `OTEL_EXPORTER_OTLP_HEADERS` with `OTEL_EXPORTER_OTLP_METRICS_HEADERS` over it; none when absent. */
  readonly metricsHeaders?: Headers | undefined
  /** `OTEL_EXPORTER_OTLP_HEADERS` with `OTEL_EXPORTER_OTLP_LOGS_HEADERS` over it; none when absent. */
  readonly logsHeaders?: Headers | undefined
}

const channelNames = ["TRACES", "METRICS", "LOGS"] as const

/**
 * Reads {@link Settings} from the environment. A value that cannot be honoured fails with one
 * `ConfigError` listing every such variable: an endpoint that is not an `http://` or `https://`
 * URL (shown without its credentials), a number that is not a whole number from 1 to
 * 2147483647, an exporter other than `otlp` or `none`, a protocol other than OTLP/HTTP, a
 * malformed header list (its values never shown). `OTEL_SDK_DISABLED=true` turns every channel
 * off.
 */
export const settings: Config.Config<Settings> = Config.all({
  disabled: optionalString("OTEL_SDK_DISABLED"),
  base: optionalString("OTEL_EXPORTER_OTLP_ENDPOINT"),
  traces: optionalString("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
  metrics: optionalString("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
  logs: optionalString("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
  tracesExporter: optionalString("OTEL_TRACES_EXPORTER"),
  metricsExporter: optionalString("OTEL_METRICS_EXPORTER"),
  logsExporter: optionalString("OTEL_LOGS_EXPORTER"),
  protocol: optionalString("OTEL_EXPORTER_OTLP_PROTOCOL"),
  tracesProtocol: optionalString("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
  metricsProtocol: optionalString("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
  logsProtocol: optionalString("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"),
  headers: optionalSecret("OTEL_EXPORTER_OTLP_HEADERS"),
  tracesHeaders: optionalSecret("OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
  metricsHeaders: optionalSecret("OTEL_EXPORTER_OTLP_METRICS_HEADERS"),
  logsHeaders: optionalSecret("OTEL_EXPORTER_OTLP_LOGS_HEADERS"),
  exportTimeoutMillis: optionalString("OTEL_EXPORTER_OTLP_TIMEOUT"),
  tracesTimeoutMillis: optionalString("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
  metricsTimeoutMillis: optionalString("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"),
  logsTimeoutMillis: optionalString("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT"),
  spanExportTimeoutMillis: optionalString("OTEL_BSP_EXPORT_TIMEOUT"),
  logExportTimeoutMillis: optionalString("OTEL_BLRP_EXPORT_TIMEOUT"),
  metricExportTimeoutMillis: optionalString("OTEL_METRIC_EXPORT_TIMEOUT"),
  spanDelayMillis: optionalString("OTEL_BSP_SCHEDULE_DELAY"),
  spanQueueSize: optionalString("OTEL_BSP_MAX_QUEUE_SIZE"),
  spanBatchSize: optionalString("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
  logDelayMillis: optionalString("OTEL_BLRP_SCHEDULE_DELAY"),
  logQueueSize: optionalString("OTEL_BLRP_MAX_QUEUE_SIZE"),
  logBatchSize: optionalString("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE"),
  metricIntervalMillis: optionalString("OTEL_METRIC_EXPORT_INTERVAL")
}).pipe(
  // Checked here, before any SDK constructor sees them: a malformed endpoint would otherwise throw
  // from inside the SDK, and its message (and the SDK's warnings) would carry the URL as given,
  // credentials included; the SDK replaces a bad number or header list in silence.
  // Only the variables a built channel uses: one turned off (`none`) is never read.
  Config.mapEffect((c) => {
    const problems: Array<string> = []
    const check = <A>(result: A | string): A | undefined => {
      if (typeof result === "string") {
        problems.push(result)
        return undefined
      }
      return result
    }
    const disabledValue = c.disabled?.toLowerCase()
    if (disabledValue !== undefined && disabledValue !== "true" && disabledValue !== "false") {
      problems.push(`OTEL_SDK_DISABLED must be true or false, got ${JSON.stringify(c.disabled)}`)
    }
    const disabled = disabledValue === "true"
    const own = { TRACES: c.traces, METRICS: c.metrics, LOGS: c.logs }
    const exporters = { TRACES: c.tracesExporter, METRICS: c.metricsExporter, LOGS: c.logsExporter }
    const variables = { TRACES: "OTEL_TRACES_EXPORTER", METRICS: "OTEL_METRICS_EXPORTER", LOGS: "OTEL_LOGS_EXPORTER" }
    const protocols = { TRACES: c.tracesProtocol, METRICS: c.metricsProtocol, LOGS: c.logsProtocol }
    const ownHeaders = { TRACES: c.tracesHeaders, METRICS: c.metricsHeaders, LOGS: c.logsHeaders }
    const off = Object.fromEntries(channelNames.map((channel) => [
      channel,
      disabled || (check(exporterOff(variables[channel], exporters[channel])) ?? true)
    ])) as Record<typeof channelNames[number], boolean>
    const used = channelNames.filter((channel) => !off[channel])
    const baseUsed = used.some((channel) => own[channel] === undefined)
    problems.push(...[
      endpointProblem("OTEL_EXPORTER_OTLP_ENDPOINT", baseUsed ? c.base : undefined),
      ...used.map((channel) => endpointProblem(`OTEL_EXPORTER_OTLP_${channel}_ENDPOINT`, own[channel])),
      ...used.map((channel) =>
        protocols[channel] !== undefined
          ? protocolProblem(`OTEL_EXPORTER_OTLP_${channel}_PROTOCOL`, protocols[channel])
          : protocolProblem("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
      )
    ].filter((problem) => problem !== undefined))
    const baseHeaders = used.length > 0 ? check(parseHeaders("OTEL_EXPORTER_OTLP_HEADERS", c.headers)) ?? {} : {}
    const headers = Object.fromEntries(channelNames.map((channel) => {
      const mine = used.includes(channel) ? check(parseHeaders(`OTEL_EXPORTER_OTLP_${channel}_HEADERS`, ownHeaders[channel])) ?? {} : {}
      const all = { ...baseHeaders, ...mine }
      return [channel, Object.keys(all).length === 0 ? undefined : redact(all)]
    })) as Record<typeof channelNames[number], Headers | undefined>
    const number = (name: string, raw: string | undefined, fallback: number) => check(positiveInt(name, raw, fallback)) ?? fallback
    // A setting with no default of its own (`undefined` when absent: the layer falls back).
    const optionalNumber = (name: string, raw: string | undefined) =>
      raw === undefined ? undefined : check(positiveInt(name, raw, 0))
    const spanQueueSize = number("OTEL_BSP_MAX_QUEUE_SIZE", c.spanQueueSize, 2_048)
    const logQueueSize = number("OTEL_BLRP_MAX_QUEUE_SIZE", c.logQueueSize, 2_048)
    const result: Settings = {
      tracesEndpoint: endpoint(c.base, c.traces, off.TRACES, "/v1/traces"),
      metricsEndpoint: endpoint(c.base, c.metrics, off.METRICS, "/v1/metrics"),
      logsEndpoint: endpoint(c.base, c.logs, off.LOGS, "/v1/logs"),
      exportTimeoutMillis: number("OTEL_EXPORTER_OTLP_TIMEOUT", c.exportTimeoutMillis, 5_000),
      spanDelayMillis: number("OTEL_BSP_SCHEDULE_DELAY", c.spanDelayMillis, 5_000),
      spanQueueSize,
      spanBatchSize: Math.min(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", c.spanBatchSize, 512), spanQueueSize),
      logDelayMillis: number("OTEL_BLRP_SCHEDULE_DELAY", c.logDelayMillis, 1_000),
      logQueueSize,
      logBatchSize: Math.min(number("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", c.logBatchSize, 512), logQueueSize),
      metricIntervalMillis: number("OTEL_METRIC_EXPORT_INTERVAL", c.metricIntervalMillis, 60_000),
      tracesTimeoutMillis: optionalNumber("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", c.tracesTimeoutMillis),
      metricsTimeoutMillis: optionalNumber("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", c.metricsTimeoutMillis),
      logsTimeoutMillis: optionalNumber("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", c.logsTimeoutMillis),
      spanExportTimeoutMillis: optionalNumber("OTEL_BSP_EXPORT_TIMEOUT", c.spanExportTimeoutMillis),
      logExportTimeoutMillis: optionalNumber("OTEL_BLRP_EXPORT_TIMEOUT", c.logExportTimeoutMillis),
      metricExportTimeoutMillis: optionalNumber("OTEL_METRIC_EXPORT_TIMEOUT", c.metricExportTimeoutMillis),
      tracesHeaders: headers.TRACES,
      metricsHeaders: headers.METRICS,
      logsHeaders: headers.LOGS
    }
    return problems.length === 0
      ? Effect.succeed(result)
      : Effect.fail(new Config.ConfigError(new ConfigProvider.SourceError({ message: [...new Set(problems)].join("; ") })))
  })
)

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
  // Each channel's request bound, and the bound on one export (at least as long: the export waits
  // for its request); the finalizer waits for the longer.
  const tracesTimeout = settings.tracesTimeoutMillis ?? settings.exportTimeoutMillis
  const spanExportTimeout = settings.spanExportTimeoutMillis ?? tracesTimeout
  const metricsTimeout = settings.metricsTimeoutMillis ?? settings.exportTimeoutMillis
  const metricExportTimeout = Math.min(settings.metricExportTimeoutMillis ?? metricsTimeout, settings.metricIntervalMillis)
  const logsTimeout = settings.logsTimeoutMillis ?? settings.exportTimeoutMillis
  const logExportTimeout = settings.logExportTimeoutMillis ?? logsTimeout
  const any = settings.tracesEndpoint !== undefined || settings.metricsEndpoint !== undefined ||
    settings.logsEndpoint !== undefined
  if (!any) return Layer.empty
  const secrets = secretForms([settings.tracesHeaders, settings.metricsHeaders, settings.logsHeaders])

  const diagnostics = Layer.effectDiscard(Effect.flatMap(Effect.context<never>(), (context) =>
    Effect.sync(() =>
      diag.setLogger(boundedDiagLogger(context, secrets), { logLevel: DiagLogLevel.WARN, suppressOverrideMessage: true })
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
            new BatchSpanProcessor(new OTLPTraceExporter({
              url: settings.tracesEndpoint!,
              timeoutMillis: tracesTimeout,
              headers: plainHeaders(settings.tracesHeaders)
            }), {
              maxQueueSize: settings.spanQueueSize,
              maxExportBatchSize: settings.spanBatchSize,
              scheduledDelayMillis: settings.spanDelayMillis,
              exportTimeoutMillis: spanExportTimeout
            })
          ]
        })
        yield* channel(
          "traces",
          () => provider.forceFlush(),
          () => provider.shutdown(),
          Math.max(tracesTimeout, spanExportTimeout)
        )
        return provider
      })
    ))
  )

  const metrics = settings.metricsEndpoint === undefined ? Layer.empty : Layer.unwrap(Effect.gen(function*() {
    const reader = new PeriodicExportingMetricReader({
      exporter: new OTLPMetricExporter({
        url: settings.metricsEndpoint!,
        timeoutMillis: metricsTimeout,
        headers: plainHeaders(settings.metricsHeaders)
      }),
      exportIntervalMillis: settings.metricIntervalMillis,
      exportTimeoutMillis: metricExportTimeout
    })
    yield* channel("metrics", () => reader.forceFlush(), () => reader.shutdown(), Math.max(metricsTimeout, metricExportTimeout))
    // The bridge's producer, registered as `OtelMetrics.layer` would, with the units set.
    return Layer.effectDiscard(
      Effect.flatMap(
        OtelMetrics.makeProducer(),
        (producer) => OtelMetrics.registerProducer(withUnits(producer), () => reader, { shutdownTimeout: metricsTimeout })
      )
    )
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
              exporter: new OTLPLogExporter({
                url: settings.logsEndpoint!,
                timeoutMillis: logsTimeout,
                headers: plainHeaders(settings.logsHeaders)
              }),
              maxQueueSize: settings.logQueueSize,
              maxExportBatchSize: settings.logBatchSize,
              scheduledDelayMillis: settings.logDelayMillis,
              exportTimeoutMillis: logExportTimeout
            })
          ]
        })
        yield* channel("logs", () => provider.forceFlush(), () => provider.shutdown(), Math.max(logsTimeout, logExportTimeout))
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

/**
 * `@jetworker/opentelemetry`: exports the process's traces, metrics and logs over OTLP/HTTP with
 * the OpenTelemetry SDK, configured from the `OTEL_*` environment, as one scoped resource whose
 * flush the worker's shutdown bounds.
 *
 * @since 0.1.0
 */
export * as Otlp from "./Otlp.ts"

/** The units jetworker's metrics are exported with over OTLP. */
import { Telemetry } from "@jetworker/core"
import type { MetricProducer } from "@opentelemetry/sdk-metrics"

/**
 * The units of jetworker's metrics (OpenTelemetry/UCUM: `ms`, and `{...}` annotations for counts):
 * the Effect bridge exports every metric as `1` (dimensionless), which a Prometheus translation
 * turns into a `_ratio` suffix on a gauge of messages, and which drops the milliseconds the
 * durations are documented in.
 */
const units: ReadonlyMap<string, string> = new Map([
  [Telemetry.outcomes.id, "{delivery}"],
  [Telemetry.handlerDuration.id, "ms"],
  [Telemetry.inFlight.id, "{delivery}"],
  [Telemetry.held.id, "{delivery}"],
  [Telemetry.paused.id, "{consumer}"],
  [Telemetry.redeliveries.id, "{delivery}"],
  [Telemetry.retries.id, "{attempt}"],
  [Telemetry.expired.id, "{delivery}"],
  [Telemetry.deadLettered.id, "{delivery}"],
  [Telemetry.stranded.id, "{message}"],
  [Telemetry.settleLatency.id, "ms"],
  [Telemetry.producerClockSkew.id, "ms"],
  [Telemetry.consumerLag.id, "{message}"],
  [Telemetry.ackPending.id, "{message}"]
])

/** `producer` with the units of jetworker's metrics set; any other metric is left as it is. */
export const withUnits = (producer: MetricProducer): MetricProducer => ({
  collect: (options) =>
    producer.collect(options).then((result) => ({
      ...result,
      resourceMetrics: {
        ...result.resourceMetrics,
        scopeMetrics: result.resourceMetrics.scopeMetrics.map((scope) => ({
          ...scope,
          metrics: scope.metrics.map((metric) => {
            const unit = units.get(metric.descriptor.name)
            return unit === undefined || metric.descriptor.unit !== "1"
              ? metric
              : { ...metric, descriptor: { ...metric.descriptor, unit } }
          })
        }))
      }
    }))
})

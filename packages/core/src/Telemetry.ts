/**
 * Every telemetry name jetworker uses, in one place: the span names and attributes (after the
 * OpenTelemetry messaging semantic conventions), the metrics (Effect `Metric`s, exported by
 * whatever the process wires: the `/metrics` endpoint, an OTLP exporter), and W3C trace context
 * (`traceparent`) carried in message headers.
 *
 * It depends on nothing but `effect`: spans are made with Effect's own tracer, and a parent from
 * a message header is an `ExternalSpan`, so core and the adapters never depend on the
 * OpenTelemetry SDK; `@jetworker/opentelemetry` only exports.
 *
 * @since 0.1.0
 */
import { Metric, Tracer } from "effect"

/** Span and metric attribute names. */
export const Attribute = {
  /** `messaging.system`: always `nats`. */
  messagingSystem: "messaging.system",
  /** `messaging.operation.type`: `process` (consumer), `send` (publisher). */
  operationType: "messaging.operation.type",
  /** `messaging.operation.name`: `process` or `publish`. */
  operationName: "messaging.operation.name",
  /** `messaging.destination.name`: the subject. */
  destinationName: "messaging.destination.name",
  /** `messaging.consumer.group.name`: the consumer's name. */
  consumerGroup: "messaging.consumer.group.name",
  /** `messaging.message.id`: the event id (`Nats-Msg-Id`). */
  messageId: "messaging.message.id",
  /** `messaging.message.body.size`: payload bytes. */
  bodySize: "messaging.message.body.size",
  /** `messaging.batch.message_count`: the messages of a batch (batch consumers). */
  batchSize: "messaging.batch.message_count",
  /** `jetworker.outcome`: the delivery's outcome tag. */
  outcome: "jetworker.outcome",
  /** `jetworker.outcome.reason`: the outcome's reason, where it has one. */
  outcomeReason: "jetworker.outcome.reason",
  /** `jetworker.attempt`: the server's delivery count. */
  attempt: "jetworker.attempt",
  /** `jetworker.stream.sequence`: the message's stream sequence. */
  streamSequence: "jetworker.stream.sequence",
  /** `jetworker.stream`: the stream a published message must be stored by. */
  stream: "jetworker.stream"
} as const

/** The `messaging.system` value. */
export const messagingSystem = "nats"

/**
 * The span of one delivery (or one batch), kind consumer: `process <source>`, `source` the name of
 * the consumer's `Source` (`<stream>/<consumer>` for a JetStream source, e.g.
 * `process ORDERS/order-projector`). Named by the consumer, not the subject, as OpenTelemetry's
 * messaging conventions ask of a span name (few distinct values): a subject often carries an entity
 * id (`orders.created.8812`), and it is the `messaging.destination.name` attribute.
 */
export const processSpanName = (source: string): string => `process ${source}`

/**
 * The span of one confirmed publish, kind producer: `send <stream>` when the publish names the
 * stream that must store it (`Publisher`'s `stream` option, as the outbox relay's
 * `outboxPublisher({ stream })` does), `send` alone otherwise; the subject, which may carry an
 * entity id, is the `messaging.destination.name` attribute.
 */
export const sendSpanName = (stream?: string | undefined): string => stream === undefined ? "send" : `send ${stream}`

// ---------------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------------

/** Deliveries settled, by `consumer` and `outcome`. */
export const outcomes = Metric.counter("jetworker.outcomes", {
  description: "Deliveries settled, by consumer and outcome",
  incremental: true
})

/** Handler time per attempt in milliseconds, by `consumer`. */
export const handlerDuration = Metric.histogram("jetworker.handler.duration", {
  description: "Time from receipt to the handler's exit, in milliseconds, by consumer",
  boundaries: Metric.exponentialBoundaries({ start: 1, factor: 2, count: 16 })
})

/** Deliveries being processed now, by `consumer`. */
export const inFlight = Metric.gauge("jetworker.in_flight", {
  description: "Deliveries being processed now, by consumer"
})

/**
 * Deliveries held now while a dependency the consumer pauses on is down (their failures not
 * counted; see `Consumer.make`'s `dependencies`), by `consumer`.
 */
export const held = Metric.gauge("jetworker.held", {
  description: "Deliveries held while a dependency is down, by consumer"
})

/** 1 while the consumer is paused on a dependency that is down (it takes no new delivery), else 0, by `consumer`. */
export const paused = Metric.gauge("jetworker.paused", {
  description: "1 while the consumer is paused on a dependency that is down, else 0, by consumer"
})

/** Deliveries whose server delivery count is above 1, by `consumer`. */
export const redeliveries = Metric.counter("jetworker.redeliveries", {
  description: "Deliveries that were redelivered by the broker (delivery count above 1), by consumer",
  incremental: true
})

/** Attempts that ended in a retry (in-process or nak with delay), by `consumer`. */
export const retries = Metric.counter("jetworker.retries", {
  description: "Failed attempts that will be retried, by consumer",
  incremental: true
})

/** Expired work, by `consumer` and `stage`. */
export const expired = Metric.counter("jetworker.expired", {
  description: "Deliveries that expired before their effect, by consumer and stage",
  incremental: true
})

/** Dead-lettered deliveries (`Rejected` and `DeadLettered`), by `consumer` and `reason`. */
export const deadLettered = Metric.counter("jetworker.dead_lettered", {
  description: "Deliveries stored in the dead-letter stream, by consumer and reason",
  incremental: true
})

/**
 * Dead letters that could not be written by the broker's last delivery (MaxDeliver): the message
 * stays in its stream, no longer delivered, until recovered. By `consumer`. Alert on it.
 */
export const stranded = Metric.counter("jetworker.stranded", {
  description: "Messages whose dead letter failed on the broker's last delivery; recover them by sequence",
  incremental: true
})

/** Round trip of the broker command that settled a delivery, in milliseconds, by `consumer` and `command`. */
export const settleLatency = Metric.histogram("jetworker.settle.latency", {
  description: "Time for the broker to confirm an ack, nak or dead letter, in milliseconds, by consumer and command",
  boundaries: Metric.exponentialBoundaries({ start: 0.25, factor: 2, count: 16 })
})

/**
 * The last producer clock skew seen, by `consumer`: the broker's stored time of a message minus
 * the producer's `time` (creation) in its event, in milliseconds. Negative when the producer's
 * clock runs ahead of the broker's. Expiry is judged on the consumer's clock with the consumer's
 * skew allowance; watch this against that allowance.
 */
export const producerClockSkew = Metric.gauge("jetworker.producer.clock_skew", {
  description: "Broker stored time minus the producer's event time, in milliseconds (last seen), by consumer"
})

/** Messages not yet delivered to the consumer (the server's `num_pending`), by `consumer` and `stream`. */
export const consumerLag = Metric.gauge("jetworker.consumer.lag", {
  description: "Messages waiting on the server for the consumer (num_pending), by consumer and stream"
})

/** Messages delivered and not yet settled (the server's `num_ack_pending`), by `consumer` and `stream`. */
export const ackPending = Metric.gauge("jetworker.consumer.ack_pending", {
  description: "Messages delivered to the consumer and not yet acknowledged (num_ack_pending), by consumer and stream"
})

// ---------------------------------------------------------------------------------------------
// W3C trace context
// ---------------------------------------------------------------------------------------------

/** The W3C trace context header. */
export const traceparentHeader = "traceparent"

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/

/**
 * Reads a `traceparent` header (`00-<trace id>-<span id>-<flags>`) as the parent of a span, or
 * `undefined` when it is missing or malformed (an all-zero id, version `ff`, wrong lengths).
 */
export const parseTraceparent = (value: string | undefined): Tracer.ExternalSpan | undefined => {
  if (value === undefined) return undefined
  const match = TRACEPARENT.exec(value.trim().toLowerCase())
  if (match === null) return undefined
  const [, version, traceId, spanId, flags, rest] = match
  if (version === "ff" || (version === "00" && rest !== undefined)) return undefined
  if (/^0+$/.test(traceId!) || /^0+$/.test(spanId!)) return undefined
  return Tracer.externalSpan({ traceId: traceId!, spanId: spanId!, sampled: (parseInt(flags!, 16) & 1) === 1 })
}

/** The `traceparent` value naming `span` as the parent. */
export const formatTraceparent = (span: { readonly traceId: string; readonly spanId: string; readonly sampled: boolean }): string =>
  `00-${span.traceId.padStart(32, "0")}-${span.spanId.padStart(16, "0")}-${span.sampled ? "01" : "00"}`

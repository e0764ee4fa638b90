/**
 * Confirmed JetStream publishing (INT-NATS-007): a publish succeeds only on a PubAck from the
 * expected stream with a positive sequence. The caller gives the stable id (`Nats-Msg-Id`,
 * equal to the event id for events) before the first attempt; on a timeout, a missing responder
 * or a broken connection the same message is sent again with the same id, so the stream's
 * duplicate window turns a publish that was in fact stored into `duplicate: true`. Retries follow
 * a jittered, capped, finite `Schedule`. Each publish is a `send <subject>` span (kind producer)
 * whose W3C `traceparent` goes in the message's headers, so the consumer's span continues it.
 *
 * @since 0.1.0
 */
import type { PubAck } from "@nats-io/jetstream"
import { headers as makeHeaders } from "@nats-io/transport-node"
import { Envelope, Telemetry } from "@jetworker/core"
import { Duration, Effect, Schedule } from "effect"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

/** Options of one publish. */
export interface PublishOptions {
  /** The stable application id, sent as `Nats-Msg-Id` on every attempt. */
  readonly msgId: string
  /** The stream that must store it; a PubAck from another stream is an error. */
  readonly stream: string
  /** Extra headers. */
  readonly headers?: ReadonlyArray<readonly [string, string]> | undefined
  /** Attempts in all, 1 to 100. Default: 5. */
  readonly attempts?: number | undefined
  /** Bound on each attempt. Default: the connection's API timeout. */
  readonly timeout?: Duration.Input | undefined
}

/**
 * Accepts a PubAck only from `stream` with a positive sequence: nats.js itself rejects only an
 * empty stream name, so a non-JetStream responder's `{}` would otherwise pass as stored.
 */
export const checkPubAck = (operation: string, stream: string, ack: PubAck): Effect.Effect<PubAck, NatsError.NatsError> =>
  ack.stream === stream && ack.seq > 0
    ? Effect.succeed(ack)
    : Effect.fail(
      new NatsError.NatsError({
        reason: "InvalidReply",
        operation,
        message: `expected a PubAck from stream ${stream}, got ${JSON.stringify(ack)}`
      })
    )

const retrySchedule = (attempts: number) =>
  Schedule.exponential("100 millis", 2).pipe(
    Schedule.jittered,
    Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, Duration.seconds(2)))),
    Schedule.upTo({ times: Math.max(0, attempts - 1) })
  )

/** Publishes `payload` to `subject` until the stream confirms it, retrying with the same id. */
export const publish = (
  subject: string,
  payload: Uint8Array,
  options: PublishOptions
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const operation = `publish ${subject}`
    const attempts = options.attempts ?? 5
    if (!Number.isInteger(attempts) || attempts < 1 || attempts > 100) {
      return yield* new NatsError.NatsError({ reason: "ApiError", operation, message: "attempts must be 1 to 100" })
    }
    if (!/^[\x21-\x7e]{1,200}$/.test(options.msgId)) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation,
        message: "msgId must be 1 to 200 printable ASCII characters without spaces"
      })
    }
    const { jetstream, apiTimeoutMillis } = yield* NatsConnection
    const timeout = options.timeout === undefined
      ? apiTimeoutMillis
      : Duration.toMillis(Duration.fromInputUnsafe(options.timeout))
    // The publish's own span is the parent the consumer's span continues (W3C `traceparent`).
    const span = yield* Effect.currentSpan.pipe(Effect.option)
    const traceparent = span._tag === "Some" ? Telemetry.formatTraceparent(span.value) : undefined
    const once = Effect.tryPromise({
      try: () => {
        const h = makeHeaders()
        for (const [name, value] of options.headers ?? []) {
          if (traceparent === undefined || name.toLowerCase() !== Telemetry.traceparentHeader) h.append(name, value)
        }
        if (traceparent !== undefined) h.set(Telemetry.traceparentHeader, traceparent)
        return jetstream.publish(subject, payload, {
          msgID: options.msgId,
          headers: h,
          expect: { streamName: options.stream },
          timeout
        })
      },
      catch: (error) => NatsError.fromUnknown(operation, error)
    }).pipe(Effect.flatMap((ack) => checkPubAck(operation, options.stream, ack)))
    return yield* once.pipe(Effect.retry({ schedule: retrySchedule(attempts), while: (error) => error.isRetryable }))
  }).pipe(
    Effect.withSpan(Telemetry.sendSpanName(subject), {
      kind: "producer",
      attributes: {
        [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
        [Telemetry.Attribute.operationType]: "send",
        [Telemetry.Attribute.operationName]: "publish",
        [Telemetry.Attribute.destinationName]: subject,
        [Telemetry.Attribute.messageId]: options.msgId,
        [Telemetry.Attribute.bodySize]: payload.byteLength,
        [Telemetry.Attribute.stream]: options.stream
      }
    })
  )

const encoder = new TextEncoder()

/** Publishes an event envelope as JSON, with `Nats-Msg-Id` equal to its id. */
export const publishEnvelope = <Type extends string, A>(
  subject: string,
  envelope: Envelope.Envelope<Type, A>,
  options: Omit<PublishOptions, "msgId">
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  publish(
    subject,
    encoder.encode(JSON.stringify({
      id: envelope.id,
      type: envelope.type,
      time: new Date(envelope.time.epochMilliseconds).toISOString(),
      ...(envelope.expiresAt === undefined
        ? {}
        : { expiresAt: new Date(envelope.expiresAt.epochMilliseconds).toISOString() }),
      data: envelope.data
    })),
    { ...options, msgId: envelope.id }
  )

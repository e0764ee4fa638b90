/**
 * The event envelope: the stable identity and timing that every message carries, as an effect
 * `Schema`. The engine needs only {@link Metadata} (id, creation time, optional expiry); events
 * whose wire format is not an envelope map themselves to it with the consumer's `metadata`
 * option. This module does no I/O and knows nothing of any broker.
 *
 * @since 0.1.0
 */
import { Clock, DateTime, type Duration, Effect, Schema } from "effect"

/** What the engine reads from every event: its stable id, creation time and optional expiry. */
export interface Metadata {
  /** The producer's stable id: the deduplication key, equal to `Nats-Msg-Id` on JetStream. */
  readonly id: string
  /** When the producer created the event, on the producer's clock. */
  readonly time: DateTime.Utc
  /** The instant after which the event must have no business effect (BE-JOB-005). */
  readonly expiresAt?: DateTime.Utc | undefined
}

/**
 * A stable event id: 1 to 200 printable ASCII characters without spaces, so that it is safe as a
 * NATS header value (`Nats-Msg-Id`) and as a database key.
 */
export const EventId = Schema.String.check(
  Schema.isPattern(/^[\x21-\x7e]{1,200}$/, {
    expected: "an event id of 1 to 200 printable ASCII characters without spaces"
  })
)

/** The decoded envelope of an event of type `Type` carrying `A`. */
export interface Envelope<Type extends string, A> extends Metadata {
  readonly type: Type
  readonly data: A
}

/**
 * The schema of an envelope on the wire: `{ id, type, time, expiresAt?, data }` where `time` and
 * `expiresAt` are ISO-8601 strings and `type` must equal `type`.
 */
export const schema = <const Type extends string, S extends Schema.Top>(type: Type, data: S) =>
  Schema.Struct({
    id: EventId,
    type: Schema.Literal(type),
    time: Schema.DateTimeUtcFromString,
    expiresAt: Schema.optional(Schema.DateTimeUtcFromString),
    data
  })

/**
 * Builds an envelope stamped with the current `Clock` time and, unless given, a random id. Give an
 * id derived from business data when the producer may retry (INT-NATS-007).
 */
export const make = <const Type extends string, A>(options: {
  readonly type: Type
  readonly data: A
  readonly id?: string | undefined
  /** How long the event stays worth doing; no expiry when omitted. */
  readonly ttl?: Duration.Input | undefined
}): Effect.Effect<Envelope<Type, A>> =>
  Effect.map(Clock.currentTimeMillis, (now) => {
    const time = DateTime.makeUnsafe(now)
    return {
      id: options.id ?? crypto.randomUUID(),
      type: options.type,
      time,
      expiresAt: options.ttl === undefined ? undefined : DateTime.addDuration(time, options.ttl),
      data: options.data
    }
  })

/**
 * Whether `metadata` has expired at `nowMillis` (epoch milliseconds), allowing `skewMillis` for
 * the difference between the producer's and the consumer's clocks (the event counts as expired
 * only once `now` is past `expiresAt + skew`).
 */
export const isExpired = (metadata: Metadata, nowMillis: number, skewMillis: number): boolean =>
  metadata.expiresAt !== undefined && nowMillis > metadata.expiresAt.epochMilliseconds + skewMillis

/**
 * The wire form of `envelope`, as {@link schema} decodes it: `{ id, type, time, expiresAt?, data }`
 * with the times as ISO-8601 strings. `data` is written as `JSON.stringify` writes it; data with
 * encodings of its own (dates, bigints) must be encoded with its schema first.
 */
export const toJson = <Type extends string, A>(envelope: Envelope<Type, A>): string =>
  JSON.stringify({
    id: envelope.id,
    type: envelope.type,
    time: DateTime.formatIso(envelope.time),
    ...(envelope.expiresAt === undefined ? {} : { expiresAt: DateTime.formatIso(envelope.expiresAt) }),
    data: envelope.data
  })

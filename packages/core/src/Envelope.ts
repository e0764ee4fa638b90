/**
 * The event envelope: the stable identity and timing that every message carries, as an effect
 * `Schema`. The engine needs only {@link Metadata} (id, creation time, optional expiry); events
 * whose wire format is not an envelope map themselves to it with the consumer's `metadata`
 * option. This module does no I/O and knows nothing of any broker.
 *
 * @since 0.1.0
 */
import { Clock, Data, DateTime, Duration, Effect, Schema } from "effect"
import * as DurationInput from "./DurationInput.ts"
import * as EnvelopeDecoder from "./internal/envelopeDecoder.ts"

/** What the engine reads from every event: its stable id, creation time and optional expiry. */
export interface Metadata {
  /** The producer's stable id: the deduplication key, equal to `Nats-Msg-Id` on JetStream. */
  readonly id: string
  /** When the producer created the event, on the producer's clock. */
  readonly time: DateTime.Utc
  /** The instant after which the event must have no business effect (BE-JOB-005). */
  readonly expiresAt?: DateTime.Utc | undefined
}

const eventIdPattern = /^[\x21-\x7e]{1,200}$/

/**
 * A stable event id: 1 to 200 printable ASCII characters without spaces, so that it is safe as a
 * NATS header value (`Nats-Msg-Id`) and as a database key.
 */
export const EventId = Schema.String.check(
  Schema.isPattern(eventIdPattern, {
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
export const schema = <const Type extends string, S extends Schema.Top>(type: Type, data: S) => {
  const envelope = Schema.Struct({
    id: EventId,
    type: Schema.Literal(type),
    time: Schema.DateTimeUtcFromString,
    expiresAt: Schema.optional(Schema.DateTimeUtcFromString),
    data
  })
  // The consumer decodes with it first (see `internal/envelopeDecoder.ts`): same results, less work.
  EnvelopeDecoder.register(envelope, type, eventIdPattern, data)
  return envelope
}

/** A `ttl` that gives no expiry an event can carry: NaN, negative, or past the last representable date. */
export class InvalidTtl extends Data.TaggedError("InvalidTtl")<{ readonly message: string }> {}

/** The options of {@link make}. */
export interface MakeOptions<Type extends string, A> {
  readonly type: Type
  readonly data: A
  readonly id?: string | undefined
  /**
   * How long the event stays worth doing, from its creation time: a duration of 0 or more, or
   * `Duration.infinity` for no expiry. No expiry when omitted.
   */
  readonly ttl?: Duration.Input | undefined
}

/** The latest instant a `Date` (so an ISO-8601 `expiresAt`) can hold: 8.64e15 ms after the epoch. */
const maxEpochMillis = 8.64e15

/** The expiry `ttl` after `time`: `undefined` for none (no or an infinite ttl), or why it cannot be one. */
const expiryOf = (time: DateTime.Utc, ttl: Duration.Input | undefined): DateTime.Utc | undefined | InvalidTtl => {
  if (ttl === undefined) return undefined
  const invalid = (why: string) => new InvalidTtl({ message: `ttl must be ${why}, got ${DurationInput.show(ttl)}` })
  // effect reads a NaN as 0: an event meant to live a while would be born expired.
  const parsed = DurationInput.parse(ttl)
  if (parsed === undefined) return invalid("a duration such as \"5 minutes\", or Duration.infinity for no expiry")
  if (Duration.isNegative(parsed)) return invalid("0 or more (a negative ttl makes an event that is expired when created)")
  if (!Duration.isFinite(parsed)) return undefined
  const expiresAt = DateTime.addDuration(time, parsed)
  // Past the last date a `Date` holds, the expiry has no ISO-8601 form (`toJson` could not write it).
  return Math.abs(expiresAt.epochMilliseconds) <= maxEpochMillis
    ? expiresAt
    : invalid(`short enough that the expiry falls before +275760-09-13 (use Duration.infinity for no expiry)`)
}

/**
 * Builds an envelope stamped with the current `Clock` time and, unless given, a random id. Give an
 * id derived from business data when the producer may retry (INT-NATS-007). `ttl` sets
 * `expiresAt` = time + ttl (none for `Duration.infinity`); a NaN, negative or out-of-range ttl
 * fails with {@link InvalidTtl}, which only a call that gives a `ttl` can.
 */
export function make<const Type extends string, A>(
  options: MakeOptions<Type, A> & { readonly ttl?: undefined }
): Effect.Effect<Envelope<Type, A>>
export function make<const Type extends string, A>(options: MakeOptions<Type, A>): Effect.Effect<Envelope<Type, A>, InvalidTtl>
export function make<const Type extends string, A>(options: MakeOptions<Type, A>): Effect.Effect<Envelope<Type, A>, InvalidTtl> {
  return Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const time = DateTime.makeUnsafe(now)
    const expiresAt = expiryOf(time, options.ttl)
    if (expiresAt instanceof InvalidTtl) return Effect.fail(expiresAt)
    return Effect.succeed({ id: options.id ?? crypto.randomUUID(), type: options.type, time, expiresAt, data: options.data })
  })
}

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
 * encodings of its own (dates, bigints) must be encoded with its schema first. It throws what
 * `JSON.stringify` throws (a bigint, a cycle) and a `RangeError` for a time outside the `Date`
 * range; `Publisher.publishEnvelope` and `Outbox.recordEnvelope` fail with their error instead.
 */
export const toJson = <Type extends string, A>(envelope: Envelope<Type, A>): string =>
  JSON.stringify({
    id: envelope.id,
    type: envelope.type,
    time: DateTime.formatIso(envelope.time),
    ...(envelope.expiresAt === undefined ? {} : { expiresAt: DateTime.formatIso(envelope.expiresAt) }),
    data: envelope.data
  })

/**
 * Publishing from inside a transaction (INT-NATS-007): a handler, or any service code, records an
 * event to publish in the same database transaction as its effects and its dedup row, so the
 * event exists exactly when the effects do; a relay publishes the recorded events afterwards,
 * with confirmed publishes and the event's id as `Nats-Msg-Id`, so a relay that dies between the
 * publish and marking the row sent republishes an id the stream deduplicates.
 *
 * This module holds the two ports only, so that no adapter imports another: {@link Outbox} is
 * where records go (`@jetworker/sql-pg`'s `PgOutbox` writes rows and runs the relay), and
 * {@link OutboxPublisher} is how the relay publishes (`@jetworker/nats`'s
 * `Publisher.outboxPublisher`, wired by the application).
 *
 * @since 0.1.0
 */
import { Context, Data, type Duration, Effect } from "effect"
import * as Envelope from "./Envelope.ts"

/** One event to publish. */
export interface OutboxMessage {
  /** The subject to publish to; the stream that captures it must store it. */
  readonly subject: string
  /**
   * The stable id, sent as `Nats-Msg-Id` on every attempt: the event's id for an event. Unique per
   * event (not an id that several events share, such as their aggregate's): the stream keeps one message
   * per id within its duplicate window and drops a second as a duplicate, so an outbox refuses an
   * id it still holds (`PgOutbox`: `OutboxError` naming it).
   */
  readonly id: string
  readonly payload: Uint8Array
  /** Extra headers (not `Nats-Msg-Id`, which is the id). */
  readonly headers?: ReadonlyArray<readonly [string, string]> | undefined
}

/** Whether a header name would be taken for `Nats-Msg-Id` (NATS 2.9 finds headers by substring). */
export const isReservedHeader = (name: string): boolean => name.toLowerCase().includes("nats-msg-id")

const printable = /^[\x21-\x7e]+$/

/** Whether `id` can be a `Nats-Msg-Id`: 1 to 200 printable ASCII characters without spaces. */
export const isValidId = (id: string): boolean => /^[\x21-\x7e]{1,200}$/.test(id)

/**
 * The longest subject, in UTF-8 bytes, that can be published: 3840. A publish's control line
 * (`HPUB <subject> <reply> <header bytes> <total bytes>`) must fit the server's `max_control_line`,
 * 4096 bytes by default, or the server closes the connection; 256 bytes are left for the verb, the
 * reply inbox (38 bytes with nats.js's default prefix), the two lengths and the separators. A
 * server configured with a lower `max_control_line` needs shorter subjects still.
 */
export const maxSubjectBytes = 3840

const encoder = new TextEncoder()

/** The UTF-8 length of `subject`, as the server counts it. */
export const subjectBytes = (subject: string): number => encoder.encode(subject).byteLength

/**
 * What makes `subject` impossible to publish to, or `undefined` when it is a literal NATS subject:
 * dot-separated tokens without spaces or control characters (none empty), no wildcard (`*`, `>`:
 * JetStream would store the message under that literal name, which no consumer filter reaches as
 * meant), at most {@link maxSubjectBytes} bytes of UTF-8. The message starts with the subject, so
 * it reads on its own. `Publisher.publish` refuses the same subjects with the same words.
 */
export const subjectProblem = (subject: string): string | undefined => {
  const tokens = subject.split(".")
  // NATS takes any characters in a token but whitespace and control characters (UTF-8 included).
  if (subject.length === 0 || tokens.some((token) => token === "" || /[\s\p{Cc}]/u.test(token))) {
    return `subject ${JSON.stringify(subject)}: must be dot-separated tokens without spaces or control characters`
  }
  if (tokens.some((token) => token === "*" || token === ">")) {
    return `subject ${JSON.stringify(subject)}: a wildcard cannot be published to`
  }
  const bytes = subjectBytes(subject)
  if (bytes > maxSubjectBytes) {
    // Quoting a subject this long would bury the rest of the message: its start is enough.
    return `subject ${JSON.stringify(`${subject.slice(0, 60)}…`)}: ${bytes} bytes, ` +
      `more than the ${maxSubjectBytes} that fit a NATS control line`
  }
  return undefined
}

/**
 * The default largest message an outbox records, in bytes as {@link messageBytes} counts them:
 * 1 MiB (1 048 576), NATS's default `max_payload`.
 */
export const defaultMaxMessageBytes = 1024 * 1024

/**
 * The headers a relay's publisher (`Publisher.outboxPublisher`) adds to every message besides
 * `Nats-Msg-Id`, with the size of the longest value each takes: a stream name of up to 255 bytes,
 * and a W3C `traceparent`.
 */
const addedHeaders: ReadonlyArray<readonly [string, number]> = [
  ["Nats-Expected-Stream", 255],
  ["traceparent", "00-00000000000000000000000000000000-0000000000000000-00".length]
]

/**
 * The size of `message` as a NATS server measures it against its `max_payload`: the payload plus
 * the encoded header block (`NATS/1.0`, then `\r\n<name>: <value>` per header, then `\r\n\r\n`,
 * in UTF-8), counting the message's own headers and the ones the relay's publisher adds
 * (`Nats-Msg-Id: <id>`, `Nats-Expected-Stream` with a stream name of up to 255 bytes, and a
 * `traceparent`), so that a message within an outbox's limit is one the publisher can send.
 */
export const messageBytes = (message: OutboxMessage): number => {
  const header = (name: string, valueBytes: number) => 4 + encoder.encode(name).byteLength + valueBytes
  let bytes = message.payload.byteLength + "NATS/1.0".length + 4 + header("Nats-Msg-Id", encoder.encode(message.id).byteLength)
  for (const [name, valueBytes] of addedHeaders) bytes += header(name, valueBytes)
  for (const [name, value] of message.headers ?? []) bytes += header(name, encoder.encode(value).byteLength)
  return bytes
}

/** What {@link problems} checks beyond the message itself. */
export interface Limits {
  /**
   * The largest message, in bytes as {@link messageBytes} counts them (payload and headers), that
   * can be published: at most the NATS server's `max_payload`. Default:
   * {@link defaultMaxMessageBytes} (1 MiB, NATS's default `max_payload`).
   */
  readonly maxMessageBytes?: number | undefined
}

/**
 * What makes `message` impossible to publish, checked before it is recorded: a row that can never
 * be published would hold back every row recorded after it. Empty: it can be published. The id
 * must be 1 to 200 printable ASCII characters without spaces (it is the `Nats-Msg-Id`); the
 * subject a literal NATS subject ({@link subjectProblem}); a header name printable without `:`,
 * not containing `Nats-Msg-Id`, its value on one line; the whole, payload and headers
 * ({@link messageBytes}), at most `limits.maxMessageBytes` bytes (default 1 MiB, NATS's default
 * `max_payload`: the server refuses a larger message, for good).
 */
export const problems = (message: OutboxMessage, limits: Limits = {}): ReadonlyArray<string> => {
  const found: Array<string> = []
  if (!isValidId(message.id)) {
    found.push(`id ${JSON.stringify(message.id)}: must be 1 to 200 printable ASCII characters without spaces`)
  }
  const subject = subjectProblem(message.subject)
  if (subject !== undefined) found.push(subject)
  for (const [name, value] of message.headers ?? []) {
    if (isReservedHeader(name)) {
      found.push(`header ${JSON.stringify(name)}: not allowed, the id goes in Nats-Msg-Id (a second header containing ` +
        `"Nats-Msg-Id" would make NATS 2.9 skip deduplication)`)
    } else if (!printable.test(name) || name.includes(":")) {
      found.push(`header ${JSON.stringify(name)}: a name is printable ASCII without spaces or ":"`)
    } else if (/[\r\n]/.test(value)) {
      found.push(`header ${JSON.stringify(name)}: its value must be one line`)
    }
  }
  const limit = limits.maxMessageBytes ?? defaultMaxMessageBytes
  const bytes = messageBytes(message)
  if (bytes > limit) {
    found.push(`${bytes} bytes (a ${message.payload.byteLength}-byte payload and its headers as published), more than the ` +
      `${limit} bytes of maxMessageBytes: the NATS server refuses a message larger than its max_payload (1 MiB by default)`)
  }
  return found
}

/** The event could not be recorded (its transaction then fails with the rest of its effects). */
export class OutboxError extends Data.TaggedError("OutboxError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** Where recorded events go: inside the current transaction of the store that implements it. */
export class Outbox extends Context.Service<Outbox, {
  /** Records `message` in the current transaction (see {@link record}). */
  readonly record: (message: OutboxMessage) => Effect.Effect<void, OutboxError>
}>()("@jetworker/core/Outbox") {}

/**
 * Records `message` to be published once the current transaction commits (run it inside the
 * transaction: in a handler, inside `IdempotencyStore.commit`'s effect). A message that could
 * never be published ({@link problems}) fails with `OutboxError`, which rolls the transaction back,
 * and so does one whose id the outbox still holds: ids must be unique per event.
 *
 * ```ts
 * import { IdempotencyStore, Outbox } from "@jetworker/core"
 * import { Effect } from "effect"
 * import { SqlClient } from "effect/sql"
 *
 * // The shipment, its dedup row and the event announcing it commit together; the relay publishes
 * // the event afterwards, with `Nats-Msg-Id` equal to `id`.
 * const ship = (order: { readonly id: string; readonly sku: string }) =>
 *   IdempotencyStore.commit(order.id, Effect.gen(function*() {
 *     const sql = yield* SqlClient.SqlClient
 *     yield* sql`INSERT INTO shipments (order_id, sku) VALUES (${order.id}, ${order.sku})`
 *     yield* Outbox.record({
 *       subject: `shipments.created.${order.id}`,
 *       id: `shipment-${order.id}`,
 *       payload: new TextEncoder().encode(JSON.stringify({ orderId: order.id }))
 *     })
 *   }))
 * ```
 */
export const record = (message: OutboxMessage): Effect.Effect<void, OutboxError, Outbox> =>
  Outbox.use((outbox) => outbox.record(message))

/**
 * Records an event envelope as JSON (`Envelope.toJson`), with its id as `Nats-Msg-Id`. An
 * envelope JSON cannot write (data holding a bigint or a cycle, a time outside the `Date` range)
 * fails with `OutboxError` when run, and records nothing.
 */
export const recordEnvelope = <Type extends string, A>(
  subject: string,
  envelope: Envelope.Envelope<Type, A>
): Effect.Effect<void, OutboxError, Outbox> =>
  Effect.try({
    // Written when run, not when the effect is built: a throw there would escape the caller's effect.
    try: () => encoder.encode(Envelope.toJson(envelope)),
    catch: (cause) =>
      new OutboxError({
        message: `event ${JSON.stringify(envelope.id)} cannot be written as JSON: ${cause instanceof Error ? cause.message : String(cause)}`,
        cause
      })
  }).pipe(Effect.flatMap((payload) => record({ subject, id: envelope.id, payload })))

/** A publish that was not confirmed; `retryable` says whether the same publish may succeed later. */
export class PublishFailed extends Data.TaggedError("PublishFailed")<{
  readonly message: string
  readonly retryable: boolean
}> {}

/**
 * How the relay publishes one recorded event: it succeeds only once the broker has stored it
 * (or found it a duplicate of an earlier publish of the same message; a duplicate of another
 * message that holds its id is a failure, else the event would be marked sent and lost).
 */
export class OutboxPublisher extends Context.Service<OutboxPublisher, {
  /** Publishes one recorded event, with the trace context of the transaction that recorded it. */
  readonly publish: (message: OutboxMessage, traceparent: string | undefined) => Effect.Effect<void, PublishFailed>
  /**
   * Optional: run once when a relay starts, to compare the relay's settings with the broker's and
   * log a warning for what would go wrong (it never fails, and bounds its own waits).
   * `Publisher.outboxPublisher` warns when `maxMessageBytes` exceeds the server's `max_payload`,
   * and when the stream it names deduplicates for less than the relay's republish period.
   */
  readonly checkRelay?: ((relay: RelaySettings) => Effect.Effect<void>) | undefined
}>()("@jetworker/core/OutboxPublisher") {}

/** What a relay tells its publisher when it starts ({@link OutboxPublisher}'s `checkRelay`). */
export interface RelaySettings {
  /** The largest message the relay's outbox records, in bytes as {@link messageBytes} counts them. */
  readonly maxMessageBytes: number
  /**
   * How long a round may go on publishing before it marks its rows sent (`roundBudget`). A round
   * that does not commit leaves its rows to the next one: with the publisher's own republish
   * horizon, this is how long after a row's first publish it may be published again, which the
   * stream's duplicate window should cover.
   */
  readonly roundBudget: Duration.Duration
}

/**
 * The dead-letter stream: where a message with a terminal failure (rejected, dead-lettered, or
 * expired when the contract says so) is kept for investigation and controlled replay
 * (BE-JOB-003). A dead-letter message carries the original payload unchanged, the original
 * headers (a `Nats-*` header `H` is kept as `Jetworker-Original-H`, so it cannot deduplicate or
 * set expectations in the dead-letter stream), and `Jetworker-*` headers with the original
 * stream, consumer, subject, sequence, delivery count, outcome, reason and the cause as JSON.
 *
 * The publish is confirmed (PubAck checked for the right stream) and carries a `Nats-Msg-Id`
 * derived from the original stream, consumer and sequence, so publishing the same failure twice
 * stores it once. Replay republishes the original to its original subject (confirmed, with its
 * own stable id), then deletes it from the dead-letter stream.
 *
 * @since 0.1.0
 */
import type { PubAck } from "@nats-io/jetstream"
import type { MsgHdrs } from "@nats-io/transport-node"
import { createHash } from "node:crypto"
import type { Outcome } from "@jetworker/core"
import { DateTime, Duration, Effect } from "effect"
import * as ControlHeaders from "./internal/controlHeaders.ts"
import { Header, keptName } from "./internal/deadLetterHeaders.ts"
import { type DeadLetterMessage, read } from "./internal/deadLetterReader.ts"
import { explainUnansweredPublish } from "./internal/unansweredPublish.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"
import { checkPubAck } from "./Publisher.ts"
import * as Topology from "./Topology.ts"

export { Header } from "./internal/deadLetterHeaders.ts"
export { type DeadLetterMessage, list, read } from "./internal/deadLetterReader.ts"

/** Where a source's dead letters go, and the limits of that stream. */
export interface Options {
  /**
   * Dead-letter stream name. Several sources may share one: each adds its own subject to it (give
   * them the same limits, or each ensure resets the stream's limits to its own). Default:
   * `<source stream>_DLQ`.
   */
  readonly stream?: string | undefined
  /** Subject prefix; messages go to `<prefix>.<source stream>.<consumer>`. Default: `jetworker.dlq`. */
  readonly subjectPrefix?: string | undefined
  /** Create the stream when missing. Default: true. */
  readonly create?: boolean | undefined
  /**
   * Oldest dead letter kept. Default: 30 days for a stream this creates; a live stream keeps its
   * own when this is not given (an operator may have raised it).
   */
  readonly maxAge?: Duration.Input | undefined
  /**
   * Size limit; when full, new dead letters are refused (and their messages stay in the source).
   * Default: 1 GiB for a stream this creates; a live stream keeps its own when this is not given.
   */
  readonly maxBytes?: number | undefined
  /**
   * Whether a `maxAge` or `maxBytes` that would delete stored dead letters at once (lower than what
   * the live stream holds) may be applied. Default: false, and such a change is refused, as
   * `Topology.ensureStream` refuses it (the dead letters are the only copy of those messages).
   */
  readonly allowDataLoss?: boolean | undefined
  /**
   * Replicas of the dead-letter stream in a cluster. Default: as many as the source stream has
   * (a dead letter should survive what its message survived), or the live dead-letter stream's
   * own when it has more: a worker never lowers an operator's replicas unless this says so.
   */
  readonly replicas?: number | undefined
}

/** The resolved dead-letter destination of one source. */
export interface Destination {
  readonly stream: string
  readonly subject: string
  readonly sourceStream: string
  readonly consumer: string
}

/** Resolves where `consumer` of `sourceStream` dead-letters to. */
export const destination = (sourceStream: string, consumer: string, options: Options = {}): Destination => {
  const prefix = options.subjectPrefix ?? "jetworker.dlq"
  return {
    stream: options.stream ?? `${sourceStream}_DLQ`,
    subject: `${prefix}.${sourceStream}.${consumer}`,
    sourceStream,
    consumer
  }
}

/**
 * Makes sure the dead-letter stream captures `<prefix>.<source stream>.>`: creates it when missing
 * (with `options`' limits, or 30 days and 1 GiB), otherwise adds that subject when no live subject
 * captures it and brings the limits `options` names to their values (a limit it does not name keeps
 * its live value; one that would delete stored dead letters is refused unless `allowDataLoss`).
 * It never removes a subject, since one dead-letter stream may be shared by several sources (the
 * same `stream` option) or given extra subjects by an operator. Its replicas are `replicas`, or
 * by default the source stream's (never fewer than the live stream has); a change to a live
 * stream is logged at WARN, naming the stream and each setting. With `create: false` it only
 * checks that the stream exists.
 */
export const ensure = (
  destination: Destination,
  options: Options = {}
): Effect.Effect<void, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const prefix = destination.subject.slice(0, destination.subject.length - destination.consumer.length - 1)
    if (options.create === false) {
      const { manager } = yield* NatsConnection
      yield* Effect.tryPromise({
        try: () => manager.streams.info(destination.stream),
        catch: (error) => NatsError.fromUnknown(`dead-letter stream ${destination.stream}`, error)
      })
      return
    }
    // Single-replica dead-letter streams of an R3 source lost the dead letters (and MaxDeliver
    // notices) published while their one node was down.
    const replicas = options.replicas ?? (yield* Topology.inheritedReplicas(destination.sourceStream, destination.stream))
    // The defaults are for a stream created here: a worker never resets a live stream's limits an
    // operator raised (or another source sharing the stream declared).
    const exists = yield* Topology.streamExists(destination.stream)
    yield* Topology.ensureStream({
      name: destination.stream,
      subjects: [`${prefix}.>`],
      subjectsMode: "add",
      maxAge: options.maxAge ?? (exists ? undefined : "30 days"),
      maxBytes: options.maxBytes ?? (exists ? undefined : 1024 * 1024 * 1024),
      discard: "new",
      replicas,
      allowDataLoss: options.allowDataLoss === true
      // No duplicate window: Topology's default, 2 minutes, or the max age when that is shorter
      // (the server refuses a window longer than the max age).
    })
  })

const copyOriginalHeaders = (from: MsgHdrs | undefined, to: MsgHdrs): void => {
  if (from === undefined) return
  for (const key of from.keys()) {
    const name = key.toLowerCase().startsWith("nats-") ? keptName(key) : key
    for (const value of from.values(key)) to.append(name, value)
  }
}

/** The parts of an original message a dead letter keeps. */
export interface Original {
  readonly headers: MsgHdrs | undefined
  readonly subject: string
  readonly seq: number
}

/** The `Nats-Msg-Id` of the dead letter of stream sequence `seq`: one per message, however often written. */
const deadLetterId = (destination: Destination, seq: number) => `${destination.sourceStream}.${destination.consumer}.${seq}`

/** The headers of a dead-letter message for `msg` failing with `record`. */
export const headersFor = (destination: Destination, msg: Original, record: Outcome.DeadLetterRecord): MsgHdrs => {
  const h = ControlHeaders.make(deadLetterId(destination, msg.seq), destination.stream)
  copyOriginalHeaders(msg.headers, h)
  h.set(Header.stream, destination.sourceStream)
  h.set(Header.consumer, destination.consumer)
  h.set(Header.subject, msg.subject)
  h.set(Header.sequence, String(msg.seq))
  h.set(Header.deliveries, String(record.message.deliveryCount))
  h.set(Header.outcome, record.outcome)
  h.set(Header.reason, record.reason)
  h.set(Header.error, JSON.stringify(record.error))
  if (record.message.eventId !== undefined) h.set(Header.eventId, record.message.eventId)
  h.set(Header.failedAt, new Date(record.failedAt.epochMilliseconds).toISOString())
  return h
}

/** Publishes `msg` with `record` to the dead-letter stream and waits for the stream's PubAck. */
export const publish = (
  destination: Destination,
  msg: Original & { readonly data: Uint8Array },
  record: Outcome.DeadLetterRecord
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { jetstream, apiTimeoutMillis } = yield* NatsConnection
    const operation = `dead-letter publish to ${destination.stream}`
    const ack = yield* Effect.tryPromise({
      try: () =>
        // The id and the expected stream are in the headers, first (see `ControlHeaders`).
        jetstream.publish(destination.subject, msg.data, { headers: headersFor(destination, msg, record), timeout: apiTimeoutMillis }),
      catch: (error) => NatsError.fromUnknown(operation, error)
    })
    return yield* checkPubAck(operation, destination.stream, ack)
  })

/**
 * Whether `m` is a dead letter: it carries the source stream, consumer, subject and sequence
 * headers {@link headersFor} writes on every one, whatever the stream's name or subjects (both
 * are options). A message of any other stream has none of them; it is never replayed or discarded.
 */
export const isDeadLetter = (m: DeadLetterMessage): boolean =>
  m.sourceStream !== "" && m.consumer !== "" && m.subject !== "" && Number.isInteger(m.sourceSequence) && m.sourceSequence > 0

const notADeadLetter = (operation: string, stream: string, sequence: number) =>
  new NatsError.NatsError({
    reason: "ApiError",
    operation,
    message: `${stream}#${sequence} is not a dead letter (it has no ${Header.stream} header): nothing done`
  })
/**
 * The `Nats-Msg-Id` of the replay of dead letter `m`: `replay.` and a SHA-256 of its source
 * stream, consumer, source sequence and failure time. Not its place in the dead-letter stream:
 * those sequences restart when that stream is deleted and created again, and a new dead letter
 * replayed under a reused id was taken as a duplicate and deleted, i.e. lost. The headers are the
 * same on every read of one dead letter (a retried replay stays one message) and differ for a
 * later dead letter of the same message (its failure time); the hash keeps any stream or
 * consumer name within the id's printable 200 characters.
 */
export const replayId = (m: DeadLetterMessage): string =>
  `replay.${createHash("sha256").update(JSON.stringify([m.sourceStream, m.consumer, m.sourceSequence, m.failedAt])).digest("hex")}`

/**
 * Replays one dead-letter message: republishes its original payload and headers to its original
 * subject (confirmed by the original stream, `Nats-Msg-Id` = {@link replayId}, header
 * `Jetworker-Replay-Of`), then deletes it from the dead-letter stream. The original's `Nats-*`
 * headers are not sent again: they were directives to the original publish (its id, expected
 * last sequence, rollup), which would make the replay fail or do harm. Replaying the same dead
 * letter twice within the original stream's duplicate window stores it once; a duplicate PubAck
 * therefore means this very dead letter was stored already (a replay whose delete was lost), so
 * it is deleted then too.
 *
 * A replay nobody answered is told apart as `Publisher.publish` tells it: when no stream captures
 * the subject (the source stream was deleted, or no longer captures it) it fails with
 * `StreamNotFound`, final, naming the subject and what became of the source stream ("no stream
 * captures subject orders.created (source stream ORDERS does not exist)"); otherwise with
 * `NoResponders`, retryable (JetStream unavailable, or not run by the server). Either way the
 * dead letter is kept.
 */
export const replay = (
  stream: string,
  sequence: number
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const message = yield* read(stream, sequence)
    if (!isDeadLetter(message)) return yield* notADeadLetter(`replay ${stream}#${sequence}`, stream, sequence)
    const { jetstream, manager, apiTimeoutMillis } = yield* NatsConnection
    const operation = `replay ${stream}#${sequence} to ${message.subject}`
    const h = ControlHeaders.make(replayId(message), message.sourceStream)
    for (const [name, value] of message.originalHeaders) {
      if (!name.toLowerCase().startsWith("nats-")) h.append(name, value)
    }
    h.set(Header.replayOf, `${stream}:${sequence}`)
    const ack = yield* Effect.tryPromise({
      try: () =>
        jetstream.publish(message.subject, message.payload, { headers: h, timeout: apiTimeoutMillis }),
      catch: (error) => NatsError.fromUnknown(operation, error)
    }).pipe(
      // nats.js says "jetstream is not enabled" also when the source stream was deleted.
      Effect.catchIf(
        (error) => error.reason === "NoResponders",
        (error) => Effect.flatMap(explainUnansweredPublish(error, message.subject, message.sourceStream, { role: "source stream" }), Effect.fail)
      )
    )
    yield* checkPubAck(operation, message.sourceStream, ack)
    yield* Effect.tryPromise({
      try: () => manager.streams.deleteMessage(stream, sequence, false),
      catch: (error) => NatsError.fromUnknown(`delete ${stream}#${sequence} after replay`, error)
    })
    return ack
  })

/** What {@link recover} needs. */
export interface RecoverOptions {
  /** The source stream that still holds the message. */
  readonly stream: string
  /** The consumer that gave up on it (its dead-letter destination and dedup scope). */
  readonly consumer: string
  /** The message's sequence in `stream` (from the `dead-letter.stranded` log line or the MaxDeliver advisory). */
  readonly sequence: number
  /**
   * The consumer's dead-letter settings, as its source has them. Default: the defaults (which
   * create the dead-letter stream, or bring its limits to the defaults; `create: false` only
   * checks that it exists).
   */
  readonly deadLetter?: Options | undefined
}

/**
 * Stores a message the broker stopped delivering (it reached MaxDeliver before its dead letter
 * could be written: the engine logged `dead-letter.stranded` and counted `jetworker.stranded`) in
 * the consumer's dead-letter stream, read from the source stream by its sequence, with reason
 * `DeliveriesExhausted`. It uses the same `Nats-Msg-Id` as the engine's own dead letter of that
 * sequence, so recovering twice (or after the engine did write it) stores it once within the
 * dead-letter stream's duplicate window; past it, a dead letter of that sequence that is still the
 * consumer's newest is found too (`duplicate: true`, nothing stored). A consumer that does not exist fails with
 * `ConsumerNotFound` (a misspelt name would store the dead letter under a consumer nobody has).
 */
export const recover = (options: RecoverOptions): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const operation = `recover ${options.stream}#${options.sequence}`
    const target = destination(options.stream, options.consumer, options.deadLetter)
    const stored = yield* Effect.tryPromise({
      try: () => manager.streams.getMessage(options.stream, { seq: options.sequence }),
      catch: (error) => NatsError.fromUnknown(operation, error)
    })
    if (stored === null) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation,
        message: `no message ${options.sequence} in ${options.stream} (removed by its retention or deleted)`,
        code: 10037
      })
    }
    // The delivery count is only informative: another failure reading it counts 0 deliveries.
    const deliveries = yield* Effect.tryPromise({
      try: () => manager.consumers.info(options.stream, options.consumer),
      catch: (error) => NatsError.fromUnknown(`consumer ${options.stream}/${options.consumer}`, error)
    }).pipe(
      Effect.map((info) => Math.max(0, info.config.max_deliver ?? 0)),
      Effect.catchIf((error) => error.reason !== "ConsumerNotFound", () => Effect.succeed(0))
    )
    // Only once the message and the consumer are known, so a mistyped name changes nothing.
    yield* ensure(target, options.deadLetter)
    // The dead letter's id finds one stored earlier only within the dead-letter stream's duplicate
    // window, and an advisory may wait days for its consumer to start again: the engine that wrote
    // the dead letter and died before its ack left both. So the consumer's newest dead letter is
    // looked at too (exact for that case; one stored earlier than another is still found only by
    // its id). A failed look-up changes nothing: the publish below goes ahead as before.
    const newest = yield* Effect.tryPromise({
      try: () => manager.streams.getMessage(target.stream, { last_by_subj: target.subject }),
      catch: (error) => NatsError.fromUnknown(operation, error)
    }).pipe(Effect.orElseSucceed(() => null))
    if (
      newest !== null && newest.header?.get(Header.stream) === options.stream &&
      newest.header.get(Header.sequence) === String(options.sequence)
    ) {
      const already: PubAck = { stream: target.stream, seq: newest.seq, duplicate: true }
      return already
    }
    const record: Outcome.DeadLetterRecord = {
      outcome: "DeadLettered",
      reason: "DeliveriesExhausted",
      error: {
        kind: "Failure",
        tag: "Stranded",
        message: "recovered from the source stream: the broker stopped delivering it before its dead letter was written",
        fields: {}
      },
      message: {
        consumer: options.consumer,
        subject: stored.subject,
        sequence: stored.seq,
        deliveryCount: deliveries,
        eventId: undefined
      },
      failedAt: DateTime.makeUnsafe(Date.now())
    }
    return yield* publish(target, { headers: stored.header, subject: stored.subject, seq: stored.seq, data: stored.data }, record)
  })

/**
 * Deletes one dead letter without replaying it (an operator's purge, once its cause is understood
 * and the message is not wanted). A dead letter that is already gone fails with `ApiError` 10037;
 * a message that is not a dead letter ({@link isDeadLetter}) is not deleted.
 */
export const discard = (stream: string, sequence: number): Effect.Effect<void, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const operation = `discard ${stream}#${sequence}`
    // Read first: a sequence of any other stream would otherwise delete one of its messages.
    if (!isDeadLetter(yield* read(stream, sequence))) return yield* notADeadLetter(operation, stream, sequence)
    const deleted = yield* Effect.tryPromise({
      try: () => manager.streams.deleteMessage(stream, sequence, false),
      catch: (error) => NatsError.fromUnknown(operation, error)
    })
    if (!deleted) {
      return yield* new NatsError.NatsError({ reason: "ApiError", operation, message: `no message ${sequence} in ${stream}`, code: 10037 })
    }
  })

/**
 * MaxDeliver's defined, observable result (INT-NATS-002). Once the last delivery a consumer's
 * MaxDeliver allows goes unsettled (a process killed on every attempt, a dead letter that could
 * not be written), JetStream stops delivering the message and says so only in an advisory, which
 * is lost while no client listens. So a consumer with a MaxDeliver gets a capture stream that
 * stores its advisories whoever listens; while the consumer runs, its source reads them and
 * stores each such message in the dead-letter stream by its stream sequence
 * (`DeadLetter.recover`: reason `DeliveriesExhausted`, the same `Nats-Msg-Id` as the engine's own
 * dead letter of that sequence, so capturing it twice, or after the engine did write it, stores
 * it once), counts it in `jetworker.dead_lettered` and logs `dead-letter.max-deliveries` (only
 * when it was not stored already).
 *
 * A captured advisory is removed once its dead letter is stored; one that cannot be stored yet
 * (a full dead-letter stream) stays and is tried again. The capture stream keeps advisories for
 * 7 days, with as many replicas as the source stream (or more, when an operator gave it more).
 *
 * @since 0.1.0
 */
import { Telemetry } from "@jetworker/core"
import type { PubAck } from "@nats-io/jetstream"
import { Effect, Metric } from "effect"
import * as DeadLetter from "./DeadLetter.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"
import * as Topology from "./Topology.ts"

/** The subject of the server's MaxDeliver advisories for `consumer` on `stream`. */
export const advisorySubject = (stream: string, consumer: string): string =>
  `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${stream}.${consumer}`

/** The stream that captures them: `<stream>_<consumer>_MAX_DELIVERIES`. */
export const captureStream = (stream: string, consumer: string): string => `${stream}_${consumer}_MAX_DELIVERIES`

/** How the capture stream is kept. */
export interface CaptureOptions {
  /**
   * Replicas of the capture stream in a cluster. Default: as many as the source stream has (an
   * advisory published while a single replica's node is down is lost, and its message stranded),
   * or the live capture stream's own when it has more.
   */
  readonly replicas?: number | undefined
}

/**
 * Creates (or keeps) the capture stream of `consumer` on `stream`, replicated like `stream`, with a
 * maximum age of 7 days when it creates it (a live stream keeps the age an operator gave it).
 */
export const ensure = (
  stream: string,
  consumer: string,
  options: CaptureOptions = {}
): Effect.Effect<void, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const name = captureStream(stream, consumer)
    const replicas = options.replicas ?? (yield* Topology.inheritedReplicas(stream, name))
    const exists = yield* Topology.streamExists(name)
    yield* Topology.ensureStream({ name, subjects: [advisorySubject(stream, consumer)], maxAge: exists ? undefined : "7 days", replicas })
  })

/** A message stored in the dead-letter stream from a captured advisory. */
export interface Recovered {
  /** Its sequence in the source stream. */
  readonly sequence: number
  /** The deliveries the server made before it gave up. */
  readonly deliveries: number
  /** The dead-letter stream's PubAck. */
  readonly deadLetter: PubAck
}

/** What {@link recoverCaptured} needs. */
export interface Options {
  readonly stream: string
  readonly consumer: string
  /** The consumer's dead-letter settings, as its source has them. */
  readonly deadLetter?: DeadLetter.Options | undefined
  /** The most advisories one call handles. Default: 100. */
  readonly limit?: number | undefined
}

interface Advisory {
  readonly stream_seq?: unknown
  readonly deliveries?: unknown
}

/**
 * Stores the message of every captured advisory (at most `limit`) in the dead-letter stream and
 * removes the advisory; returns what it stored. A dead letter the stream already had (a
 * duplicate PubAck) only has its advisory removed: it is not returned, counted or logged. An
 * advisory that cannot be read is removed with a warning; a dead letter that cannot be stored
 * leaves its advisory for the next call.
 */
export const recoverCaptured = (options: Options): Effect.Effect<ReadonlyArray<Recovered>, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const capture = captureStream(options.stream, options.consumer)
    const call = NatsError.tryPromise
    const info = yield* call(`stream info ${capture}`, () => manager.streams.info(capture))
    if (info.state.messages === 0) return []
    const attributes = { consumer: options.consumer, reason: "DeliveriesExhausted" }
    const counted = Metric.withAttributes(Telemetry.deadLettered, attributes)
    const recovered: Array<Recovered> = []
    const last = Math.min(info.state.last_seq, info.state.first_seq + (options.limit ?? 100) - 1)
    for (let seq = info.state.first_seq; seq <= last; seq++) {
      const stored = yield* call(`read ${capture}#${seq}`, () => manager.streams.getMessage(capture, { seq })).pipe(
        // A gap: that advisory was already handled.
        Effect.catchIf((error) => error.code === 10037, () => Effect.succeed(null))
      )
      if (stored === null) continue
      const advisory = yield* Effect.try(() => stored.json<Advisory>()).pipe(Effect.orElseSucceed((): Advisory => ({})))
      const sequence = typeof advisory.stream_seq === "number" ? advisory.stream_seq : undefined
      const deliveries = typeof advisory.deliveries === "number" ? advisory.deliveries : 0
      if (sequence !== undefined) {
        const deadLetter = yield* DeadLetter.recover({
          stream: options.stream,
          consumer: options.consumer,
          sequence,
          deadLetter: options.deadLetter
        }).pipe(
          // Gone from the source stream (its retention, or deleted): nothing left to store.
          Effect.catchIf((error) => error.code === 10037, (error) => Effect.as(Effect.logWarning(error.message), undefined))
        )
        // Already stored (the engine wrote it and died before acking; or this advisory was handled
        // before its delete): counting or logging it again would report one dead letter twice.
        if (deadLetter === undefined || deadLetter.duplicate) {
          yield* call(`delete ${capture}#${seq}`, () => manager.streams.deleteMessage(capture, seq, false))
          continue
        }
        recovered.push({ sequence, deliveries, deadLetter })
        yield* Metric.update(counted, 1)
        yield* Effect.logWarning("dead-letter.max-deliveries").pipe(
          Effect.annotateLogs({
            consumer: options.consumer,
            source: `${options.stream}/${options.consumer}`,
            sequence,
            deliveries,
            deadLetterStream: deadLetter.stream,
            deadLetterSequence: deadLetter.seq
          })
        )
      } else {
        yield* Effect.logWarning(`${capture}#${seq} is not a MaxDeliver advisory; removed`)
      }
      yield* call(`delete ${capture}#${seq}`, () => manager.streams.deleteMessage(capture, seq, false))
    }
    return recovered
  })

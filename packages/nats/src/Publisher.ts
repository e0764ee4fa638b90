/**
 * Confirmed JetStream publishing (INT-NATS-007): a publish succeeds only on a PubAck from the
 * expected stream with a positive sequence. The caller gives the stable id (`Nats-Msg-Id`,
 * equal to the event id for events) before the first attempt; on a timeout, a missing responder
 * or a broken connection the same message is sent again with the same id, so the stream's
 * duplicate window turns a publish that was in fact stored into `duplicate: true`. A connection
 * closed for good (closed or draining: nats.js does not reopen it) ends the retries at once with
 * `ConnectionClosed`, for a publish in flight then too, whose result is unknown. Retries follow
 * a jittered, capped, finite `Schedule`; a refusal answered at once, as while a stream elects its
 * leader (no responders, "temporarily unavailable"), is retried beyond `attempts` while the next
 * attempt still ends within the {@link republishHorizon}, so the defaults ride out an election of
 * 10 s and more. Each publish is a span (kind producer) named `send <stream>` when its `stream`
 * option is given, `send` otherwise (the subject, which may carry an entity id, is its
 * `messaging.destination.name` attribute: span names stay few), whose W3C `traceparent` goes in the
 * message's headers, so the consumer's span continues it.
 * Publishes in flight on a connection are bounded (`NatsConnection`'s `maxPublishesInFlight`).
 *
 * Without a `stream` in its options, a publish expects the stream that captures its subject, which
 * it asks the server for once per subject and connection ("no stream captures subject …" when
 * none does). The look-up is part of an attempt and within its timeout: one nobody answers in time,
 * or answered "not now" (`Unavailable`), is asked again by the next attempt, with the same id. A
 * publish nobody answers asks the server once whether any stream captures its subject: none is a
 * final `StreamNotFound`, anything else (JetStream down or electing a leader) stays a retryable
 * `NoResponders`. A publish the stream found refuses with "expected stream does not match" (10060:
 * the subject has moved to another stream since, as when a stream is replaced) forgets it and asks
 * again within the same attempt (a stale look-up costs no attempt), with the same id.
 *
 * Options are checked before anything is sent (and by {@link outboxPublisher} when its layer is
 * built): `attempts` an integer from 1 to 100, `timeout` from 1 ms to {@link maxTimeoutMillis}, the
 * subject a literal NATS subject of at most `Outbox.maxSubjectBytes` bytes (`Outbox.subjectProblem`,
 * the outbox's own check: no wildcard, which would be stored as a literal, no empty token, which
 * nobody would answer, and nothing longer, which would make the server close the connection).
 *
 * A retry is deduplicated only within the stream's duplicate window: {@link republishHorizon}
 * says how long after the first attempt the last retry may go out, and {@link checkHorizon}
 * compares it with a stream's window at start. Outside the window (or with deduplication off) a
 * retry stores a second copy, which the consumer's dedup row turns into a `Duplicate` (no
 * second effect): the two layers of deduplication.
 *
 * @since 0.1.0
 */
import type { PubAck } from "@nats-io/jetstream"
import { DurationInput, Envelope, Outbox, Telemetry } from "@jetworker/core"
import { Clock, Duration, Effect, Layer, Result, Schedule, Semaphore } from "effect"
import * as ControlHeaders from "./internal/controlHeaders.ts"
import { explainUnansweredPublish } from "./internal/unansweredPublish.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

/** Options of one publish. */
export interface PublishOptions {
  /** The stable application id, sent as `Nats-Msg-Id` on every attempt. */
  readonly msgId: string
  /**
   * The stream that must store it; a PubAck from another stream is an error. Default: the stream
   * whose subjects capture `subject`, asked of the server once per subject and connection, and
   * again (within the same attempt) when that stream refuses the publish as no longer its own (10060).
   */
  readonly stream?: string | undefined
  /** Extra headers. */
  readonly headers?: ReadonlyArray<readonly [string, string]> | undefined
  /**
   * Attempts for any retryable error, an integer from 1 to 100. Default: 5. A publish refused at
   * once as in a leader election (`NoResponders`, `Unavailable`) is sent more times, while the next
   * attempt still ends within the {@link republishHorizon}.
   */
  readonly attempts?: number | undefined
  /**
   * Bound on each attempt as a whole (the look-up of the stream included, when it is asked), from
   * 1 ms to {@link maxTimeoutMillis}. Default: the connection's API timeout.
   */
  readonly timeout?: Duration.Input | undefined
}

/**
 * The longest `timeout` of an attempt: 2^31 - 1 ms (about 24.8 days), the most `setTimeout` takes;
 * nats.js would turn a longer one into 1 ms, and a publish the stream stored would be reported as
 * timed out.
 */
export const maxTimeoutMillis = 2 ** 31 - 1

const optionError = (operation: string, message: string) =>
  new NatsError.NatsError({ reason: "ApiError", operation, message })

/** The retry options of a publish, as {@link publish}, {@link republishHorizon} and {@link checkHorizon} take them. */
export interface RetryOptions {
  /**
   * Attempts for any retryable error, an integer from 1 to 100. Default: 5. A publish refused at
   * once as in a leader election (`NoResponders`, `Unavailable`) is sent more times, while the next
   * attempt still ends within the {@link republishHorizon}.
   */
  readonly attempts?: number | undefined
  /** Bound on each attempt as a whole, from 1 ms to {@link maxTimeoutMillis}. Default: the connection's API timeout. */
  readonly timeout?: Duration.Input | undefined
}

/**
 * `attempts` and `timeout` checked (a wrong one fails naming it, not retryable): the attempts, and
 * the timeout in milliseconds (`undefined`: the connection's API timeout).
 */
const optionsResult = (
  operation: string,
  options: RetryOptions
): Result.Result<{ readonly attempts: number; readonly timeoutMillis: number | undefined }, NatsError.NatsError> => {
  const attempts = options.attempts ?? 5
  if (!Number.isInteger(attempts) || attempts < 1 || attempts > 100) {
    return Result.fail(optionError(operation, `attempts must be an integer from 1 to 100, got ${DurationInput.show(attempts)}`))
  }
  if (options.timeout === undefined) return Result.succeed({ attempts, timeoutMillis: undefined })
  // `DurationInput.parse`: a NaN inside an object or tuple is refused, not read as 0.
  const parsed = DurationInput.parse(options.timeout)
  const millis = parsed === undefined ? Number.NaN : Duration.toMillis(parsed)
  // Written so that NaN (an unparsable timeout) fails too.
  if (!(millis >= 1 && millis <= maxTimeoutMillis)) {
    return Result.fail(optionError(
      operation,
      `timeout must be a duration from 1 millis to ${maxTimeoutMillis} millis (about 24.8 days), such as "5 seconds", ` +
        `got ${DurationInput.show(options.timeout)}`
    ))
  }
  return Result.succeed({ attempts, timeoutMillis: millis })
}

const checkOptions = (operation: string, options: RetryOptions) => Effect.fromResult(optionsResult(operation, options))

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

/** The first retry's delay; each next one doubles, jittered, up to {@link retryCapMillis}. */
const retryBaseMillis = 100
const retryCapMillis = 2_000

/**
 * A refusal answered at once that a leader election gives: nobody answering for the stream (it has
 * no leader yet) or "not now" (`Unavailable`, such as 10008). An election takes seconds (2 to 8
 * after a SIGKILL on a 3-node cluster), longer than the counted attempts' delays (about 1.4 s).
 */
const isElectionRefusal = (error: NatsError.NatsError) => error.reason === "NoResponders" || error.reason === "Unavailable"

/**
 * Retries after the first attempt: `attempts - 1` of them for any retryable error, then, for a
 * refusal a leader election gives ({@link isElectionRefusal}), more while the next attempt, run to
 * its `timeoutMillis` after its delay, still ends by `deadline` (the first attempt's start plus
 * the {@link republishHorizon}): the time the counted attempts did not use rides out an election,
 * and the horizon stays an upper bound.
 */
const retrySchedule = (attempts: number, timeoutMillis: number, deadline: number) =>
  Schedule.exponential(Duration.millis(retryBaseMillis), 2).pipe(
    Schedule.jittered,
    Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, Duration.millis(retryCapMillis)))),
    Schedule.setInputType<NatsError.NatsError>(),
    Schedule.while(({ attempt, duration, input, now }) =>
      attempt < attempts || (isElectionRefusal(input) && now + Duration.toMillis(duration) + timeoutMillis <= deadline)
    )
  )

/** Every attempt running to its timeout, plus the longest delays between the counted ones (jitter included). */
const horizonMillis = (attempts: number, timeoutMillis: number): number => {
  let delays = 0
  // `Schedule.jittered` scales a delay by up to 1.2; the cap applies after it.
  for (let retry = 0; retry < attempts - 1; retry++) delays += Math.min(retryCapMillis, retryBaseMillis * 2 ** retry * 1.2)
  return attempts * timeoutMillis + delays
}

/**
 * How long after its first attempt a publish may still be sent again: every attempt (the look-up
 * of the stream included) running to its timeout (`apiTimeoutMillis` when `options` gives none),
 * plus the longest delays between them (jitter included). A stream's duplicate window shorter than
 * this may store a late retry twice. A publish refused at once as in a leader election (no
 * responders, `Unavailable`) is sent more than `attempts` times, but only while the next attempt,
 * run to its timeout, still ends within this horizon (with the defaults, for about 20 s).
 *
 * Options that {@link publish} would refuse (an `attempts` that is not an integer from 1 to 100, a
 * `timeout` that is not a duration from 1 ms to {@link maxTimeoutMillis}: a string that does not
 * parse, NaN, negative, infinite) have no horizon: the result is then a failure, the `NatsError`
 * (reason `ApiError`, operation `republish horizon`) publish would fail with. It never throws
 * (it returned the `Duration` itself before, and threw on a timeout string that did not parse).
 */
export const republishHorizon = (
  options: RetryOptions = {},
  apiTimeoutMillis = 5_000
): Result.Result<Duration.Duration, NatsError.NatsError> =>
  Result.map(
    optionsResult("republish horizon", options),
    ({ attempts, timeoutMillis }) => Duration.millis(horizonMillis(attempts, timeoutMillis ?? apiTimeoutMillis))
  )

/** A stream's duplicate window against a publisher's republish horizon. */
export interface HorizonCheck {
  readonly stream: string
  readonly horizon: Duration.Duration
  /** The stream's duplicate window; zero when it deduplicates nothing. */
  readonly duplicateWindow: Duration.Duration
  /** Whether every retry falls inside the window (so it is stored once). */
  readonly covered: boolean
}

/**
 * Compares `stream`'s duplicate window with the republish horizon of `options` (as passed to
 * {@link publish}), and logs a warning saying what happens when the window is shorter: a retry
 * after it stores a second copy, which the consumer's dedup row turns into a `Duplicate`. Options
 * that publish would refuse fail as {@link republishHorizon} says, before the server is asked.
 */
export const checkHorizon = (
  stream: string,
  options: RetryOptions = {}
): Effect.Effect<HorizonCheck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager, apiTimeoutMillis } = yield* NatsConnection
    const horizon = yield* Effect.fromResult(republishHorizon(options, apiTimeoutMillis))
    const duplicateWindow = yield* duplicateWindowOf(manager, stream)
    const covered = Duration.isGreaterThanOrEqualTo(duplicateWindow, horizon)
    if (!covered) {
      yield* Effect.logWarning(
        `stream ${stream} deduplicates publishes for ${Duration.format(duplicateWindow)}, but a publish may be retried ` +
          `for up to ${Duration.format(horizon)}: a retry after the window stores a second copy, which consumers ` +
          `must take as a duplicate (their dedup row does); widen the window or lower attempts/timeout`
      )
    }
    return { stream, horizon, duplicateWindow, covered }
  })

/** `stream`'s duplicate window, as the server says (zero: it deduplicates nothing). */
const duplicateWindowOf = (manager: NatsConnection["Service"]["manager"], stream: string) =>
  Effect.map(
    NatsError.tryPromise(`stream info ${stream}`, () => manager.streams.info(stream)),
    (info) => Duration.millis(Math.floor((info.config.duplicate_window ?? 0) / 1_000_000))
  )

/**
 * The outbox publisher's `checkRelay`: once, when a relay starts, a warning (never a failure) for
 * each setting of the relay the broker does not bear out. The outbox's `maxMessageBytes` above the
 * server's `max_payload`: a row between the two can never be published and blocks the relay. And,
 * when `options` name the stream, a duplicate window shorter than the relay's republish period,
 * its `roundBudget` plus the publisher's {@link republishHorizon} (INT-NATS-007): a row published
 * again after the window is stored twice. Without a stream named, the streams are only known
 * publish by publish, and their windows are not checked. A stream that cannot be read is said at
 * DEBUG level: the first publish says more.
 */
const checkRelay = (
  options: Omit<PublishOptions, "msgId" | "headers">,
  relay: Outbox.RelaySettings
): Effect.Effect<void, never, NatsConnection> =>
  Effect.gen(function*() {
    const { connection, manager, apiTimeoutMillis } = yield* NatsConnection
    const maxPayload = connection.info?.max_payload
    if (maxPayload !== undefined && relay.maxMessageBytes > maxPayload) {
      yield* Effect.logWarning(
        `outbox: maxMessageBytes is ${relay.maxMessageBytes} bytes, but the NATS server takes messages of at most ` +
          `${maxPayload} (max_payload): an event recorded between the two can never be published and blocks the ` +
          `relay; set maxMessageBytes to at most ${maxPayload} on PgOutbox.layer and layerRelay`
      ).pipe(Effect.annotateLogs({ event: "outbox.max_payload_exceeded" }))
    }
    const stream = options.stream
    if (stream === undefined) return
    // The options were checked when the layer was built: the horizon is there.
    const horizon = yield* Effect.fromResult(republishHorizon(options, apiTimeoutMillis))
    const period = Duration.sum(relay.roundBudget, horizon)
    // Bounded by the JetStream API timeout, as any request of the manager.
    const duplicateWindow = yield* duplicateWindowOf(manager, stream)
    if (Duration.isLessThan(duplicateWindow, period)) {
      yield* Effect.logWarning(
        `outbox: stream ${stream} deduplicates publishes for ${Duration.format(duplicateWindow)}, but the relay may ` +
          `publish a row again up to ${Duration.format(period)} after its first publish (roundBudget ` +
          `${Duration.format(relay.roundBudget)} + republish horizon ${Duration.format(horizon)}): a row published again ` +
          `after the window is stored twice, which consumers must take as a duplicate; widen the window or lower ` +
          `roundBudget, attempts or timeout`
      ).pipe(Effect.annotateLogs({ event: "outbox.duplicate_window_short" }))
    }
  }).pipe(
    Effect.catch((error) => Effect.logDebug(`outbox: the relay's start check could not read the stream: ${error.message}`))
  )

/** The stream capturing each subject, per connection: asked of the server once. */
const streamsBySubject = new WeakMap<object, Map<string, string>>()

/**
 * JetStream's "expected stream does not match": the stream that captures the subject is not the
 * one the publish expected.
 */
const expectedStreamMismatch = 10060

/**
 * A publish that expected `stream`, found capturing `subject`, refused with
 * {@link expectedStreamMismatch}: the subject has moved to another stream since (an operator
 * deleted the stream and created another for its subjects). The look-up is forgotten, unless a
 * newer one replaced it already, so that the next attempt asks again; the error says so.
 */
const forgetMovedStream = (connection: object, subject: string, stream: string, error: NatsError.NatsError): NatsError.NatsError => {
  const known = streamsBySubject.get(connection)
  if (known?.get(subject) === stream) known.delete(subject)
  return new NatsError.NatsError({
    ...error,
    message: `${error.message}: stream ${stream}, found capturing ${subject}, no longer does (the subject moved to ` +
      `another stream); its stream is looked up again`
  })
}

/**
 * A request in flight when its connection closed for good: nats.js rejects it with `RequestError`
 * "connection closed", which `NatsError` maps to `Unknown` (and rejects it before it marks the
 * connection closed, so the message is what tells it). A `ConnectionClosed` saying `what` waited
 * instead: neither an `Unknown` nor "no stream captures subject" stands for it.
 */
const closedWhileWaiting = (
  error: NatsError.NatsError,
  connection: { readonly isClosed: () => boolean },
  what: string
): NatsError.NatsError =>
  error.reason === "Unknown" && (error.message === "connection closed" || connection.isClosed())
    ? new NatsError.NatsError({
      reason: "ConnectionClosed",
      operation: error.operation,
      message: `the NATS connection closed for good while ${what}`
    })
    : error

/**
 * The stream whose subjects capture `subject`, from the cache or asked of the server within
 * `boundMillis` (a part of a publish's attempt). Nobody answering in time is a retryable `Timeout`
 * and "not now" (`Unavailable`) stays retryable: the attempt asks again. No stream is final.
 */
const streamFor = (subject: string, boundMillis: number): Effect.Effect<string, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const connection = yield* NatsConnection
    let known = streamsBySubject.get(connection)
    if (known === undefined) {
      known = new Map()
      streamsBySubject.set(connection, known)
    }
    const cached = known.get(subject)
    if (cached !== undefined) return cached
    const operation = `find the stream of ${subject}`
    const found = yield* NatsError.tryPromise(operation, () => connection.manager.streams.find(subject)).pipe(
      // nats.js says "no stream matches subject" (`StreamNotFound`, final). Any other answer keeps
      // its own words: an API error such as 10039 ("jetstream not enabled for account") says nothing
      // about the subject, and a failure nats.js does not name (`Unknown`) neither.
      Effect.mapError((error) =>
        error.reason === "StreamNotFound"
          ? new NatsError.NatsError({ ...error, reason: "StreamNotFound", message: `no stream captures subject ${subject}` })
          : closedWhileWaiting(error, connection.connection, `the look-up of the stream of ${subject} waited for its answer (nothing was published)`)
      ),
      // The API timeout bounds the request too; what is left of the attempt may bound it more.
      Effect.timeoutOption(Duration.millis(Math.min(boundMillis, connection.apiTimeoutMillis)))
    )
    if (found._tag === "None") {
      return yield* new NatsError.NatsError({
        reason: "Timeout",
        operation,
        message: `no answer within ${Math.min(boundMillis, connection.apiTimeoutMillis)} ms to the look-up of the stream of ${subject}`
      })
    }
    // A bounded cache: subjects are usually few; a flood of distinct ones starts it afresh.
    if (known.size >= 10_000) known.clear()
    known.set(subject, found.value)
    return found.value
  })

/**
 * Publishes `payload` to `subject` until the stream confirms it, retrying with the same id. Bad
 * input (options out of range, a subject `Outbox.subjectProblem` refuses, an invalid `msgId`, a
 * header containing `Nats-Msg-Id`) fails with `ApiError`, not retryable, before anything is sent.
 * A connection closed for good ends it at once with `ConnectionClosed` (still `isRetryable`: the
 * same id, sent again over a new connection, is stored once within the duplicate window).
 */
export const publish = (
  subject: string,
  payload: Uint8Array,
  options: PublishOptions
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const operation = `publish ${subject}`
    const { attempts, timeoutMillis } = yield* checkOptions(operation, options)
    // Refused for good before anything is sent, as the outbox refuses it: a wildcard would be
    // stored as a literal subject, an empty token go unanswered (a retryable NoResponders after
    // every attempt), and an over-long subject make the server close the shared connection.
    const subjectProblem = Outbox.subjectProblem(subject)
    if (subjectProblem !== undefined) return yield* optionError(operation, subjectProblem)
    if (!Outbox.isValidId(options.msgId)) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation,
        message: "msgId must be 1 to 200 printable ASCII characters without spaces"
      })
    }
    // The id goes in `msgId`; on NATS 2.9 another header whose name contains `Nats-Msg-Id` makes the
    // server ignore the real one (no deduplication at all).
    const forbidden = (options.headers ?? []).find(([name]) => Outbox.isReservedHeader(name))
    if (forbidden !== undefined) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation,
        message: `header ${JSON.stringify(forbidden[0])} is not allowed: the id goes in msgId (a second header ` +
          `containing "Nats-Msg-Id" would make NATS 2.9 skip deduplication)`
      })
    }
    const connection = yield* NatsConnection
    const { jetstream, apiTimeoutMillis, publishPermits } = connection
    const timeout = timeoutMillis ?? apiTimeoutMillis
    // The publish's own span is the parent the consumer's span continues (W3C `traceparent`).
    const span = yield* Effect.currentSpan.pipe(Effect.option)
    const traceparent = span._tag === "Some" ? Telemetry.formatTraceparent(span.value) : undefined
    // One attempt, as a whole within `timeout` (what `republishHorizon` counts on): the stream
    // look-up when the stream is not known yet, the publish, and the look-up telling apart a
    // publish nobody answered each get what is left of it.
    const once = Effect.gen(function*() {
      const deadline = (yield* Clock.currentTimeMillis) + timeout
      const left = Effect.map(Clock.currentTimeMillis, (now) => deadline - now)
      // Sends to `stream` within what is left of the attempt.
      const sendTo = (stream: string) =>
        Effect.gen(function*() {
        const remaining = yield* left
        if (remaining < 1) {
          return yield* new NatsError.NatsError({
            reason: "Timeout",
            operation,
            message: `the look-up of the stream of ${subject} took the attempt's ${timeout} ms`
          })
        }
        return yield* Effect.tryPromise({
          try: () => {
            const h = ControlHeaders.make(options.msgId, stream)
            for (const [name, value] of options.headers ?? []) {
              if (traceparent === undefined || name.toLowerCase() !== Telemetry.traceparentHeader) h.append(name, value)
            }
            if (traceparent !== undefined) h.set(Telemetry.traceparentHeader, traceparent)
            // The id and the expected stream are in `h`, first (see `ControlHeaders`).
            return jetstream.publish(subject, payload, { headers: h, timeout: remaining })
          },
          catch: (error) =>
            closedWhileWaiting(
              NatsError.fromUnknown(operation, error),
              connection.connection,
              `the publish waited for its PubAck: whether ${stream} stored it is unknown; publish it again with the same ` +
                `id over a new connection`
            )
        }).pipe(
          Effect.catchIf(
            (error) => error.reason === "NoResponders",
            // Told apart by one stream look-up, bounded by what is left of the attempt: no stream
            // captures the subject (final) or JetStream did not answer (retryable).
            (error) =>
              Effect.flatMap(left, (rest) =>
                Effect.flatMap(explainUnansweredPublish(error, subject, stream, { timeoutMillis: Math.max(1, rest) }), Effect.fail))
          ),
          // Only a stream this publish found can have been replaced; a named one is the caller's.
          Effect.mapError((error) =>
            options.stream === undefined && error.code === expectedStreamMismatch
              ? forgetMovedStream(connection, subject, stream, error)
              : error
          ),
          Effect.flatMap((ack) => checkPubAck(operation, stream, ack))
        )
        })
      const cached = options.stream === undefined && streamsBySubject.get(connection)?.has(subject) === true
      const stream = options.stream ?? (yield* streamFor(subject, timeout))
      return yield* sendTo(stream).pipe(
        // A stream from the cache may be stale (the subject moved since): that costs no attempt.
        // The refusal forgot it; it is looked up afresh and sent to within this attempt.
        Effect.catchIf(
          (error) => cached && error.code === expectedStreamMismatch,
          () => Effect.flatMap(left, (rest) => Effect.flatMap(streamFor(subject, Math.max(1, rest)), sendTo))
        )
      )
    })
    // Timed from the first attempt, once a permit is held: what the horizon is counted from.
    const attempting = Effect.flatMap(Clock.currentTimeMillis, (started) =>
      once.pipe(Effect.retry({
        schedule: retrySchedule(attempts, timeout, started + horizonMillis(attempts, timeout)),
        // A connection closed for good does not come back: retrying over it cannot help. A stream
        // the publish found and that no longer captures the subject is looked up again.
        while: (error) =>
          error.reason !== "ConnectionClosed" &&
          (error.isRetryable || (options.stream === undefined && error.code === expectedStreamMismatch))
      })))
    return yield* attempting.pipe(
      Semaphore.withPermits(publishPermits, 1),
      // A stream found for the subject may have been replaced since: ask again next time.
      Effect.tapError(() => Effect.sync(() => options.stream === undefined && streamsBySubject.get(connection)?.delete(subject)))
    )
  }).pipe(
    Effect.withSpan(Telemetry.sendSpanName(options.stream), {
      kind: "producer",
      attributes: {
        [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
        [Telemetry.Attribute.operationType]: "send",
        [Telemetry.Attribute.operationName]: "publish",
        [Telemetry.Attribute.destinationName]: subject,
        [Telemetry.Attribute.messageId]: options.msgId,
        [Telemetry.Attribute.bodySize]: payload.byteLength,
        ...(options.stream === undefined ? {} : { [Telemetry.Attribute.stream]: options.stream })
      }
    })
  )

const encoder = new TextEncoder()

/**
 * Publishes an event envelope as JSON, with `Nats-Msg-Id` equal to its id. An envelope JSON
 * cannot write (data holding a bigint or a cycle, a time outside the `Date` range) fails with a
 * `NatsError` (`ApiError`, not retryable) when run, and sends nothing.
 *
 * ```ts
 * import { Envelope } from "@jetworker/core"
 * import { Publisher } from "@jetworker/nats"
 * import { Effect } from "effect"
 *
 * // The id is fixed before the first attempt: every retry sends the same `Nats-Msg-Id`, and the
 * // stream stores the event once within its duplicate window.
 * const announce = Effect.gen(function*() {
 *   const event = yield* Envelope.make({ type: "order.placed", data: { orderId: "o-1", sku: "book" } })
 *   const ack = yield* Publisher.publishEnvelope("orders.placed", event, { stream: "ORDERS" })
 *   yield* Effect.logInfo(`stored as ${ack.seq}${ack.duplicate ? " (a duplicate)" : ""}`)
 * })
 * ```
 */
export const publishEnvelope = <Type extends string, A>(
  subject: string,
  envelope: Envelope.Envelope<Type, A>,
  options: Omit<PublishOptions, "msgId">
): Effect.Effect<PubAck, NatsError.NatsError, NatsConnection> =>
  Effect.try({
    // Written when run, not when the effect is built: a throw there would escape the caller's effect.
    try: () => encoder.encode(Envelope.toJson(envelope)),
    catch: (cause) =>
      optionError(
        `publish ${subject}`,
        `event ${JSON.stringify(envelope.id)} cannot be written as JSON: ${cause instanceof Error ? cause.message : String(cause)}`
      )
  }).pipe(Effect.flatMap((payload) => publish(subject, payload, { ...options, msgId: envelope.id })))

/**
 * After a PubAck that says `duplicate`: whether the message the stream holds under the id is this
 * one (the relay republishing a row it had sent before it could mark it, the usual case) or
 * another that shares its id (an id another producer used too). The second would be marked sent
 * and lost: it fails, retryable, naming both, until the stream's duplicate window has forgotten
 * the id and the event is stored. A stored message since removed (limits, a purge) cannot be
 * compared and passes.
 */
const sameAsStored = (message: Outbox.OutboxMessage, ack: PubAck): Effect.Effect<void, NatsError.NatsError, NatsConnection> =>
  NatsConnection.use(({ manager }) =>
    Effect.tryPromise({
      try: () => manager.streams.getMessage(ack.stream, { seq: ack.seq }),
      catch: (error) => NatsError.fromUnknown(`read ${ack.stream}#${ack.seq}`, error)
    }).pipe(
      Effect.catchIf((error) => error.code === 10037, () => Effect.succeed(null)),
      Effect.flatMap((stored) =>
        stored === null || (stored.subject === message.subject && sameBytes(stored.data, message.payload))
          ? Effect.void
          : Effect.fail(
            new NatsError.NatsError({
              reason: "Unavailable",
              operation: `publish ${message.subject}`,
              message: `Nats-Msg-Id ${JSON.stringify(message.id)} is taken: ${ack.stream} holds another message under it ` +
                `(#${ack.seq}, subject ${stored.subject}), so it dropped this one as a duplicate; it is published once the ` +
                `stream's duplicate window has forgotten the id. Give each event an id of its own`
            })
          )
      )
    ))

const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => {
  if (a.byteLength !== b.byteLength) return false
  for (let i = 0; i < a.byteLength; i++) if (a[i] !== b[i]) return false
  return true
}

/**
 * Core's `OutboxPublisher` on this connection, for an outbox relay (`@jetworker/sql-pg`'s
 * `PgOutbox`): each recorded event is a confirmed {@link publish} with its id as `Nats-Msg-Id`,
 * whose span continues the trace of the transaction that recorded it. `options` apply to every
 * publish (the expected stream, attempts, timeout); the layer fails (`NatsError` naming the option)
 * when one is out of range, rather than every publish failing as a blocked row. A PubAck that says
 * `duplicate` is checked against the message the stream holds under the id: the same message (a
 * row republished after a relay was killed) passes; another fails, retryable, until the stream's
 * duplicate window has forgotten the id.
 *
 * When a relay starts, its `checkRelay` warns (once, never failing) when the relay's
 * `maxMessageBytes` exceeds the server's `max_payload` (`outbox.max_payload_exceeded`), and, with
 * a `stream` in `options`, when that stream's duplicate window is shorter than the relay's
 * republish period, `roundBudget` plus {@link republishHorizon} (`outbox.duplicate_window_short`,
 * naming both figures).
 */
export const outboxPublisher = (
  options: Omit<PublishOptions, "msgId" | "headers"> = {}
): Layer.Layer<Outbox.OutboxPublisher, NatsError.NatsError, NatsConnection> =>
  Layer.effect(
    Outbox.OutboxPublisher,
    Effect.andThen(checkOptions("Publisher.outboxPublisher", options), Effect.context<NatsConnection>()).pipe(Effect.map((context) => ({
      checkRelay: (relay: Outbox.RelaySettings) => Effect.provideContext(checkRelay(options, relay), context),
      publish: (message: Outbox.OutboxMessage, traceparent: string | undefined) => {
        const sent = Effect.flatMap(
          publish(message.subject, message.payload, { ...options, msgId: message.id, headers: message.headers }),
          (ack) => ack.duplicate ? sameAsStored(message, ack) : Effect.void
        )
        const parent = Telemetry.parseTraceparent(traceparent)
        return (parent === undefined ? sent : Effect.withParentSpan(sent, parent)).pipe(
          Effect.provideContext(context),
          Effect.mapError((error) => new Outbox.PublishFailed({ message: error.message, retryable: error.isRetryable }))
        )
      }
    })))
  )

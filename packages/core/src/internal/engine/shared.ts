/**
 * The run environment the stages share: `makeShared` builds it once per consumer run, before the
 * stages' factories (`engine.ts`, `makeProcess`), each of which takes what it uses out of it once,
 * so that the per-delivery path reads its own closures. It holds the run's settings and services,
 * the clock readers, the metric series, the progress counts, `running`, the deliveries in
 * flight (the one field the stages write), and `stopping`, which the engine sets.
 */
import { Context, Duration, Effect, LogLevel, Metric, Option, References, Schedule, Tracer } from "effect"
import type { AttemptStoreShape } from "../../AttemptStore.ts"
import type { IdempotencyStore } from "../../IdempotencyStore.ts"
import { classify, type Tagged } from "../../Classification.ts"
import type * as ErrorSummary from "../../ErrorSummary.ts"
import { WorkExpired } from "../../Expiry.ts"
import { LeaseExpired } from "../../Lease.ts"
import * as Outcome from "../../Outcome.ts"
import type * as Probe from "../../Probe.ts"
import * as Retry from "../../Retry.ts"
import type { Intake } from "../../Source.ts"
import * as Telemetry from "../../Telemetry.ts"
import type * as Deadlines from "../deadlines.ts"
import * as DependencyGate from "./dependencyGate.ts"
import type * as Lanes from "../lanes.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import * as Monotonic from "../monotonic.ts"
import type * as Slots from "../slots.ts"
import { type Definition, ExpiredBeforeRun, HandlerTimeout, type RunEnvironment, type Series, type Verdict } from "./types.ts"

/** Counts outcomes by consumer and outcome tag (`Telemetry.outcomes`). */
export const outcomesCounter = Telemetry.outcomes

/**
 * A dead letter that was decided but not written (what its redelivery writes instead), or written
 * but its original not terminated (`rememberStored`).
 */
interface UnwrittenDeadLetter {
  readonly eventId: string | undefined
  readonly reason: Outcome.DeadLetterReason
  readonly error: ErrorSummary.ErrorSummary
  readonly effectCommitted: boolean | undefined
}

/** What this run saw of a message's deliveries whose effect committed (`rememberCommitted`). */
interface CommittedDeliveries {
  readonly eventId: string | undefined
  /** Those that committed but were not acked (withheld or unconfirmed): no failed attempts. */
  notFailed: number
}

/** How many messages a consumer run remembers in each of its memories below (a few dozen bytes each). */
const rememberedLimit = 1_024

/** Sets `key` in `memory` as its newest entry, forgetting the oldest past `rememberedLimit`. */
export const rememberNewest = <V>(memory: Map<number, V>, key: number, value: V): void => {
  memory.delete(key)
  if (memory.size >= rememberedLimit) memory.delete(memory.keys().next().value!)
  memory.set(key, value)
}

/** What `memory` holds of `message` (by its sequence), if it is about the same event. */
const recall = <V extends { readonly eventId: string | undefined }>(memory: Map<number, V>, message: Outcome.MessageRef): V | undefined => {
  const found = memory.get(message.sequence)
  return found !== undefined && found.eventId === message.eventId ? found : undefined
}

/** What the stages of one consumer run share (`makeShared`). */
export type Shared<A, E extends Tagged, R> = ReturnType<typeof makeShared<A, E, R>>

/** Builds the run environment the stages share, once per consumer run. */
export const makeShared = <A, E extends Tagged, R>(
  definition: Definition<A, E, R>,
  lease: Duration.Duration,
  keeper: LeaseKeeper.LeaseKeeper,
  attemptStore: AttemptStoreShape | undefined,
  idempotencyStore: IdempotencyStore["Service"] | undefined,
  deliveryBound: number,
  maxDeliver: number | undefined,
  slots: Slots.Slots,
  lanes: Lanes.Lanes | undefined,
  deadlines: Deadlines.Deadlines,
  outcomeDeadlines: Deadlines.Deadlines,
  intake: Pick<Intake, "ackAll" | "holdBuffered">,
  env: RunEnvironment
) => {
  const { ackAll, holdBuffered } = intake
  // Durations and deadlines (leases, handler timeouts, latencies) on the monotonic clock, as the
  // broker's ack wait; the wall clock only for dates (expiry, the stamps of dead letters).
  const now = () => Monotonic.millis(env.clock)
  const wallNow = () => env.clock.currentTimeMillisUnsafe()
  // One series of `metric`, with the consumer's attributes and `attributes`: its context (the
  // run's, with the attributes merged in) is built once, not per update as `withAttributes` does.
  const inherited = Context.get(env.context, Metric.CurrentMetricAttributes)
  const series = (metric: Metric.Metric<number, unknown>, attributes: Record<string, string>): Series => {
    const context = Context.add(env.context, Metric.CurrentMetricAttributes, { ...inherited, consumer: definition.name, ...attributes })
    return (value) => metric.updateUnsafe(value, context)
  }
  const record = (update: Series, value: number): void => update(value)
  const probe = env.probe
  const hit = (at: Probe.Hit): Effect.Effect<void> => (probe === undefined ? Effect.void : probe.hit(at))
  const leaseMillis = Duration.toMillis(lease)
  // Each delivery gets `Effect.withSpan`'s span where a tracing backend sees it (any tracer but the
  // native one, which exports nothing) or where tracing is off (its no-op span); else a local one.
  const fullSpans = Context.get(env.context, Tracer.Tracer) !== Tracer.nativeTracer ||
    !Context.get(env.context, References.TracerEnabled)
  // As `Effect.withSpan` samples a span of the default level.
  const sampledByLevel = !LogLevel.isGreaterThan(
    Context.get(env.context, Tracer.MinimumTraceLevel),
    Context.get(env.context, Tracer.CurrentTraceLevel)
  )
  const timed = Context.get(env.context, References.TracerTimingEnabled)
  const noParent = Option.none<Tracer.AnySpan>()

  const counters = new Map(Outcome.tags.map((tag) => [tag, series(outcomesCounter, { outcome: tag })]))
  // Series with the consumer's attributes, built once; those keyed by a reason or stage on first use.
  const handlerDuration = series(Telemetry.handlerDuration, {})
  const inFlightGauge = series(Telemetry.inFlight, {})
  const pausedGauge = series(Telemetry.paused, {})
  const clockSkew = series(Telemetry.producerClockSkew, {})
  const stranded = series(Telemetry.stranded, {})
  const redeliveries = series(Telemetry.redeliveries, {})
  const retries = series(Telemetry.retries, {})
  const keyed = new Map<string, Series>()
  const keyedMetric = (metric: Metric.Metric<number, unknown>, key: string, attributes: Record<string, string>): Series => {
    const id = `${metric.id}|${key}`
    let found = keyed.get(id)
    if (found === undefined) {
      found = series(metric, attributes)
      keyed.set(id, found)
    }
    return found
  }
  const settleLatency = {
    Ack: series(Telemetry.settleLatency, { command: "Ack" }),
    Nak: series(Telemetry.settleLatency, { command: "Nak" }),
    DeadLetter: series(Telemetry.settleLatency, { command: "DeadLetter" })
  }
  // Progress since the last summary line, and since the backlog was last drained.
  const progress = {
    counts: new Map<Outcome.Tag, number>(),
    settled: new Map<Outcome.Tag, number>(),
    pending: undefined as number | undefined,
    // At most one "drained" line per interval (a trickle of messages drains after each one).
    drainedLineAt: Number.NEGATIVE_INFINITY,
    // Deliveries released (for a retry, or to the lease) and not yet settled again here, by stream
    // sequence, with when to stop waiting for them (a lease past their redelivery, which another
    // process may have taken): the broker no longer counts them pending, but the backlog is not
    // drained. Bounded as the memories below (past it, the line may come early, never late).
    released: new Map<number, number>()
  }
  /** How many deliveries released by this run may still come back at `at` (expired ones are forgotten). */
  const awaitingRedelivery = (at: number): number => {
    for (const [sequence, until] of progress.released) {
      if (until <= at) progress.released.delete(sequence)
    }
    return progress.released.size
  }
  const progressMillis = Duration.toMillis(definition.progressInterval)
  const reportsProgress = progressMillis > 0
  // In-process retries only while the next delay keeps the attempt well inside the lease.
  const inProcess = Retry.inProcessSchedule(definition.retry).pipe(
    Schedule.while(({ duration, elapsed }) => leaseMillis <= 0 || elapsed + Duration.toMillis(duration) < leaseMillis / 2)
  )
  const timeoutMessage = `handler ran longer than ${Duration.format(definition.handlerTimeout)}`
  // Dead letters decided but not written (refused by the dead-letter stream, or withheld past the
  // lease), by stream sequence. A redelivery beyond the attempts (or the deliveries) is
  // dead-lettered before the handler runs; without an attempt store its deliveries count as failed
  // attempts, those spent on the dead letter too, so it would say `AttemptsExhausted` for a
  // `PermanentError`: it writes the dead letter that was not written instead. Only this run knows it (another process, or this
  // one after a restart, says `AttemptsExhausted`); bounded, the oldest forgotten first.
  const unwritten = new Map<number, UnwrittenDeadLetter>()
  const rememberUnwritten = (verdict: Verdict): void => {
    if (verdict._tag !== "DeadLettered" || verdict.reason === "DeliveriesExhausted") return
    const { sequence, eventId } = verdict.message
    rememberNewest(unwritten, sequence, { eventId, reason: verdict.reason, error: verdict.error, effectCommitted: verdict.effectCommitted })
  }
  const takeUnwritten = (message: Outcome.MessageRef): UnwrittenDeadLetter | undefined => {
    const found = recall(unwritten, message)
    if (found !== undefined) unwritten.delete(message.sequence)
    return found
  }
  // Messages whose effect a delivery of this run committed (or found committed) without acking it:
  // the ack withheld (past the lease, or cut in its COMMIT) or not confirmed, or a failure after
  // the commit. Without an attempt store the deliveries count as failed attempts; one that
  // committed and was not acked is none, and its redelivery must reach the handler (whose store
  // finds the effect: `Duplicate`) rather than be dead-lettered `AttemptsExhausted` before it runs:
  // a false dead letter for an applied event. Only this run knows it: a redelivery that reaches
  // another process (or this one after a restart) counts it as a failed attempt, as before; an
  // attempt store counts only failures. Bounded as `unwritten`.
  const committedBefore = new Map<number, CommittedDeliveries>()
  const rememberCommitted = (message: Outcome.MessageRef, failed: boolean): void => {
    const seen = recall(committedBefore, message) ?? { eventId: message.eventId, notFailed: 0 }
    if (!failed) seen.notFailed++
    rememberNewest(committedBefore, message.sequence, seen)
  }
  // Dead letters this run stored whose term of the original was not confirmed, even once retried
  // within the lease (a JetStream consumer's leader being elected): the broker redelivers the
  // original after its ack wait. Its redelivery must not run the handler again (the account may
  // have been funded since, and a refused transfer would be applied after its dead letter was
  // stored): it is terminated with the same dead letter (written again, stored once by its
  // `Nats-Msg-Id`), before any other check. Forgotten once a term is confirmed. Only this run knows
  // it; a redelivery that reaches another process (or this one after a restart) finds the same
  // decision in the attempt store, when there is one (recorded before the dead letter was written,
  // see `settle.ts` and `prepare.ts`), and is otherwise judged afresh. Bounded as `unwritten`.
  const storedDeadLetters = new Map<number, UnwrittenDeadLetter>()
  const rememberStored = (verdict: Verdict): void => {
    if (verdict._tag !== "DeadLettered") return
    const { sequence, eventId } = verdict.message
    rememberNewest(storedDeadLetters, sequence, { eventId, reason: verdict.reason, error: verdict.error, effectCommitted: verdict.effectCommitted })
  }
  const forgetStored = (message: Outcome.MessageRef): void => {
    if (storedDeadLetters.size > 0) storedDeadLetters.delete(message.sequence)
  }
  /** The dead letter this run stored for `message` without its term confirmed, if any (`rememberStored`). */
  const storedDeadLetterOf = (message: Outcome.MessageRef): UnwrittenDeadLetter | undefined =>
    storedDeadLetters.size === 0 ? undefined : recall(storedDeadLetters, message)
  /** What this run saw committed of `message` (its sequence and event id), if anything. */
  const committedOf = (message: Outcome.MessageRef): CommittedDeliveries | undefined => recall(committedBefore, message)
  // Deliveries of this run released with no failure of their handler: cut by the consumer's
  // stopping or a lost lease (a hold ended so, or a run the lease keeper interrupted). Without an
  // attempt store, their redelivery would count them as failed attempts (a held failure is not
  // counted, whatever ends the hold). Only this run knows it, as for `committedBefore`; bounded so.
  const releasedBefore = new Map<number, { readonly eventId: string | undefined; count: number }>()
  const rememberReleased = (message: Outcome.MessageRef): void => {
    const seen = recall(releasedBefore, message) ?? { eventId: message.eventId, count: 0 }
    seen.count++
    rememberNewest(releasedBefore, message.sequence, seen)
  }
  /** How many deliveries of `message` this run released with no failure (`rememberReleased`). */
  const releasedOf = (message: Outcome.MessageRef): number => recall(releasedBefore, message)?.count ?? 0
  const isTransient = (error: E | HandlerTimeout | ExpiredBeforeRun): boolean =>
    error instanceof ExpiredBeforeRun || error instanceof WorkExpired || error instanceof LeaseExpired
      ? false
      : error._tag === "HandlerTimeout" && error instanceof HandlerTimeout
      ? true
      : classify(definition.classify, error as E) === "transient"

  return {
    definition,
    keeper,
    attemptStore,
    idempotencyStore,
    deliveryBound,
    maxDeliver,
    slots,
    lanes,
    deadlines,
    outcomeDeadlines,
    ackAll,
    env,
    now,
    wallNow,
    record,
    probe,
    hit,
    leaseMillis,
    fullSpans,
    sampledByLevel,
    timed,
    noParent,
    counters,
    handlerDuration,
    inFlightGauge,
    clockSkew,
    stranded,
    redeliveries,
    retries,
    keyedMetric,
    settleLatency,
    // The deliveries in flight: counted up by `process` and `processBatch`, down by `recordOutcome`.
    running: 0,
    // Set by the engine when the consumer stops: a delivery whose key's turn comes after that is
    // released without running (see `single.ts`).
    stopping: false,
    progress,
    awaitingRedelivery,
    progressMillis,
    reportsProgress,
    inProcess,
    timeoutMessage,
    isTransient,
    rememberUnwritten,
    takeUnwritten,
    rememberCommitted,
    committedOf,
    rememberStored,
    forgetStored,
    storedDeadLetterOf,
    rememberReleased,
    releasedOf,
    dependencyGate: DependencyGate.make(
      definition.name,
      env.lifecycle,
      definition.pauseOn,
      env.clock,
      pausedGauge,
      // While paused, what the intake buffers waits too: its leases kept as a held delivery's, as
      // long as a hold may last.
      holdBuffered === undefined ? undefined : (paused) => holdBuffered(paused ? Duration.toMillis(definition.maxHold) : 0)
    ),
    pausedGauge,
    heldGauge: series(Telemetry.held, {}),
    // The deliveries held now (see `runHandler.ts`, `heldAfter`): the `jetworker.held` gauge.
    held: 0
  }
}

/**
 * The consumer engine. Without per-key ordering, `concurrency` long-lived workers each take a
 * delivery and carry it to its outcome before they take the next (the source's `take` in turn);
 * with per-key ordering an intake loop takes deliveries within the limits (room in the key lanes,
 * then a slot) and runs each in a fiber of its own; a batch consumer's loop collects batches, a
 * slot per batch. A delivery, or a batch, goes through named stages:
 *
 * - `prepare`: decode, metadata, ordering key, expiry, the delivery and attempt bounds (`check`,
 *   synchronous, and done at once by `checkNow` unless the attempt store must be read, for a
 *   redelivery);
 * - admit (per key only): the key's lane, its turn, then a slot;
 * - run (`runHandler`): the handler (`attempt`: expiry before each run; each run a fiber of its
 *   own, cut at `handlerTimeout` by the consumer's one deadline watcher; in-process retries built
 *   only after a transient failure), or the batch handler once for all its elements
 *   (`processBatch`), under the lease keeper;
 * - `conclude`: the verdict from the run's exit and the store's reports;
 * - `settle`: the broker command (never an ack past the lease), then `recordOutcome`: metrics,
 *   span, log, progress and `onOutcome`.
 *
 * The success path is kept cheap on purpose (the performance notes in docs/performance.md): no
 * fiber, slot or timer per delivery beyond the handler run's own fiber, the clock, the metric
 * series and the probe read once per run, the stages `flatMap`s rather than generators, a stage
 * that needs no effect done as plain code where the delivery's effect runs (each step of a fiber
 * is CPU on every message: `bench/commit-in-memory.ts` counts them), and nothing waits for an
 * event-loop turn that it does not need.
 *
 * On interruption it drains. Internal: the public face is `Consumer`.
 */
import {
  Cause,
  Clock,
  Context,
  Data,
  DateTime,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  FiberSet,
  LogLevel,
  Metric,
  Option,
  References,
  Result,
  Schedule,
  Tracer
} from "effect"
import { AttemptStore, type AttemptStoreShape } from "../AttemptStore.ts"
import { type Classification, classify, type Tagged } from "../Classification.ts"
import { CurrentBatch, CurrentDelivery } from "../CurrentDelivery.ts"
import type { Delivery } from "../Delivery.ts"
import { isExpired, type Metadata } from "../Envelope.ts"
import * as ErrorSummary from "../ErrorSummary.ts"
import { WorkExpired } from "../Expiry.ts"
import { LeaseExpired } from "../Lease.ts"
import { isAlreadyCommitted } from "../IdempotencyStore.ts"
import * as Lifecycle from "../Lifecycle.ts"
import * as Outcome from "../Outcome.ts"
import * as Probe from "../Probe.ts"
import * as Retry from "../Retry.ts"
import type { Intake, Source, SourceError } from "../Source.ts"
import * as Telemetry from "../Telemetry.ts"
import * as Deadlines from "./deadlines.ts"
import * as Lanes from "./lanes.ts"
import * as LeaseKeeper from "./leaseKeeper.ts"
import * as Monotonic from "./monotonic.ts"
import * as Slots from "./slots.ts"

/** Why a payload was rejected before the handler ran. */
export interface Rejection {
  readonly reason: Outcome.RejectReason
  readonly error: ErrorSummary.ErrorSummary
}

/** The normalised ordering model (`Ordering`), with its limits resolved. */
export type OrderingDefinition<A> =
  | { readonly _tag: "Unordered" }
  | { readonly _tag: "Sequential" }
  | { readonly _tag: "PerKey"; readonly key: (event: A) => string; readonly limits: Lanes.Limits }

/** A batch consumer's batching and batch handler (`Consumer.makeBatch`). */
export interface BatchDefinition<A, E, R> {
  readonly maxSize: number
  readonly maxWait: Duration.Duration
  /**
   * One `Result` per event, in order; a run that fails as a whole (or gives anything else) is not
   * charged to every element: each then runs alone (`processBatch`).
   */
  readonly handle: (
    events: ReadonlyArray<A>
  ) => Effect.Effect<ReadonlyArray<Result.Result<unknown, E>>, E, R | CurrentBatch>
}

/** A consumer's normalised settings. */
export interface Definition<in out A, in out E extends Tagged, out R> {
  readonly name: string
  readonly source: Source<R>
  readonly decode: (payload: Uint8Array) => Result.Result<A, Rejection>
  readonly metadata: (event: A) => Metadata
  /** The handler; the engine provides it `CurrentDelivery`. */
  readonly handle: (event: A) => Effect.Effect<unknown, E, R | CurrentDelivery>
  readonly classify: Classification<E>
  readonly retry: Retry.RetryPolicy
  readonly concurrency: number
  readonly prefetch: number
  readonly handlerTimeout: Duration.Duration
  readonly drainTimeout: Duration.Duration
  readonly skewMillis: number
  readonly expiredTo: "Ack" | "DeadLetter"
  readonly onOutcome: ((outcome: Outcome.Outcome) => Effect.Effect<void>) | undefined
  readonly onOutcomeTimeout: Duration.Duration
  readonly maxDeliveries: number
  readonly ordering: OrderingDefinition<A>
  /** How often progress is summed up in an INFO line; zero for never. */
  readonly progressInterval: Duration.Duration
  /** Batch consumers only; their `handle` runs one event as a batch of one. */
  readonly batch: BatchDefinition<A, E, R> | undefined
}

/**
 * A delivery's admission under per-key ordering: its place in its key's lane and its slot, both
 * given back once it settles (whatever ends it), and `entered`, which tells the intake that the
 * delivery has found its place (or needs none), so it may take the next one.
 */
interface Admission {
  place: Lanes.Place | undefined
  slot: boolean
  readonly entered: Deferred.Deferred<void>
}

/** Whether `verdict` settles with an ack. */
const acks = (verdict: Verdict): boolean =>
  (verdict._tag === "Committed" && verdict.ackWithheld === undefined) || verdict._tag === "Duplicate" ||
  verdict._tag === "Expired"

/** The verdict for the same work once its lease is lost: no ack (a committed effect stays committed). */
const withholdAck = (verdict: Verdict): Verdict =>
  verdict._tag === "Committed"
    ? { ...verdict, ackWithheld: "LeaseLost" }
    : Outcome.verdict("Released", {
      message: verdict.message,
      reason: "LeaseLost",
      error: ErrorSummary.make("LeaseLost", "the lease ran out before the ack; another consumer may own the message"),
      retryIn: undefined
    })

/** A delivery that passed the checks before its handler: what running and judging it needs. */
interface Prepared<A> {
  readonly event: A
  readonly metadata: Metadata
  readonly message: Outcome.MessageRef
  /** The ordering key (per-key ordering only; empty otherwise). */
  readonly orderKey: string
  /** The deduplication and attempt-count key. */
  readonly key: { readonly scope: string; readonly id: string }
  /** Failed attempts before this delivery. */
  readonly failedBefore: number
}

/** What the idempotency store reported about one delivery's effect (through `CurrentDelivery`). */
interface Reports {
  committed: boolean
  alreadyCommitted: boolean
  /** When the store reported `Committed` (the clock's millis), if it did. */
  committedAt: number
}

/** A delivery's reports before the store has said anything. */
const noReportsYet = (): Reports => ({ committed: false, alreadyCommitted: false, committedAt: 0 })

/** The event expired while the engine waited to run the handler again (an in-process retry). */
class ExpiredBeforeRun extends Data.TaggedError("ExpiredBeforeRun")<{ readonly detectedAt: number }> {}

/**
 * A handler attempt that ran past `handlerTimeout`; transient. `cutAt`: when the deadline watcher
 * interrupted it (the clock's monotonic millis), which tells a run cut while its `COMMIT` ran (the store
 * reported `Committed` after it) from one cut in work done after the commit.
 */
export class HandlerTimeout extends Data.TaggedError("HandlerTimeout")<{ readonly message: string; readonly cutAt: number }> {}

type Verdict = Outcome.Verdict

/** A verdict as acted on (an ack withheld past the lease) and its broker command. */
interface Decided {
  readonly verdict: Verdict
  readonly command: Outcome.Command
  /** When the command was sent: the start of its settle latency. */
  readonly commandStart: number
}

/** The ordering key of every delivery of a consumer without per-key ordering (built once). */
const noKey: Result.Result<string, ErrorSummary.ErrorSummary> = Result.succeed("")
const finish = Outcome.settled

const EPOCH = DateTime.makeUnsafe(0)

/** Counts outcomes by consumer and outcome tag (`Telemetry.outcomes`). */
export const outcomesCounter = Telemetry.outcomes

/** Fails the engine before it starts. */
export const fail = <E>(error: E): Effect.Effect<never, E> => Effect.fail(error)

/** Confirmed commits and duplicates: the work that flows, logged at debug level only. */
const isRoutine = (outcome: Outcome.Outcome): boolean =>
  (outcome._tag === "Committed" || outcome._tag === "Duplicate") && outcome.confirmed

// The line names the consumer, sequence, event id and the error down to its innermost cause; the
// rest goes in annotations (keys an operator filters on with jq), built only for outcomes logged
// above debug level (the hot path logs Committed/Duplicate at debug).
const logOutcome = (outcome: Outcome.Outcome): Effect.Effect<void> => {
  if (isRoutine(outcome)) return Effect.logDebug(Outcome.describe(outcome))
  const log = outcome._tag === "Released" ? Effect.logInfo : Effect.logWarning
  const annotations: Record<string, unknown> = {
    outcome: outcome._tag,
    subject: outcome.message.subject,
    sequence: outcome.message.sequence,
    deliveryCount: outcome.message.deliveryCount
  }
  if (outcome.message.eventId !== undefined) annotations.eventId = outcome.message.eventId
  if ("reason" in outcome) annotations.reason = outcome.reason
  if ("error" in outcome && outcome.error !== undefined) annotations.error = ErrorSummary.describe(outcome.error)
  return log(Outcome.describe(outcome)).pipe(Effect.annotateLogs(annotations))
}

/**
 * What the per-delivery path reads once per run rather than per message: the run's context (for
 * metrics), its clock, its probe (`undefined` for the default, which is skipped), and whether
 * debug lines are logged at all.
 */
interface RunEnvironment {
  readonly context: Context.Context<never>
  readonly clock: Clock.Clock
  readonly probe: Probe.ProbeShape | undefined
  readonly debugLogs: boolean
}

/** A batch element that goes to the batch handler. */
interface Runnable<A> {
  readonly index: number
  readonly prepared: Prepared<A>
  readonly reports: Reports
}

/** A batch once each element is prepared: the verdicts of those that ended there, and the rest. */
interface PreparedBatch<A> {
  readonly verdicts: Array<Verdict | undefined>
  readonly runnable: ReadonlyArray<Runnable<A>>
}

/**
 * The functions a handler's context holds (`CurrentDelivery`, `CurrentBatch`) are built here, at
 * module level, so that each captures only what it uses: a closure built inside the per-delivery
 * path keeps that whole scope alive (the delivery, its message, the decoded event). And such a
 * context can outlive the delivery: `SqlClient.afterCommit` keeps it until a full collection,
 * whose scavenges then carry (and promote) all of it (see docs/performance-log.md).
 */
const reporter = (reports: Reports, now: () => number) => (report: "Committed" | "AlreadyCommitted"): void => {
  if (report === "Committed") {
    reports.committed = true
    reports.committedAt = now()
  } else reports.alreadyCommitted = true
}
/** Since when `delivery`'s lease has run, taken at `takenAt`: never later than the source's receipt. */
const leaseStart = (delivery: Delivery, takenAt: number): number =>
  delivery.receivedAt === undefined ? takenAt : Math.min(takenAt, delivery.receivedAt)
/**
 * The local lease deadline as the handler reads it: a wall time (epoch millis), reckoned at each
 * call from the monotonic time left, so that `Lease.ensure`, comparing it with the wall clock at
 * once, follows the monotonic lease across a step of the wall clock.
 */
const leaseDeadlineOf = (hold: LeaseKeeper.Hold, leaseMillis: number, clock: Clock.Clock) => (): number =>
  clock.currentTimeMillisUnsafe() + (hold.since + leaseMillis * 0.9 - Monotonic.millis(clock))
const noDeadline = (): undefined => undefined

/** Updates one metric series. */
type Series = (value: number) => void

/** Processes one delivery into exactly one settled outcome. Never fails. */
const makeProcess = <A, E extends Tagged, R>(
  definition: Definition<A, E, R>,
  lease: Duration.Duration,
  keeper: LeaseKeeper.LeaseKeeper,
  attemptStore: AttemptStoreShape | undefined,
  deliveryBound: number,
  maxDeliver: number | undefined,
  slots: Slots.Slots,
  lanes: Lanes.Lanes | undefined,
  deadlines: Deadlines.Deadlines,
  outcomeDeadlines: Deadlines.Deadlines,
  ackAll: Intake["ackAll"],
  env: RunEnvironment
) => {
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
  let running = 0
  // Progress since the last summary line, and since the backlog was last drained.
  const progress = {
    counts: new Map<Outcome.Tag, number>(),
    settled: new Map<Outcome.Tag, number>(),
    pending: undefined as number | undefined,
    // At most one "drained" line per interval (a trickle of messages drains after each one).
    drainedLineAt: Number.NEGATIVE_INFINITY
  }
  const progressMillis = Duration.toMillis(definition.progressInterval)
  const reportsProgress = progressMillis > 0
  // In-process retries only while the next delay keeps the attempt well inside the lease.
  const inProcess = Retry.inProcessSchedule(definition.retry).pipe(
    Schedule.while(({ duration, elapsed }) => leaseMillis <= 0 || elapsed + Duration.toMillis(duration) < leaseMillis / 2)
  )
  const timeoutMessage = `handler ran longer than ${Duration.format(definition.handlerTimeout)}`
  const isTransient = (error: E | HandlerTimeout | ExpiredBeforeRun): boolean =>
    error instanceof ExpiredBeforeRun || error instanceof WorkExpired || error instanceof LeaseExpired
      ? false
      : error._tag === "HandlerTimeout" && error instanceof HandlerTimeout
      ? true
      : classify(definition.classify, error as E) === "transient"

  // Every Delivery command is bounded by its implementation (the Delivery contract), so no
  // second timer here: a failure or timeout just means "not confirmed".
  const succeededCommand = Effect.succeed("confirmed" as const)
  const commandFailed = (cause: Cause.Cause<unknown>): Effect.Effect<"failed"> =>
    Effect.as(Effect.logWarning("broker command failed", ErrorSummary.fromCause(cause)), "failed" as const)
  const confirmed = <X, Y>(effect: Effect.Effect<X, Y>): Effect.Effect<"confirmed" | "failed"> =>
    Effect.matchCauseEffect(effect, { onSuccess: () => succeededCommand, onFailure: commandFailed })

  /**
   * Sends `command`: `confirmed`, `failed`, or for a dead letter `stored` — written and confirmed,
   * but the term of the original was not (found by the simulation: the outcome must not then
   * claim the message was released).
   */
  const execute = (delivery: Delivery, command: Outcome.Command): Effect.Effect<"confirmed" | "stored" | "failed"> => {
    switch (command._tag) {
      case "Ack":
        return confirmed(delivery.ack)
      case "Nak":
        return confirmed(delivery.nak(command.delay))
      case "DeadLetter":
        return delivery.deadLetter(command.record).pipe(
          Effect.as("confirmed" as const),
          Effect.catchCause((cause) => {
            const error = Cause.findErrorOption(cause)
            const stored = Option.isSome(error) && error.value.command === "Term"
            return Effect.as(
              Effect.logWarning(
                stored ? "dead letter stored; the term of the original was not confirmed" : "broker command failed",
                ErrorSummary.fromCause(cause)
              ),
              stored ? ("stored" as const) : ("failed" as const)
            )
          })
        )
      case "Leave":
        return Effect.succeed("confirmed")
    }
  }

  /**
   * Runs `effect` in a fiber of its own, cut at `watcher`'s bound (then `onTimeout`) by the
   * consumer's deadline watcher instead of a timer and a race per run. The run starts at once in
   * the caller's stack, so one that completes without waiting costs no deadline at all. An
   * interruption of the caller (a shutdown past its drain, a lost lease) interrupts the run and
   * waits for it to end, so its transaction has rolled back before the delivery settles.
   */
  const bounded = <X, Y, Z, W, V>(
    effect: Effect.Effect<X, Y, Z>,
    watcher: Deadlines.Deadlines,
    onTimeout: (cutAt: number) => Effect.Effect<W, V>
  ): Effect.Effect<X | W, Y | V, Z> =>
    Effect.suspend(() => {
      const startedAt = now()
      return Effect.flatMap(Effect.forkChild(effect, { startImmediately: true }), (run) => awaitBounded(run, startedAt, watcher, onTimeout))
    })

  /** The end of `bounded`: waits for `run`, started at `startedAt`, cutting it at `watcher`'s bound. */
  const awaitBounded = <X, Y, W, V>(
    run: Fiber.Fiber<X, Y>,
    startedAt: number,
    watcher: Deadlines.Deadlines,
    onTimeout: (cutAt: number) => Effect.Effect<W, V>
  ): Effect.Effect<X | W, Y | V> => {
    const ended = run.pollUnsafe()
    if (ended !== undefined) return ended
    let cutAt: number | undefined
    const entry = watcher.add(startedAt, () => {
      cutAt = now()
      run.interruptUnsafe()
    })
    return Effect.flatMap(
      Effect.onInterrupt(Fiber.await(run), () => Effect.andThen(Fiber.interrupt(run), Effect.sync(() => watcher.withdraw(entry)))),
      (exit): Effect.Effect<X | W, Y | V> => {
        watcher.withdraw(entry)
        return cutAt !== undefined && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onTimeout(cutAt) : exit
      }
    )
  }

  /** A handler run bounded by `handlerTimeout`: past it, `HandlerTimeout` (transient). */
  const supervised = <X, Y, Z>(effect: Effect.Effect<X, Y, Z>, message: string): Effect.Effect<X, Y | HandlerTimeout, Z> =>
    bounded(effect, deadlines, (cutAt) => Effect.fail(new HandlerTimeout({ message, cutAt })))

  /** One run of the handler: skipped once the event has expired, bounded by `handlerTimeout`. */
  const runOnce = (event: A, metadata: Metadata): Effect.Effect<unknown, E | ExpiredBeforeRun | HandlerTimeout, R | CurrentDelivery> =>
    Effect.suspend((): Effect.Effect<unknown, E | ExpiredBeforeRun | HandlerTimeout, R | CurrentDelivery> => {
      if (metadata.expiresAt !== undefined) {
        const at = wallNow()
        if (isExpired(metadata, at, definition.skewMillis)) return Effect.fail(new ExpiredBeforeRun({ detectedAt: at }))
      }
      return supervised(definition.handle(event), timeoutMessage)
    })

  /**
   * The in-process retries after a first transient failure: the same schedule and filter as a
   * retry around the first run, which the first step replays by failing with `error`.
   */
  const retryAfter = (event: A, metadata: Metadata, error: E | ExpiredBeforeRun | HandlerTimeout) => {
    let replayed = false
    return Effect.suspend(() => {
      if (replayed) return runOnce(event, metadata)
      replayed = true
      return Effect.fail(error)
    }).pipe(Effect.retry({ schedule: inProcess, while: isTransient }))
  }

  const attempt = (
    event: A,
    delivery: Delivery,
    metadata: Metadata,
    attemptNumber: number,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ) =>
    // Every run, the first and each in-process retry after its delay, starts only if the event
    // has not expired meanwhile (found by the simulation: a retry used to run past the expiry).
    // Suspended: a handler that throws instead of returning an Effect fails its attempt as a
    // defect (transient) rather than killing the delivery's fiber. The retry machinery is built
    // only after a transient failure: a run that succeeds pays for none of it.
    Effect.catch(runOnce(event, metadata), (error) => isTransient(error) ? retryAfter(event, metadata, error) : Effect.fail(error)).pipe(
      Effect.provideService(CurrentDelivery, {
        consumer: definition.name,
        eventId: metadata.id,
        attempt: attemptNumber,
        attempts: definition.retry.attempts,
        subject: delivery.subject,
        sequence: delivery.sequence,
        deliveryCount: delivery.deliveryCount,
        expiresAt: metadata.expiresAt === undefined ? undefined : metadata.expiresAt.epochMilliseconds + definition.skewMillis,
        leaseDeadline: leaseMillis > 0 ? leaseDeadlineOf(lease.hold, leaseMillis, env.clock) : noDeadline,
        report: reporter(reports, now)
      })
    )

  // User code: it may throw, or give no usable id; either rejects the message with the cause.
  const readMetadata = (event: A): Result.Result<Metadata, ErrorSummary.ErrorSummary> => {
    let metadata: Metadata
    try {
      metadata = definition.metadata(event)
    } catch (error) {
      return Result.fail(ErrorSummary.fromError(error, "Defect"))
    }
    if (typeof metadata !== "object" || metadata === null || typeof metadata.id !== "string" || metadata.id === "") {
      return Result.fail(
        ErrorSummary.make("MetadataInvalid", "the consumer's metadata gave no event id (a non-empty string)")
      )
    }
    return Result.succeed(metadata)
  }

  // User code too: the ordering key of an event (per-key ordering only).
  const readKey = (event: A): Result.Result<string, ErrorSummary.ErrorSummary> => {
    if (definition.ordering._tag !== "PerKey") return noKey
    let key: unknown
    try {
      key = definition.ordering.key(event)
    } catch (error) {
      return Result.fail(ErrorSummary.fromError(error, "Defect"))
    }
    return typeof key === "string"
      ? Result.succeed(key)
      : Result.fail(ErrorSummary.make("MetadataInvalid", `the consumer's ordering key gave ${typeof key}, not a string`))
  }

  // Per-key ordering: the delivery joins its key's lane, waits for its turn, then for a slot.
  // Each step is recorded on the admission as it completes, so whatever ends the delivery gives
  // back exactly what it took.
  const admit = (admission: Admission, key: string): Effect.Effect<void> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        yield* restore(lanes!.join(key, (place) => {
          admission.place = place
        }))
        Deferred.doneUnsafe(admission.entered, Effect.void)
        yield* restore(lanes!.turn(admission.place!))
        yield* restore(slots.take)
        admission.slot = true
      })
    )

  // The delivery as outcomes name it, before its event id is known.
  const messageRef = (delivery: Delivery): Outcome.MessageRef => ({
    consumer: definition.name,
    subject: delivery.subject,
    sequence: delivery.sequence,
    deliveryCount: delivery.deliveryCount,
    eventId: undefined
  })

  // Without a working attempt store the failed attempts are counted from deliveries instead.
  const orCountDeliveries = (fallback: number) =>
    Effect.catch((error: { readonly message: string }) =>
      Effect.as(Effect.logWarning(`attempt store unavailable; counting deliveries: ${error.message}`), fallback)
    )

  // The verdict of a delivery whose judging died: dead-lettered with the cause.
  const defect = (message: Outcome.MessageRef, error: ErrorSummary.ErrorSummary): Verdict =>
    Outcome.verdict("DeadLettered", { message, reason: "Defect", error })
  const defectVerdict = (message: Outcome.MessageRef) => (cause: Cause.Cause<unknown>): Effect.Effect<Verdict> =>
    Effect.succeed(defect(message, ErrorSummary.fromCause(cause)))

  // The safety net: a defect anywhere on the per-delivery path outside the handler (a probe, a
  // source) still ends the delivery in an outcome, dead-lettered with the cause.
  const judgeSafely = (
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> => {
    // `judge` builds its effect here, preparing the delivery at once: what that throws is caught too.
    let judged: Effect.Effect<Verdict, never, R>
    try {
      judged = judge(delivery, restore, lease, admission)
    } catch (error) {
      return Effect.succeed(defect(messageRef(delivery), ErrorSummary.fromError(error, "Defect")))
    }
    return Effect.catchCause(judged, defectVerdict(messageRef(delivery)))
  }

  /**
   * Decode: the checks before any wait or handler run. Fails with the verdict of a delivery that
   * ends here (rejected, expired, out of deliveries or attempts); succeeds with what the run needs.
   * Synchronous but for a redelivery's count of failed attempts, read from the attempt store.
   */
  // Suspended: whatever user code throws in `check` (a metadata function returning the wrong
  // shape) is a defect of this effect, which the safety nets turn into a dead letter.
  const prepare = (delivery: Delivery): Effect.Effect<Result.Result<Prepared<A>, Verdict>, never, R> =>
    Effect.suspend(() => {
      const checked = check(delivery)
      if (Result.isFailure(checked)) return Effect.succeed(checked)
      const prepared = checked.success
      // Failed attempts so far: the store's count (read only for a redelivery: a first delivery
      // has none, unless NATS rewound its count, and then the failure's own count catches it),
      // or without a store the deliveries before this one.
      if (attemptStore === undefined || delivery.deliveryCount === 1) return Effect.succeed(withinAttempts(prepared))
      return attemptStore.failures(prepared.key).pipe(
        orCountDeliveries(delivery.deliveryCount - 1),
        Effect.map((failedBefore) => withinAttempts({ ...prepared, failedBefore }))
      )
    })

  /**
   * The checks of `prepare` that need no I/O; `failedBefore` counts the deliveries before this
   * one (without an attempt store) or is 0, and `prepare` reads it from the store for a redelivery.
   */
  const check = (delivery: Delivery): Result.Result<Prepared<A>, Verdict> => {
    const decoded = definition.decode(delivery.payload)
    const ref = messageRef(delivery)
    if (Result.isFailure(decoded)) {
      return Result.fail(Outcome.verdict("Rejected", { message: ref, reason: decoded.failure.reason, error: decoded.failure.error }))
    }
    const event = decoded.success
    const read = readMetadata(event)
    if (Result.isFailure(read)) {
      return Result.fail(Outcome.verdict("Rejected", { message: ref, reason: "MetadataInvalid", error: read.failure }))
    }
    const metadata = read.success
    const message = { ...ref, eventId: metadata.id }
    const orderKey = readKey(event)
    if (Result.isFailure(orderKey)) {
      return Result.fail(Outcome.verdict("Rejected", { message, reason: "MetadataInvalid", error: orderKey.failure }))
    }
    if (delivery.publishedAt !== undefined) {
      record(clockSkew, delivery.publishedAt - metadata.time.epochMilliseconds)
    }
    // Compared in epoch milliseconds: a DateTime is built only for an expired event.
    if (metadata.expiresAt !== undefined) {
      const nowMillis = wallNow()
      if (isExpired(metadata, nowMillis, definition.skewMillis)) {
        return Result.fail(Outcome.verdict("Expired", {
          message,
          expiresAt: metadata.expiresAt,
          detectedAt: DateTime.makeUnsafe(nowMillis),
          stage: "BeforeHandler"
        }))
      }
    }
    if (delivery.deliveryCount > deliveryBound) {
      // Earlier deliveries ended without settling (a crash loop): stop while the broker still
      // delivers, so the message is dead-lettered rather than dropped at its MaxDeliver.
      return Result.fail(Outcome.verdict("DeadLettered", {
        message,
        reason: "DeliveriesExhausted",
        error: ErrorSummary.make(
          "DeliveriesExhausted",
          `delivered ${delivery.deliveryCount} times without settling; the bound is ${deliveryBound} deliveries`
        )
      }))
    }
    const key = { scope: definition.name, id: metadata.id }
    const failedBefore = attemptStore === undefined ? delivery.deliveryCount - 1 : 0
    return Result.succeed({ event, metadata, message, orderKey: orderKey.success, key, failedBefore })
  }

  /** The last attempt failed but was not dead-lettered (a crash, a failed dead-letter write). */
  const withinAttempts = (prepared: Prepared<A>): Result.Result<Prepared<A>, Verdict> =>
    prepared.failedBefore < definition.retry.attempts
      ? Result.succeed(prepared)
      : Result.fail(Outcome.verdict("DeadLettered", {
        message: prepared.message,
        reason: "AttemptsExhausted",
        error: ErrorSummary.make(
          "AttemptsExhausted",
          `${prepared.failedBefore} failed attempts; the retry policy allows ${definition.retry.attempts}`
        )
      }))

  /** `prepare` for a delivery that needs no I/O (no attempt store, or a first delivery), at once. */
  const checkNow = (delivery: Delivery): Result.Result<Prepared<A>, Verdict> => {
    try {
      const checked = check(delivery)
      return Result.isFailure(checked) ? checked : withinAttempts(checked.success)
    } catch (error) {
      return Result.fail(defect(messageRef(delivery), ErrorSummary.fromError(error, "Defect")))
    }
  }

  // Called when the delivery's effect runs (inside `process`): a delivery whose checks need no
  // I/O is prepared at once, without the steps of an effect (see "Where the time goes", docs/performance.md).
  const judge = (
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> =>
    attemptStore === undefined || delivery.deliveryCount === 1
      ? judgePrepared(checkNow(delivery), delivery, restore, lease, admission)
      : Effect.flatMap(prepare(delivery), (prepared) => judgePrepared(prepared, delivery, restore, lease, admission))

  /** `judge` once the delivery is prepared: the verdict of its checks, or its run. */
  const judgePrepared = (
    prepared: Result.Result<Prepared<A>, Verdict>,
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> => {
    if (Result.isFailure(prepared)) return Effect.succeed(prepared.failure)
    if (admission === undefined) return runHandler(prepared.success, delivery, restore, lease)
    // Interruptible: a shutdown past its drain, or a lost lease, ends the wait. Expiry is
    // checked again before the handler runs (stage AfterWait).
    return Effect.flatMap(Effect.exit(restore(admit(admission, prepared.success.orderKey))), (waited) => {
      if (Exit.isSuccess(waited)) return runHandler(prepared.success, delivery, restore, lease)
      const message = prepared.success.message
      return Effect.succeed(
        lease.lost
          ? Outcome.verdict("Released", {
            message,
            reason: "LeaseLost",
            error: ErrorSummary.make("LeaseLost", "no lease extension was confirmed while the delivery waited for its key"),
            retryIn: undefined
          })
          : Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
      )
    })
  }

  /** Run: the handler (with its in-process retries) under the lease, then the verdict. */
  const runHandler = (
    prepared: Prepared<A>,
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> =>
    // Called as the delivery's effect runs (see `judge`): the run starts now, unless a probe
    // watches, whose point comes first.
    probe === undefined
      ? runHandlerNow(prepared, delivery, restore, lease)
      : Effect.andThen(
        hit({ point: "received", consumer: definition.name, sequence: delivery.sequence, eventId: prepared.metadata.id }),
        Effect.suspend(() => runHandlerNow(prepared, delivery, restore, lease))
      )

  const runHandlerNow = (
    prepared: Prepared<A>,
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> => {
    const startedAt = now()
    // What the store reports about this delivery's effect, whatever the handler returns.
    const reports = noReportsYet()
    const concluded = (exit: Exit.Exit<unknown, unknown>) => {
      keeper.unregister(lease)
      record(handlerDuration, now() - startedAt)
      return conclude(prepared, delivery, exit, reports, lease)
    }
    // One step for the run's end, where `Effect.exit` and a `flatMap` take three.
    return Effect.matchCauseEffect(restore(attempt(prepared.event, delivery, prepared.metadata, prepared.failedBefore + 1, reports, lease)), {
      onSuccess: (value) => concluded(Exit.succeed(value)),
      onFailure: (cause) => concluded(Exit.failCause(cause))
    })
  }

  /** The verdict on a handler that returned: committed, or a duplicate the store recognised. */
  const succeeded = (message: Outcome.MessageRef, value: unknown, reports: Reports): Verdict =>
    // A store that reports nothing (called directly, not through `IdempotencyStore.commit`)
    // still says so in its result.
    (reports.alreadyCommitted || isAlreadyCommitted(value)) && !reports.committed
      ? Outcome.verdict("Duplicate", { message })
      : Outcome.verdict("Committed", { message })

  /** The verdict on a run of the handler, from its exit and what the store reported. */
  const conclude = (
    prepared: Prepared<A>,
    delivery: Delivery,
    exit: Exit.Exit<unknown, unknown>,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> =>
    Exit.isSuccess(exit) && probe === undefined
      ? Effect.succeed(succeeded(prepared.message, exit.value, reports))
      : concludeWithEffects(prepared, delivery, exit, reports, lease)

  /** `conclude` for a failed run, or one the probe watches. */
  const concludeWithEffects = (
    prepared: Prepared<A>,
    delivery: Delivery,
    exit: Exit.Exit<unknown, unknown>,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> =>
    Effect.gen(function*() {
      const { message, metadata, key, failedBefore } = prepared
      const afterCommit = hit({ point: "after-commit", consumer: definition.name, sequence: delivery.sequence, eventId: metadata.id })
      if (Exit.isSuccess(exit)) {
        const verdict = succeeded(message, exit.value, reports)
        if (verdict._tag === "Committed") yield* afterCommit
        return verdict
      }
      const failure = Cause.findErrorOption(exit.cause)
      // Cut by `handlerTimeout` while its COMMIT ran: the interruption waited for the COMMIT, and
      // the store reported it after the cut. Not a failed attempt: nothing after the commit ran.
      const timedOutInCommit = reports.committed && Option.isSome(failure) && failure.value instanceof HandlerTimeout &&
        !Cause.hasDies(exit.cause) && reports.committedAt >= failure.value.cutAt
      if (reports.committed && (Cause.hasInterruptsOnly(exit.cause) || timedOutInCommit)) {
        // Interrupted while COMMIT ran: the effect is committed. Say so, and leave the ack to the
        // redelivery (a Duplicate), which runs what the handler had left after its commit: a lost
        // lease forbids the ack, and shutdown is past its drain.
        yield* afterCommit
        return Outcome.verdict("Committed", {
          message,
          ackWithheld: lease.lost ? "LeaseLost" : timedOutInCommit ? "HandlerTimeout" : "Interrupted"
        })
      }
      const error = ErrorSummary.fromCause(exit.cause)
      if (
        Option.isSome(failure) && (failure.value instanceof ExpiredBeforeRun || failure.value instanceof WorkExpired) &&
        metadata.expiresAt !== undefined
      ) {
        if (reports.committed || reports.alreadyCommitted) {
          // Expired after the store committed the effect (or found it committed): `Expired` would
          // say "no effect". The effect is applied; only what followed the check is skipped.
          const verdict = succeeded(message, undefined, reports)
          if (verdict._tag === "Committed") yield* afterCommit
          return verdict
        }
        return Outcome.verdict("Expired", {
          message,
          expiresAt: metadata.expiresAt,
          detectedAt: DateTime.makeUnsafe(failure.value.detectedAt),
          stage: "AfterWait"
        })
      }
      if (Option.isSome(failure) && failure.value instanceof LeaseExpired) {
        // The handler found its lease gone before an irreversible step (`Lease.ensure`).
        return Outcome.verdict("Released", {
          message,
          reason: "LeaseLost",
          error: ErrorSummary.fromError(failure.value),
          retryIn: undefined
        })
      }
      if (lease.lost && Cause.hasInterrupts(exit.cause)) {
        // The keeper could not hold the lease: another consumer may own the message; leave it.
        return Outcome.verdict("Released", {
          message,
          reason: "LeaseLost",
          error: ErrorSummary.make("LeaseLost", "no lease extension was confirmed in time; the handler was interrupted"),
          retryIn: undefined
        })
      }
      if (Option.isNone(failure) && Cause.hasInterrupts(exit.cause) && !Cause.hasDies(exit.cause)) {
        // Interrupted (shutdown past its drain): the transaction rolled back; hand it back now.
        return Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
      }
      const transient = Option.isNone(failure) || isTransient(failure.value as E | HandlerTimeout | ExpiredBeforeRun)
      if (!transient) return Outcome.verdict("DeadLettered", { message, reason: "PermanentError", error })
      const failed = attemptStore === undefined
        ? delivery.deliveryCount
        : yield* attemptStore.recordFailure(key).pipe(orCountDeliveries(Math.max(failedBefore + 1, delivery.deliveryCount)))
      if (failed >= definition.retry.attempts) {
        return Outcome.verdict("DeadLettered", { message, reason: "AttemptsExhausted", error })
      }
      const retryIn = yield* Retry.delayAfter(definition.retry, failed)
      return Outcome.verdict("Released", { message, reason: "Retrying", error, retryIn })
    })

  /** Processes `delivery`; called where interruption is masked, `restore` unmasks the waits and the handler. */
  const process = (
    delivery: Delivery,
    admission: Admission | undefined,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<void, never, R> =>
    Effect.withFiber((fiber) => {
      const receivedAt = now()
      record(inFlightGauge, ++running)
      if (delivery.deliveryCount > 1) record(redeliveries, 1)
      if (delivery.pending !== undefined) progress.pending = delivery.pending
      // The lease is watched from receipt, the source's if it held the delivery in a buffer
      // (the broker's lease ran meanwhile), and also while the delivery waits for its key's turn.
      const lease = keeper.register(delivery, leaseStart(delivery, receivedAt), fiber)
      return Effect.flatMap(judgeSafely(delivery, restore, lease, admission), (judged) => {
        keeper.unregister(lease)
        if (admission !== undefined) {
          // The next delivery of the key may run while this one settles: its effect is decided.
          Deferred.doneUnsafe(admission.entered, Effect.void)
          if (admission.place !== undefined) lanes!.leave(admission.place)
          admission.place = undefined
        }
        return settle(delivery, judged, receivedAt, lease)
      })
    })

  /**
   * Settle and record: sends the verdict's broker command (never an ack past the lease), then
   * counts, logs and reports the outcome. Never fails. Called as the delivery's effect runs (the
   * continuation of its judging), so the command's time is read as it is sent. An ack, the
   * common command, goes straight to its outcome (no steps of `execute` and no value passed on:
   * each step of the fiber is CPU on every message, see docs/performance.md).
   */
  const settle = (delivery: Delivery, judged: Verdict, receivedAt: number, lease: LeaseKeeper.Lease): Effect.Effect<void> => {
    const decided = decide(judged, lease)
    if (decided.command._tag === "Ack") {
      return Effect.matchCauseEffect(delivery.ack, {
        onSuccess: () => settledAlone(delivery, decided, "confirmed", receivedAt),
        onFailure: (cause) => Effect.flatMap(commandFailed(cause), (result) => settledAlone(delivery, decided, result, receivedAt))
      })
    }
    return Effect.flatMap(execute(delivery, decided.command), (result) => settledAlone(delivery, decided, result, receivedAt))
  }

  /** `settled` for a delivery settled alone: nothing reads its outcome back. */
  const settledAlone = (
    delivery: Delivery,
    decided: Decided,
    result: "confirmed" | "stored" | "failed",
    receivedAt: number
  ): Effect.Effect<void> =>
    probe !== undefined || (decided.command._tag === "DeadLetter" && result === "failed")
      ? Effect.asVoid(settled(delivery, decided, result, receivedAt, true, true))
      : recordOutcome(delivery, outcomeOf(decided, result, receivedAt, settledAt(decided)), true)

  /** The verdict to act on and its broker command, decided when the command is sent. */
  const decide = (judged: Verdict, lease: LeaseKeeper.Lease): Decided => {
    // Never ack or nak past the local lease deadline (with the keeper's 10% margin): the server
    // may have handed the message to another consumer, and it applies either to whoever holds it
    // (a nak would hand it to a third while the second runs it). What was found stays said.
    const commandStart = now()
    const pastLease = leaseMillis > 0 && commandStart >= lease.hold.since + leaseMillis * 0.9
    const verdict = !pastLease
      ? judged
      : acks(judged)
      ? withholdAck(judged)
      : judged._tag === "Released" && judged.retryIn !== undefined
      ? { ...judged, reason: "LeaseLost" as const, retryIn: undefined }
      : judged
    // The time only stamps dead-letter records; skip building a DateTime for the other outcomes.
    const stamp = verdict._tag === "Committed" || verdict._tag === "Duplicate" || verdict._tag === "Released"
      ? EPOCH
      : DateTime.makeUnsafe(wallNow())
    return { verdict, command: Outcome.toCommand(verdict, { expiredTo: definition.expiredTo, now: stamp }), commandStart }
  }

  /**
   * Once the command has its answer: the outcome, recorded, and reported to `onOutcome` when
   * `report` (a batch reports its elements' outcomes together, see `reportAll`).
   */
  const settled = (
    delivery: Delivery,
    decided: Decided,
    result: "confirmed" | "stored" | "failed",
    receivedAt: number,
    ownSpan: boolean,
    report: boolean
  ): Effect.Effect<Outcome.Outcome> => {
    const { command, verdict } = decided
    const at = settledAt(decided)
    if (command._tag === "DeadLetter" && result === "failed") {
      return Effect.flatMap(deadLetterFailed(delivery, verdict, receivedAt), (outcome) => Effect.as(recordOutcome(delivery, outcome, ownSpan, report), outcome))
    }
    const outcome = outcomeOf(decided, result, receivedAt, at)
    const recorded = Effect.as(recordOutcome(delivery, outcome, ownSpan, report), outcome)
    return result === "confirmed" && command._tag === "Ack" && probe !== undefined
      ? Effect.andThen(
        hit({ point: "after-ack", consumer: definition.name, sequence: delivery.sequence, eventId: verdict.message.eventId }),
        recorded
      )
      : recorded
  }

  /** The time the command's answer came, with the command's latency recorded. */
  const settledAt = ({ command, commandStart }: Decided): number => {
    const at = now()
    if (command._tag !== "Leave") record(settleLatency[command._tag], at - commandStart)
    return at
  }

  /** The outcome of a verdict whose command had `result` at `at` (not a dead letter that failed). */
  const outcomeOf = ({ verdict }: Decided, result: "confirmed" | "stored" | "failed", receivedAt: number, at: number): Outcome.Outcome =>
    // A withheld ack is not a confirmed one, although saying nothing always "succeeds". A
    // dead letter `stored` but whose term was lost stays dead-lettered for good (a redelivery
    // writes the same dead letter again, stored once), unconfirmed, and nothing is naked.
    finish(verdict, result === "confirmed" && !(verdict._tag === "Committed" && verdict.ackWithheld !== undefined), at - receivedAt)

  /** An ack `ackAll` could not confirm: as `execute` reports a failed command. */
  const unconfirmedAck = (error: unknown) => Effect.as(Effect.logWarning("broker command failed", ErrorSummary.fromError(error)), "failed" as const)

  /**
   * Settles a batch's elements, each with its own command and outcome. The acks go through the
   * intake's `ackAll` when it has one (sent at once, confirmations awaited together, no fiber per
   * element); the other commands, and every ack without `ackAll`, run side by side. The
   * outcomes are reported to `onOutcome` once all are recorded, side by side too.
   */
  const settleAll = (
    deliveries: ReadonlyArray<Delivery>,
    verdicts: ReadonlyArray<Verdict>,
    receivedAt: number,
    leases: ReadonlyArray<LeaseKeeper.Lease>
  ): Effect.Effect<void> =>
    Effect.suspend(() => {
      const acked: Array<number> = []
      const others: Array<number> = []
      const decided = deliveries.map((_, index) => {
        const decision = decide(verdicts[index]!, leases[index]!)
        if (ackAll !== undefined && decision.command._tag === "Ack") acked.push(index)
        else others.push(index)
        return decision
      })
      const outcomes: Array<Outcome.Outcome> = []
      const settleOne = (index: number, result: "confirmed" | "stored" | "failed") =>
        Effect.map(settled(deliveries[index]!, decided[index]!, result, receivedAt, false, false), (outcome) => {
          outcomes.push(outcome)
        })
      const rest = Effect.forEach(
        others,
        (index) => Effect.flatMap(execute(deliveries[index]!, decided[index]!.command), (result) => settleOne(index, result)),
        { concurrency: "unbounded", discard: true }
      )
      const all = ackAll === undefined || acked.length === 0 ? rest : Effect.all([
        Effect.flatMap(
          // A source's defect, or a result of the wrong length, leaves every ack unconfirmed.
          ackAll(acked.map((index) => deliveries[index]!)).pipe(
            Effect.filterOrFail(
              (errors) => errors.length === acked.length,
              (errors) => new Error(`ackAll gave ${errors.length} results for ${acked.length} deliveries`)
            ),
            Effect.catchCause((cause) => {
              const failure = Cause.squash(cause) ?? new Error("ackAll failed")
              return Effect.succeed(acked.map(() => failure))
            })
          ),
          (errors) => Effect.forEach(acked, (index, i) => (errors[i] === undefined ? settleOne(index, "confirmed") : Effect.flatMap(unconfirmedAck(errors[i]), (result) => settleOne(index, result))), { discard: true })
        ),
        rest
      ], { concurrency: 2, discard: true })
      return definition.onOutcome === undefined ? all : Effect.andThen(all, Effect.suspend(() => reportAll(outcomes)))
    })

  /** The outcome of a dead letter that was not stored. */
  const deadLetterFailed = (delivery: Delivery, verdict: Verdict, receivedAt: number): Effect.Effect<Outcome.Outcome> =>
    Effect.gen(function*() {
      if (maxDeliver !== undefined && delivery.deliveryCount >= maxDeliver) {
        // The broker's last delivery: no redelivery can retry the dead letter. The outcome stays
        // the dead-letter verdict, unconfirmed; the message stays in its stream, no longer
        // delivered, and is recovered by its sequence once the dead-letter stream takes it.
        record(stranded, 1)
        yield* Effect.logError("dead-letter.stranded").pipe(
          Effect.annotateLogs({
            consumer: definition.name,
            source: definition.source.name,
            sequence: delivery.sequence,
            deliveryCount: delivery.deliveryCount,
            recover: `DeadLetter.recover({ stream, consumer, sequence: ${delivery.sequence} }) once the dead-letter stream has room`
          })
        )
        return finish(verdict, false, now() - receivedAt)
      }
      // Not terminated, so not lost: ask for a later redelivery, which dead-letters it again.
      const retryIn = yield* Retry.delayAfter(definition.retry, delivery.deliveryCount)
      const naked = (yield* execute(delivery, Outcome.Command.Nak({ delay: retryIn }))) === "confirmed"
      return finish(
        Outcome.verdict("Released", {
          message: verdict.message,
          reason: "DeadLetterFailed",
          error: ErrorSummary.make("DeadLetterFailed", "the dead-letter publish was not confirmed"),
          retryIn
        }),
        naked,
        now() - receivedAt
      )
    })

  /**
   * Record: the attempt count's cleanup, metrics, span, log line, progress, then `onOutcome` when
   * `report`. `ownSpan`: the delivery has a span of its own to annotate (a batch element shares its
   * batch's).
   */
  const recordOutcome = (delivery: Delivery, outcome: Outcome.Outcome, ownSpan: boolean, report = true): Effect.Effect<void> => {
    let effect: Effect.Effect<void> = ownSpan && fullSpans ? Effect.annotateCurrentSpan(spanAttributes(outcome)) : Effect.void
    const hadFailures = delivery.deliveryCount > 1 || (outcome._tag === "DeadLettered" && outcome.reason === "AttemptsExhausted")
    if (attemptStore !== undefined && outcome._tag !== "Released" && outcome.message.eventId !== undefined && hadFailures) {
      // Bounded growth: a message's failure count goes once it is settled for good (a count
      // left by a rewound delivery count is purged by age: `PgAttemptStore.purge`).
      effect = sequence(attemptStore.clear({ scope: definition.name, id: outcome.message.eventId }).pipe(Effect.ignore), effect)
    }
    record(counters.get(outcome._tag)!, 1)
    record(inFlightGauge, --running)
    recordKind(outcome)
    if (env.debugLogs || !isRoutine(outcome)) effect = sequence(effect, logOutcome(outcome))
    if (reportsProgress) {
      progress.counts.set(outcome._tag, (progress.counts.get(outcome._tag) ?? 0) + 1)
      progress.settled.set(outcome._tag, (progress.settled.get(outcome._tag) ?? 0) + 1)
      // The last delivery taken left nothing on the broker, and nothing runs: drained.
      if (running === 0 && progress.pending === 0) {
        const at = now()
        if (at - progress.drainedLineAt >= progressMillis) {
          progress.drainedLineAt = at
          const counts = countsInTableOrder(progress.settled)
          const settled = Object.values(counts).reduce((sum, n) => sum + n, 0)
          const text = Object.entries(counts).map(([tag, n]) => `${n} ${tag}`).join(", ")
          effect = sequence(
            effect,
            Effect.logInfo(`consumer ${definition.name} drained its backlog (${settled} settled: ${text})`).pipe(
              Effect.annotateLogs({ event: "consumer.drained", settled, counts })
            )
          )
          progress.settled.clear()
        }
      }
    }
    const onOutcome = definition.onOutcome
    if (onOutcome === undefined || !report) return effect
    return sequence(
      effect,
      // Its own fiber (interruptible, so the bound holds even though settlement itself is not).
      bounded(Effect.suspend(() => onOutcome(outcome)), outcomeDeadlines, onOutcomeTimedOut).pipe(Effect.catchCause(onOutcomeFailed))
    )
  }
  const onOutcomeTimedOut = () => Effect.logWarning(`onOutcome ran longer than ${Duration.format(definition.onOutcomeTimeout)}; cut`)
  const onOutcomeFailed = (cause: Cause.Cause<unknown>) => Effect.logWarning("onOutcome failed", ErrorSummary.fromCause(cause))

  /** `onOutcome` of each outcome: all started at once, each in its own fiber and bounded as one alone is. */
  const reportAll = (outcomes: ReadonlyArray<Outcome.Outcome>): Effect.Effect<void> => {
    const onOutcome = definition.onOutcome
    if (onOutcome === undefined || outcomes.length === 0) return Effect.void
    const startedAt = now()
    return Effect.flatMap(
      Effect.forEach(outcomes, (outcome) => Effect.forkChild(Effect.suspend(() => onOutcome(outcome)), { startImmediately: true })),
      (runs) =>
        Effect.forEach(
          runs,
          (run) => awaitBounded(run, startedAt, outcomeDeadlines, onOutcomeTimedOut).pipe(Effect.catchCause(onOutcomeFailed)),
          { discard: true }
        )
    )
  }

  const recordKind = (outcome: Outcome.Outcome): void => {
    switch (outcome._tag) {
      case "Released":
        if (outcome.reason === "Retrying") record(retries, 1)
        return
      case "Expired":
        return record(keyedMetric(Telemetry.expired, outcome.stage, { stage: outcome.stage }), 1)
      case "Rejected":
      case "DeadLettered":
        if (outcome.confirmed) record(keyedMetric(Telemetry.deadLettered, outcome.reason, { reason: outcome.reason }), 1)
        return
      default:
        return
    }
  }


  // The batch's safety net, as `judgeSafely` is the single delivery's: a defect while judging an
  // element still ends it in an outcome.
  const concludeSafely = (
    prepared: Prepared<A>,
    delivery: Delivery,
    exit: Exit.Exit<unknown, unknown>,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> =>
    conclude(prepared, delivery, exit, reports, lease).pipe(Effect.catchCause(defectVerdict(prepared.message)))

  /**
   * A batch (BE-JOB-007): every delivery is prepared on its own (a rejected or expired one ends
   * there), the rest go to the batch handler in one run, and each element is judged from its own
   * result and the store's reports, and settled with its own command. A run that fails as a whole
   * (its transaction, a defect, an interruption of its own, a result that is not one `Result` per
   * element) is not charged to every element: each element then runs alone, as a batch of one
   * with the consumer's in-process retries, so a poison element fails by itself and the others
   * commit. Whatever dies on the way, every element still ends in an outcome and its lease is
   * given back.
   */
  const processBatch = (deliveries: ReadonlyArray<Delivery>, batch: BatchDefinition<A, E, R>): Effect.Effect<void, never, R> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.withFiber((fiber) => {
        const receivedAt = now()
        running += deliveries.length
        const last = deliveries[deliveries.length - 1]!
        if (last.pending !== undefined) progress.pending = last.pending
        record(inFlightGauge, running)
        const leases = deliveries.map((delivery) => keeper.register(delivery, leaseStart(delivery, receivedAt), fiber))
        const unregister = () => {
          for (const lease of leases) keeper.unregister(lease)
        }
        // What the safety net keeps: the verdicts reached before a defect, and the elements' refs.
        let prepared: PreparedBatch<A> | undefined
        return prepareBatch(deliveries).pipe(
          Effect.flatMap((batchPrepared) => {
            prepared = batchPrepared
            const { verdicts, runnable } = batchPrepared
            return runnable.length === 0 ? Effect.succeed(verdicts) : runBatch(deliveries, batch, leases, verdicts, runnable, restore)
          }),
          Effect.catchCause((cause) => Effect.sync(() => batchDefect(deliveries, prepared, cause))),
          Effect.flatMap((verdicts) => {
            unregister()
            // Each element its own command, sent at once: individual acks, naks and dead letters.
            return settleAll(deliveries, verdicts as ReadonlyArray<Verdict>, receivedAt, leases)
          }),
          // Never left to the keeper: it would extend these leases for as long as the process lives.
          Effect.ensuring(Effect.sync(unregister))
        )
      })
    )

  /**
   * The batch's safety net, as `judgeSafely` is the single delivery's: after a defect anywhere on
   * the batch's path (user code the engine reads, such as a result array, or the engine's own), an
   * element keeps the verdict it had reached, and every other one is dead-lettered with the cause
   * (`Defect`), so none is left without an outcome.
   */
  const batchDefect = (
    deliveries: ReadonlyArray<Delivery>,
    prepared: PreparedBatch<A> | undefined,
    cause: Cause.Cause<unknown>
  ): ReadonlyArray<Verdict> => {
    const messages = deliveries.map(messageRef)
    for (const { index, prepared: element } of prepared?.runnable ?? []) messages[index] = element.message
    // Masked throughout, so an interruption here is not expected; if one is, it releases.
    const interrupted = Cause.hasInterruptsOnly(cause)
    const error = ErrorSummary.fromCause(cause)
    return deliveries.map((_, index) =>
      prepared?.verdicts[index] ??
        (interrupted
          ? Outcome.verdict("Released", { message: messages[index]!, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
          : defect(messages[index]!, error))
    )
  }

  /**
   * A batch's elements, prepared each on its own: a verdict for those that end here, the rest
   * runnable. Without I/O (no count to read from the attempt store) as most elements are; a
   * defect in the checks dead-letters the element alone.
   */
  const prepareBatch = (deliveries: ReadonlyArray<Delivery>): Effect.Effect<PreparedBatch<A>, never, R> => {
    const verdicts: Array<Verdict | undefined> = []
    const runnable: Array<Runnable<A>> = []
    const add = (index: number, prepared: Result.Result<Prepared<A>, Verdict>) => {
      if (Result.isFailure(prepared)) verdicts.push(prepared.failure)
      else {
        verdicts.push(undefined)
        runnable.push({ index, prepared: prepared.success, reports: noReportsYet() })
      }
    }
    const readsStore = (delivery: Delivery) => attemptStore !== undefined && delivery.deliveryCount > 1
    for (const delivery of deliveries) {
      if (delivery.deliveryCount > 1) record(redeliveries, 1)
    }
    if (!deliveries.some(readsStore)) {
      for (const [index, delivery] of deliveries.entries()) add(index, checkNow(delivery))
      return Effect.succeed({ verdicts, runnable })
    }
    return Effect.as(
      Effect.forEach(deliveries, (delivery, index) =>
        readsStore(delivery)
          ? prepare(delivery).pipe(
            Effect.catchCause((cause) => Effect.map(defectVerdict(messageRef(delivery))(cause), Result.fail)),
            Effect.map((prepared) => add(index, prepared))
          )
          : Effect.sync(() => add(index, checkNow(delivery))), { discard: true }),
      { verdicts, runnable }
    )
  }

  /**
   * What is wrong with a batch handler's value, or `undefined` when it is one `Result` per element.
   * Every entry is read (a hole is not skipped, as `every` would): the judging reads them all.
   */
  const resultsProblem = (value: unknown, elements: number): string | undefined => {
    if (!Array.isArray(value)) return `the batch handler gave ${value === null ? "null" : typeof value}, not an array of results`
    if (value.length !== elements) return `the batch handler gave ${value.length} results for ${elements} elements`
    for (let i = 0; i < elements; i++) {
      const entry: unknown = value[i]
      if (!Result.isResult(entry)) {
        return `the batch handler's result ${i} (of ${elements}) is ${entry === undefined ? "missing" : entry === null ? "null" : typeof entry}, not a Result`
      }
    }
    return undefined
  }

  /**
   * The verdict on a batch element whose result succeeded: as `succeeded` for a single delivery,
   * the store's reports decide with the value (a handler may map `commitBatch`'s values away). But
   * a store reports per event id, to every element of that id: of two copies of one event in the
   * batch (the store ran its effect once), only the first that succeeded is the commit, the other a
   * duplicate; `committedIds` holds the ids already judged committed in this batch.
   */
  const elementSucceeded = (prepared: Prepared<A>, value: unknown, reports: Reports, committedIds: Set<string>): Verdict => {
    const id = prepared.key.id
    const duplicate = isAlreadyCommitted(value) || (reports.committed ? committedIds.has(id) : reports.alreadyCommitted)
    if (duplicate) return Outcome.verdict("Duplicate", { message: prepared.message })
    if (reports.committed) committedIds.add(id)
    return Outcome.verdict("Committed", { message: prepared.message })
  }

  /** The batch handler's run over the runnable elements, then each element's verdict. */
  const runBatch = (
    deliveries: ReadonlyArray<Delivery>,
    batch: BatchDefinition<A, E, R>,
    leases: ReadonlyArray<LeaseKeeper.Lease>,
    verdicts: Array<Verdict | undefined>,
    runnable: ReadonlyArray<Runnable<A>>,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<Array<Verdict | undefined>, never, R> => {
    // A probe's defect must not cost the batch its outcomes.
    const hits = probe === undefined ? Effect.void : Effect.forEach(runnable, ({ index, prepared }) =>
      hit({ point: "received", consumer: definition.name, sequence: deliveries[index]!.sequence, eventId: prepared.metadata.id })
        .pipe(Effect.catchCause((cause) => Effect.logWarning("probe failed", ErrorSummary.fromCause(cause)))), { discard: true })
    const elements = runnable.map(({ index, prepared, reports }) => ({
      eventId: prepared.metadata.id,
      subject: deliveries[index]!.subject,
      sequence: deliveries[index]!.sequence,
      deliveryCount: deliveries[index]!.deliveryCount,
      // For `Expiry.ensure` and `Lease.ensure` in the batch handler, as a delivery's are.
      expiresAt: prepared.metadata.expiresAt === undefined ? undefined : prepared.metadata.expiresAt.epochMilliseconds + definition.skewMillis,
      leaseDeadline: leaseMillis > 0 ? leaseDeadlineOf(leases[index]!.hold, leaseMillis, env.clock) : noDeadline,
      report: reporter(reports, now)
    }))
    const run = Effect.suspend(() => {
      const startedAt = now()
      return Effect.map(
        Effect.exit(restore(
          supervised(Effect.suspend(() => batch.handle(runnable.map((r) => r.prepared.event))), batchTimeoutMessage)
            .pipe(Effect.provideService(CurrentBatch, { consumer: definition.name, elements }))
        )),
        (exit) => {
          record(handlerDuration, now() - startedAt)
          return exit
        }
      )
    })
    // Each of `elements` judged in turn, its verdict put in its place.
    const judgeEach = <T extends { readonly index: number }>(
      elements: ReadonlyArray<T>,
      judge: (element: T) => Effect.Effect<Verdict, never, R>
    ) =>
      Effect.as(Effect.forEach(elements, (element) => Effect.map(judge(element), (verdict) => {
        verdicts[element.index] = verdict
      }), { discard: true }), verdicts)
    // One result per element: each element's own decides. A success is judged at once, without an
    // effect of its own, unless a probe watches its commit.
    const judgeResults = (results: ReadonlyArray<Result.Result<unknown, unknown>>) => {
      const failed: Array<{ readonly index: number; readonly prepared: Prepared<A>; readonly failure: unknown }> = []
      const watched: Array<{ readonly index: number; readonly prepared: Prepared<A>; readonly verdict: Verdict }> = []
      const committedIds = new Set<string>()
      for (const [i, { index, prepared, reports }] of runnable.entries()) {
        const result = results[i]!
        if (Result.isFailure(result)) {
          failed.push({ index, prepared, failure: result.failure })
          continue
        }
        const verdict = elementSucceeded(prepared, result.success, reports, committedIds)
        verdicts[index] = verdict
        if (probe !== undefined && verdict._tag === "Committed") watched.push({ index, prepared, verdict })
      }
      const afterCommits = watched.length === 0 ? Effect.succeed(verdicts) : judgeEach(watched, ({ index, prepared, verdict }) =>
        hit({ point: "after-commit", consumer: definition.name, sequence: deliveries[index]!.sequence, eventId: prepared.metadata.id })
          .pipe(Effect.as(verdict), Effect.catchCause(defectVerdict(prepared.message))))
      if (failed.length === 0) return afterCommits
      // A failed element is judged by its own failure (its effect was undone, whatever the store
      // reported for another element of its id).
      return Effect.andThen(afterCommits, judgeEach(failed, ({ index, prepared, failure }) =>
        concludeSafely(prepared, deliveries[index]!, Exit.fail(failure), noReportsYet(), leases[index]!)))
    }
    // Whether the engine itself cut the run: a lease the keeper found lost, or this fiber
    // interrupted (a shutdown past its drain). An interruption still pending on this masked fiber
    // fails a `restore` of nothing at once. Any other interruption is the run's own (an element's
    // effect that interrupted itself, say): a failure of the whole run, not a cut.
    const cutByEngine: Effect.Effect<boolean> = leases.some((lease) => lease.lost)
      ? Effect.succeed(true)
      : Effect.map(Effect.exit(restore(Effect.void)), Exit.isFailure)
    const failedAsWhole = (exit: Exit.Exit<unknown, unknown>, problem: string | undefined) => {
      if (runnable.length === 1) {
        const failed = Exit.isFailure(exit) ? exit : Exit.die(new Error(problem))
        return judgeEach(runnable, ({ index, prepared, reports }) => concludeSafely(prepared, deliveries[index]!, failed, reports, leases[index]!))
      }
      return Effect.andThen(
        Effect.logWarning(
          `batch of ${runnable.length} failed as a whole; running its elements one by one`,
          Exit.isFailure(exit) ? ErrorSummary.fromCause(exit.cause) : ErrorSummary.make("BatchResultInvalid", problem ?? "")
        ),
        judgeEach(runnable, ({ index, prepared }) => {
          const delivery = deliveries[index]!
          const reports = noReportsYet()
          return Effect.flatMap(
            Effect.exit(restore(attempt(prepared.event, delivery, prepared.metadata, prepared.failedBefore + 1, reports, leases[index]!))),
            (single) => concludeSafely(prepared, delivery, single, reports, leases[index]!)
          )
        })
      )
    }
    return Effect.andThen(hits, Effect.flatMap(run, (exit): Effect.Effect<Array<Verdict | undefined>, never, R> => {
      if (Exit.isSuccess(exit)) {
        const problem = resultsProblem(exit.value, runnable.length)
        return problem === undefined ? judgeResults(exit.value) : failedAsWhole(exit, problem)
      }
      if (!Cause.hasInterrupts(exit.cause)) return failedAsWhole(exit, undefined)
      return Effect.flatMap(cutByEngine, (cut) =>
        cut
          // Cut (shutdown past its drain, a lease lost): released, or committed with the ack withheld.
          ? judgeEach(runnable, ({ index, prepared, reports }) => concludeSafely(prepared, deliveries[index]!, exit, reports, leases[index]!))
          : failedAsWhole(exit, undefined))
    }))
  }
  const batchTimeoutMessage = `batch handler ran longer than ${Duration.format(definition.handlerTimeout)}`

  // One span per delivery, after the messaging semantic conventions; it continues the trace of
  // the `traceparent` header when the message has one, and is a root span otherwise.
  // Called where interruption is masked (a worker between its take and the delivery's outcome),
  // so nothing can end a taken delivery before it has its outcome.
  const one = (
    delivery: Delivery,
    admission: Admission | undefined,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<void, never, R> => {
    const parent = Telemetry.parseTraceparent(delivery.header(Telemetry.traceparentHeader))
    if (!fullSpans) return withLocalSpan(process(delivery, admission, restore), delivery, parent)
    return process(delivery, admission, restore).pipe(
      Effect.withSpan(Telemetry.processSpanName(delivery.subject), {
        kind: "consumer",
        ...(parent === undefined ? { root: true } : { parent }),
        attributes: {
          [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
          [Telemetry.Attribute.operationType]: "process",
          [Telemetry.Attribute.operationName]: "process",
          [Telemetry.Attribute.destinationName]: delivery.subject,
          [Telemetry.Attribute.consumerGroup]: definition.name,
          [Telemetry.Attribute.bodySize]: delivery.payload.byteLength,
          [Telemetry.Attribute.attempt]: delivery.deliveryCount,
          [Telemetry.Attribute.streamSequence]: delivery.sequence
        }
        // The call site is always this line: a stack capture per delivery would tell nothing.
      }, { captureStackTrace: false })
    )
  }

  /**
   * A delivery's span when no backend will see it: a native span built here and provided as the
   * parent span, so that its ids still reach the delivery's log lines and continue into the spans
   * and messages the handler creates (and `Effect.currentSpan` finds it), without what only a
   * backend could observe: its attributes, stack frame and the context's span annotations.
   * `Effect.withSpan` cost five times as much (1.85 against 0.35 µs alone; about a tenth of the
   * no-op path's CPU over NATS).
   */
  const withLocalSpan = (
    effect: Effect.Effect<void, never, R>,
    delivery: Delivery,
    parent: Tracer.AnySpan | undefined
  ): Effect.Effect<void, never, R> => {
    const span = new Tracer.NativeSpan({
      name: Telemetry.processSpanName(delivery.subject),
      parent: parent === undefined ? noParent : Option.some(parent),
      annotations: Context.empty(),
      links: [],
      startTime: timed ? env.clock.currentTimeNanosUnsafe() : 0n,
      kind: "consumer",
      sampled: parent?.sampled === false ? false : sampledByLevel
    })
    return Effect.onExit(
      Effect.provideService(effect, Tracer.ParentSpan, span),
      (exit) => Effect.sync(() => span.end(timed ? env.clock.currentTimeNanosUnsafe() : 0n, exit))
    )
  }

  // One span per batch; its elements' outcomes are in their own log lines and metrics.
  const many = (deliveries: ReadonlyArray<Delivery>, batch: BatchDefinition<A, E, R>): Effect.Effect<void, never, R> =>
    processBatch(deliveries, batch).pipe(
      Effect.withSpan(Telemetry.processSpanName(deliveries[0]!.subject), {
        kind: "consumer",
        root: true,
        attributes: {
          [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
          [Telemetry.Attribute.operationType]: "process",
          [Telemetry.Attribute.operationName]: "process",
          [Telemetry.Attribute.destinationName]: deliveries[0]!.subject,
          [Telemetry.Attribute.consumerGroup]: definition.name,
          [Telemetry.Attribute.batchSize]: deliveries.length
        }
      }, { captureStackTrace: false })
    )

  // The periodic INFO line: outcomes by tag since the last one, in flight, left on the broker.
  const summary = Effect.suspend(() => {
    if (progress.counts.size === 0 && running === 0) return Effect.void
    const counts = countsInTableOrder(progress.counts)
    progress.counts.clear()
    const text = Object.entries(counts).map(([tag, n]) => `${n} ${tag}`).join(", ")
    return Effect.logInfo(
      `consumer ${definition.name}: ${text === "" ? "nothing settled" : text} in the last ` +
        `${Duration.format(definition.progressInterval)}; ${running} in flight` +
        (progress.pending === undefined ? "" : `, ${progress.pending} left on the broker`)
    ).pipe(Effect.annotateLogs({ event: "consumer.progress", counts, inFlight: running, pending: progress.pending ?? null }))
  })

  return { one, many, summary, running: () => running }
}

/**
 * `first`, then `second`, where `Effect.void` stands for nothing to do and costs no step of the
 * fiber (the outcome's bookkeeping is usually nothing but `onOutcome`).
 */
const sequence = (first: Effect.Effect<void>, second: Effect.Effect<void>): Effect.Effect<void> =>
  first === Effect.void ? second : second === Effect.void ? first : Effect.andThen(first, second)

/** Counts by outcome tag, in the outcome table's order (so a line reads the same way every time). */
const countsInTableOrder = (counts: ReadonlyMap<Outcome.Tag, number>): Record<string, number> => {
  const ordered: Record<string, number> = {}
  for (const tag of Outcome.tags) {
    const n = counts.get(tag)
    if (n !== undefined) ordered[tag] = n
  }
  return ordered
}

const spanAttributes = (outcome: Outcome.Outcome): Record<string, unknown> => {
  const attributes: Record<string, unknown> = { [Telemetry.Attribute.outcome]: outcome._tag }
  if (outcome.message.eventId !== undefined) attributes[Telemetry.Attribute.messageId] = outcome.message.eventId
  if ("reason" in outcome) attributes[Telemetry.Attribute.outcomeReason] = outcome.reason
  return attributes
}

/** Runs the engine until interrupted (then drains) or until the source fails. */
export const run = <A, E extends Tagged, R>(definition: Definition<A, E, R>): Effect.Effect<never, SourceError, R> =>
  Effect.scoped(
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      // Readiness counts this consumer as starting until its intake is open.
      const component = yield* lifecycle.component(definition.name, "consumer")
      const intake = yield* definition.source.open({
        consumer: definition.name,
        prefetch: definition.prefetch,
        concurrency: definition.concurrency,
        attempts: definition.retry.attempts,
        handlerTimeout: definition.handlerTimeout,
        ordering: definition.ordering._tag
      })
      const slots = Slots.make(definition.concurrency)
      const releaseSlot = Effect.sync(slots.release)
      // Created before the FiberSet, so they outlive its finalizer: it interrupts what outlived the
      // drain and waits for it, and meanwhile leases must still be extended, and a settling's
      // handler run and onOutcome still cut at their bounds.
      const keeper = yield* LeaseKeeper.make(intake.lease)
      const clock = yield* Clock.Clock
      const deadlines = yield* Deadlines.make(definition.handlerTimeout, clock)
      const outcomeDeadlines = definition.onOutcome === undefined ? Deadlines.none : yield* Deadlines.make(definition.onOutcomeTimeout, clock)
      // The workers (or, with per-key ordering and for batches, the deliveries and batches) running.
      const inFlight = yield* FiberSet.make<void, SourceError>()
      // Set once shutdown has begun: a worker whose take then fails ends quietly.
      let closing = false
      // The workers waiting for a delivery (without per-key ordering and batches): shutdown ends their wait.
      const idleWorkers = new Set<Fiber.Fiber<unknown, unknown>>()
      // Runs before the FiberSet's own finalizer (which interrupts what is left) and before the
      // intake's: stop reserving, then let running handlers finish until the drain share of the
      // worker's shutdown budget ends (unmanaged: for `drainTimeout`).
      yield* Effect.addFinalizer(() =>
        Effect.gen(function*() {
          closing = true
          yield* component.down("stopping")
          yield* lifecycle.stage("intake", definition.name, "drain", intake.close)
          // Workers waiting for a delivery stop waiting (a source need not fail a waiting take).
          for (const fiber of idleWorkers) fiber.interruptUnsafe()
          const drained = lifecycle.deadline("drain") === undefined
            ? Option.isSome(yield* FiberSet.awaitEmpty(inFlight).pipe(Effect.timeoutOption(definition.drainTimeout)))
            : (yield* lifecycle.stage("drain", definition.name, "drain", FiberSet.awaitEmpty(inFlight))) === "completed"
          if (!drained) {
            yield* Effect.logWarning(`drain budget spent; interrupting ${processor.running()} handlers`)
          }
        })
      )
      const attemptStore = Option.getOrUndefined(yield* Effect.serviceOption(AttemptStore))
      // The crash-loop guard: the consumer's own bound, and below the broker's MaxDeliver so the
      // engine still gets the delivery on which it dead-letters the message itself.
      const deliveryBound = intake.maxDeliver === undefined
        ? definition.maxDeliveries
        : Math.min(definition.maxDeliveries, intake.maxDeliver - 1)
      const ordering = definition.ordering
      const lanes = ordering._tag === "PerKey" ? Lanes.make(ordering.limits) : undefined
      const probe = yield* Probe.Probe
      const env: RunEnvironment = {
        context: yield* Effect.context<never>(),
        clock,
        probe: probe === Probe.noop ? undefined : probe,
        debugLogs: yield* LogLevel.isEnabled("Debug")
      }
      const processor = makeProcess(
        definition,
        intake.lease,
        keeper,
        attemptStore,
        deliveryBound,
        intake.maxDeliver,
        slots,
        lanes,
        deadlines,
        outcomeDeadlines,
        intake.ackAll,
        env
      )
      const runFiber = FiberSet.run(inFlight)
      if (Duration.toMillis(definition.progressInterval) > 0) {
        yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(definition.progressInterval), processor.summary)))
      }
      yield* component.up
      yield* Effect.logInfo(
        `consumer ${definition.name} started on ${definition.source.name} ` +
          `(concurrency ${definition.concurrency}, prefetch ${definition.prefetch}, lease ${Duration.format(intake.lease)}, ` +
          `ordering ${
            ordering._tag === "PerKey"
              ? `per key: at most ${ordering.limits.maxHeld} held, ${ordering.limits.maxKeys} keys, ${ordering.limits.maxPerLane} per key`
              : ordering._tag.toLowerCase()
          })`
      )
      const batch = definition.batch
      if (batch !== undefined) {
        // A slot per batch, then up to `maxSize` deliveries, waiting at most `maxWait` after the
        // first for the rest. Deliveries collected when the intake stops (shutdown, a failed
        // source) still run as a batch, in the drain.
        const maxWaitMillis = Duration.toMillis(batch.maxWait)
        // The rest of a batch: one bound for all of it (a take cut by the bound takes nothing, so
        // what was collected is all there is); what is buffered is taken without waiting.
        const collectRest = (into: Array<Delivery>): Effect.Effect<void, SourceError> =>
          Effect.suspend(() =>
            into.length >= batch.maxSize
              ? Effect.void
              : Effect.flatMap(intake.take, (delivery) => {
                into.push(delivery)
                return collectRest(into)
              })
          )
        const collect = (into: Array<Delivery>): Effect.Effect<void, SourceError> =>
          Effect.flatMap(intake.take, (first) => {
            into.push(first)
            return into.length >= batch.maxSize || maxWaitMillis <= 0
              ? Effect.void
              : Effect.asVoid(Effect.timeoutOption(collectRest(into), batch.maxWait))
          })
        return yield* Effect.forever(
          Effect.uninterruptibleMask((restore) =>
            Effect.gen(function*() {
              yield* restore(slots.take)
              const deliveries: Array<Delivery> = []
              const collected = yield* Effect.exit(restore(collect(deliveries)))
              if (deliveries.length > 0) {
                yield* runFiber(processor.many(deliveries, batch).pipe(Effect.ensuring(releaseSlot)))
              } else {
                slots.release()
              }
              if (Exit.isFailure(collected)) return yield* collected
            })
          ),
          // No yield per delivery: the loop waits on the intake and slots anyway, and a yield
          // is an event-loop turn per message.
          { disableYield: true }
        )
      }
      if (lanes === undefined) {
        // `concurrency` long-lived workers, each taking its next delivery once the last one has its
        // outcome: no fiber, slot or scheduler turn per message. The source's `take` must not run
        // concurrently with itself, so the workers take in turn (`turn`, a slot of one, handed on
        // inline). A worker's take that fails ends it: quietly once shutdown has begun, else with
        // the source's error, which ends the run. A worker interrupted outside shutdown (the lease
        // keeper cut its delivery) ends after settling it, and a new one takes its place.
        const turn = Slots.make(1)
        const takeInTurn = Effect.andThen(turn.take, Effect.ensuring(intake.take, Effect.sync(turn.release)))
        // A worker is idle while it waits to take (shutdown interrupts it there); once shutdown has
        // begun it takes nothing more, whatever the source would still give.
        const worker: Effect.Effect<void, SourceError, R> = Effect.withFiber((self) =>
          Effect.uninterruptibleMask((restore) => {
            const loop: Effect.Effect<void, SourceError, R> = Effect.suspend(() => {
              if (closing) return Effect.void
              idleWorkers.add(self)
              return Effect.flatMap(restore(takeInTurn), (delivery) => {
                idleWorkers.delete(self)
                return Effect.andThen(processor.one(delivery, undefined, restore), loop)
              })
            })
            return loop
          }).pipe(
            Effect.ensuring(Effect.sync(() => idleWorkers.delete(self))),
            Effect.catch((error) => (closing ? Effect.void : Effect.fail(error))),
            Effect.onInterrupt(() => Effect.suspend(() => (closing ? Effect.void : Effect.asVoid(start()))))
          )
        )
        const start = (): Effect.Effect<Fiber.Fiber<void, SourceError>, never, R> => runFiber(worker)
        for (let i = 0; i < definition.concurrency; i++) yield* start()
        return yield* FiberSet.join(inFlight).pipe(Effect.andThen(Effect.never))
      }
      // Per key: room among the held deliveries first, then a delivery, whose fiber finds its
      // key's lane (waiting there, not here, for its turn and a slot). The next take waits until
      // it has found its place: a full lane stops the intake instead of buffering past the limits.
      return yield* Effect.forever(
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(function*() {
            yield* restore(lanes.awaitRoom)
            const delivery = yield* restore(intake.take)
            const admission: Admission = { place: undefined, slot: false, entered: Deferred.makeUnsafe<void>() }
            lanes.hold()
            yield* runFiber(Effect.uninterruptibleMask((unmask) => processor.one(delivery, admission, unmask)).pipe(
              Effect.ensuring(Effect.suspend(() => {
                Deferred.doneUnsafe(admission.entered, Effect.void)
                if (admission.place !== undefined) lanes.leave(admission.place)
                lanes.unhold()
                if (admission.slot) slots.release()
                return Effect.void
              }))
            ))
            yield* restore(Deferred.await(admission.entered))
          })
        ),
        // No yield per delivery: the loop waits on the intake and slots anyway, and a yield
        // is an event-loop turn per message.
        { disableYield: true }
      )
    })
  ).pipe(Effect.annotateLogs({ consumer: definition.name }))

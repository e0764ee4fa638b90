/**
 * The engine's data: a consumer's normalised settings (`Definition`, built by `Consumer`), what a
 * delivery carries from one stage to the next (`Prepared`, `Reports`, `Decided`, `Admission`), the
 * batch path's elements, and the errors the engine itself fails a handler run with. Types, and the
 * few values that belong to them, in a module of their own so that each stage's module imports
 * them without importing another stage.
 */
import { type Clock, type Context, Data, type Deferred, type Duration, type Effect, type Result } from "effect"
import type { Classification, Tagged } from "../../Classification.ts"
import type { CurrentBatch, CurrentDelivery } from "../../CurrentDelivery.ts"
import type { Metadata } from "../../Envelope.ts"
import type * as ErrorSummary from "../../ErrorSummary.ts"
import type * as Outcome from "../../Outcome.ts"
import type * as Probe from "../../Probe.ts"
import type * as Retry from "../../Retry.ts"
import type { Source } from "../../Source.ts"
import type * as Lanes from "../lanes.ts"
import type { LifecycleShape } from "../lifecycleService.ts"

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
  /** The lifecycle's dependencies the consumer pauses on while down: all, those named, or none (`undefined`). */
  readonly pauseOn: "all" | ReadonlyArray<string> | undefined
  /** The longest one delivery is held while its dependencies are down. */
  readonly maxHold: Duration.Duration
  /** Batch consumers only; their `handle` runs one event as a batch of one. */
  readonly batch: BatchDefinition<A, E, R> | undefined
}

/**
 * A delivery's admission under per-key ordering: its place in its key's lane and its slot, both
 * given back once it settles (whatever ends it), and `entered`, which tells the intake that the
 * delivery has found its place (or needs none), so it may take the next one.
 */
export interface Admission {
  place: Lanes.Place | undefined
  slot: boolean
  readonly entered: Deferred.Deferred<void>
}

/** A delivery that passed the checks before its handler: what running and judging it needs. */
export interface Prepared<A> {
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
export interface Reports {
  committed: boolean
  alreadyCommitted: boolean
  /** When the store reported `Committed` (the clock's millis), if it did. */
  committedAt: number
}

/** A delivery's reports before the store has said anything. */
export const noReportsYet = (): Reports => ({ committed: false, alreadyCommitted: false, committedAt: 0 })

/** The event expired while the engine waited to run the handler again (an in-process retry). */
export class ExpiredBeforeRun extends Data.TaggedError("ExpiredBeforeRun")<{ readonly detectedAt: number }> {}

/**
 * A handler attempt that ran past `handlerTimeout`; transient. `cutAt`: when the deadline watcher
 * interrupted it (the clock's monotonic millis), which tells a run cut while its `COMMIT` ran (the store
 * reported `Committed` after it) from one cut in work done after the commit.
 */
export class HandlerTimeout extends Data.TaggedError("HandlerTimeout")<{ readonly message: string; readonly cutAt: number }> {}

/** A delivery's verdict before it settles (`Outcome.Verdict`). */
export type Verdict = Outcome.Verdict

/** A verdict as acted on (an ack withheld past the lease) and its broker command. */
export interface Decided {
  readonly verdict: Verdict
  readonly command: Outcome.Command
  /** When the command was sent: the start of its settle latency. */
  readonly commandStart: number
}

/**
 * What the per-delivery path reads once per run rather than per message: the run's context (for
 * metrics), its clock, its probe (`undefined` for the default, which is skipped), and whether
 * debug lines are logged at all.
 */
export interface RunEnvironment {
  readonly context: Context.Context<never>
  readonly clock: Clock.Clock
  /** The lifecycle in effect (its dependencies pause the consumer, see `dependencyGate.ts`). */
  readonly lifecycle: LifecycleShape
  readonly probe: Probe.ProbeShape | undefined
  readonly debugLogs: boolean
}

/** A batch element that goes to the batch handler. */
export interface Runnable<A> {
  readonly index: number
  readonly prepared: Prepared<A>
  readonly reports: Reports
}

/** A batch once each element is prepared: the verdicts of those that ended there, and the rest. */
export interface PreparedBatch<A> {
  readonly verdicts: Array<Verdict | undefined>
  readonly runnable: ReadonlyArray<Runnable<A>>
}

/** Updates one metric series. */
export type Series = (value: number) => void

/**
 * The field of a failure outcome whose event's effect is committed (`effectCommitted: true`), or
 * nothing: spread into the outcome's fields.
 */
export const effectCommittedIf = (committed: boolean): { readonly effectCommitted: true } | undefined =>
  committed ? effectCommitted : undefined

const effectCommitted = { effectCommitted: true } as const

/**
 * A consumer: what to read (a {@link Source}), how to decode it (a `Schema`), what to do with it
 * (the handler, usually an idempotent commit) and how to treat failures (a complete
 * {@link Classification} of the handler's typed errors and a {@link RetryPolicy}). `make` checks
 * and normalises the options once; `run` runs the engine until it is interrupted (graceful
 * drain) or its source fails.
 *
 * The engine's contract, in one sentence: every delivery ends in exactly one {@link Outcome},
 * whose broker command is sent only after the handler's effect has exited, and an ack only after
 * it succeeded. It keeps no unbounded buffer (at most `prefetch` reserved deliveries wait, at
 * most `concurrency` run, and with per-key ordering at most `maxQueued` more wait for their key)
 * and builds nothing per message beyond the fibers that run it. `makeBatch` builds a batch
 * consumer: deliveries handled together, each with its own result, outcome and broker command.
 *
 * @since 0.1.0
 */
import { Data, Duration, Effect, Exit, Result, Schema } from "effect"
import type { Classification, Tagged } from "./Classification.ts"
import type { WorkExpired } from "./Expiry.ts"
import type { LeaseExpired } from "./Lease.ts"
import { CurrentBatch, CurrentDelivery } from "./CurrentDelivery.ts"
import type { Metadata } from "./Envelope.ts"
import * as ErrorSummary from "./ErrorSummary.ts"
import * as DurationInput from "./DurationInput.ts"
import * as Engine from "./internal/engine.ts"
import * as EnvelopeDecoder from "./internal/envelopeDecoder.ts"
import type { Ordering } from "./Ordering.ts"
import type { Outcome, RejectReason } from "./Outcome.ts"
import * as Retry from "./Retry.ts"
import type { Source, SourceError } from "./Source.ts"

/** Options shared by every consumer. */
export interface BaseOptions<A, E extends Tagged, R, RS> {
  /**
   * The consumer's name: the deduplication scope and the name in logs and outcomes. 1 to 100
   * characters from `A-Z a-z 0-9 _ -`.
   */
  readonly name: string
  /** Where deliveries come from, e.g. `JetStreamSource.make(...)`. */
  readonly source: Source<RS>
  /** Decodes the JSON payload. A payload that is not JSON, or fails this schema, is `Rejected`. */
  readonly schema: Schema.Decoder<A>
  /**
   * The handler. Its typed errors are classified by `classify`; defects count as transient. The
   * engine provides it `CurrentDelivery`.
   */
  readonly handle: (event: A) => Effect.Effect<unknown, E, R>
  /**
   * One entry for every `_tag` the handler can fail with, except `WorkExpired` (`Expiry.ensure`)
   * and `LeaseExpired` (`Lease.ensure`), which the engine handles itself.
   */
  readonly classify: NoInfer<Classification<Exclude<E, WorkExpired | LeaseExpired>>>
  /** Attempts and backoff. Default: `Retry.defaultPolicy` (5 attempts, 200 ms doubling to 30 s, jittered). */
  readonly retry?: Retry.RetryPolicy | undefined
  /** Handlers running at once, 1 to 10 000. Default: 16 (1, and only 1, with ordering `"sequential"`). */
  readonly concurrency?: number | undefined
  /**
   * Deliveries reserved ahead and waiting locally, 1 to 10 000. Default: `concurrency`. A waiting
   * delivery already runs down its lease (the engine counts it from the source's receipt, and one
   * taken too late is not acked), so keep `prefetch × slowest handler` under the lease.
   */
  readonly prefetch?: number | undefined
  /**
   * Which deliveries may run at the same time (BE-JOB-004; see `Ordering`): `"unordered"`
   * (default), `{ perKey: (event) => key, maxQueued?, maxQueuedPerKey?, maxKeys? }` or
   * `"sequential"`. One instance holds at most `concurrency` deliveries (per key:
   * `concurrency + maxQueued`) beside the source's `prefetch`.
   */
  readonly ordering?: Ordering<NoInfer<A>> | undefined
  /**
   * Bound on one run of the handler (each in-process retry is a run of its own). A run past it is
   * interrupted, so its transaction rolls back, and fails with `HandlerTimeout`, which counts as
   * transient. A run reached while its `COMMIT` is in flight is cut once the `COMMIT` has ended:
   * when it committed, the outcome is `Committed` with the ack withheld (`HandlerTimeout`), and the
   * redelivery, a `Duplicate`, runs what the handler had left. Default: 30 seconds.
   */
  readonly handlerTimeout?: Duration.Input | undefined
  /**
   * On interruption, how long running handlers may take to finish before they are interrupted
   * (their messages are then released, not acked). Under `Worker.runMain` the worker's shutdown
   * budget bounds the drain instead (its drain share) and this option is not used. Default: 10 seconds.
   */
  readonly drainTimeout?: Duration.Input | undefined
  /** Expiry handling (BE-JOB-005). */
  readonly expiry?: {
    /** Allowance for producer/consumer clock skew. Default: 0. */
    readonly skew?: Duration.Input | undefined
    /**
     * What settles expired work: `"ack"` (default) or `"deadLetter"`, spelled exactly so; any other
     * value is an invalid option (`run` fails with {@link InvalidOptions}).
     */
    readonly onExpired?: "ack" | "deadLetter" | undefined
  } | undefined
  /**
   * Called once with every outcome, after its broker command, its metric and its log line. Its
   * failures, defects and synchronous throws are logged and ignored; a call still running after
   * `onOutcomeTimeout` is interrupted, so it can neither lose an outcome nor hold a shutdown.
   */
  readonly onOutcome?: ((outcome: Outcome) => Effect.Effect<void>) | undefined
  /** Bound on one `onOutcome` call. Default: 5 seconds. */
  readonly onOutcomeTimeout?: Duration.Input | undefined
  /**
   * How often an INFO line sums up the consumer's progress (outcomes by tag since the last line,
   * deliveries in flight, messages the broker still holds), written only when something happened.
   * A line also says when the consumer has drained the broker's backlog: nothing left on the
   * broker, nothing running, and no delivery it released (for a retry) waiting for its redelivery
   * (one that does not come back a lease past its due time, taken by another process, stops
   * counting). `0` turns both off.
   * Default: 30 seconds.
   */
  readonly progressInterval?: Duration.Input | undefined
  /**
   * The crash-loop guard: a message delivered more often than this without settling is
   * dead-lettered (`DeliveriesExhausted`) without running the handler. Attempts are counted
   * apart from deliveries when an `AttemptStore` is in the context (failed attempts only);
   * without one the delivery count is the attempt count. Lowered to the broker's MaxDeliver − 1
   * when that is smaller. 1 to 10 000. Default: twice the retry policy's attempts.
   */
  readonly maxDeliveries?: number | undefined
  /**
   * Pausing while a dependency is down. The dependencies are the lifecycle's: under a worker
   * (`Worker.runMain`) each `Lifecycle.resource` with a `check`, and the NATS connection; without
   * a managed lifecycle there are none, and this does nothing. While one the consumer pauses on is
   * down (its last check failed), the consumer's workers take no new delivery, and a delivery whose
   * handler failed transiently (after its in-process retries) is held: its lease kept, its failure
   * not counted as an attempt, until the dependencies are up again, when the handler runs again. A
   * transient failure while the checks still pass probes the dependencies at once (concurrent
   * failures share a probe, and one that ended within the last 500 ms stands for a new one), so an
   * outage pauses the consumer within one failure instead of one check interval. Each hold and
   * each pause is logged (`delivery.held`, `consumer.paused`, `consumer.resumed`, the last once the
   * dependencies are back, whether or not a delivery still waits). A delivery is held at most
   * `maxHold` from its first hold, after which its failure counts as usual; the consumer's stopping
   * ends a hold at once, releasing the delivery (`Interrupted`) without counting, so a shutdown
   * during an outage does not wait out its drain. Without an attempt store, a redelivery to this
   * consumer run does not count a delivery released from a hold (by stopping or a lost lease) as a
   * failed attempt. In a batch consumer, a batch that fails as a whole runs its elements alone, as
   * ever, and an element that fails alone so is held the same way; the elements held one after
   * another share one `maxHold`, counted from the batch's first hold. While paused, a source that
   * can (`Intake.holdBuffered`: the JetStream source) keeps the leases of what it buffered before
   * the pause, for at most `maxHold`, so a pause longer than the lease hands none of it back to the
   * broker. Names in `pauseOn` that no dependency of the process has are logged at start as a
   * warning (`consumer.pause_on_unknown`).
   */
  readonly dependencies?: {
    /** The dependencies the consumer pauses on: `"all"` (default), `"none"`, or their names. */
    readonly pauseOn?: "all" | "none" | ReadonlyArray<string> | undefined
    /** The longest one delivery (or one batch's elements together) is held, from the first hold. Default: 5 minutes. */
    readonly maxHold?: Duration.Input | undefined
  } | undefined
}

/** `metadata` may be omitted exactly when the decoded event already is {@link Metadata}. */
export type MetadataOption<A> = [A] extends [Metadata] ? {
    /** Reads the event's id, time and expiry. Default: the event itself. */
    readonly metadata?: ((event: A) => Metadata) | undefined
  }
  : {
    /** Reads the event's id, time and expiry. */
    readonly metadata: (event: A) => Metadata
  }

/** Everything `make` accepts. */
export type Options<A, E extends Tagged, R, RS = never> = BaseOptions<A, E, R, RS> & MetadataOption<A>

/** A problem with a consumer's options. */
export type OptionProblem = Retry.OptionProblem

/** A consumer whose options were found unusable; `run` fails with it before any I/O. */
export class InvalidOptions extends Data.TaggedError("InvalidOptions")<{
  readonly consumer: string
  readonly problems: ReadonlyArray<OptionProblem>
}> {
  override get message(): string {
    return `consumer ${JSON.stringify(this.consumer)} has invalid options: ` +
      this.problems.map((p) => `${p.option} ${p.problem}`).join("; ")
  }
}

const TypeId: unique symbol = Symbol.for("@jetworker/core/Consumer")

/** A checked, normalised consumer definition. */
export interface Consumer<in out A, in out E extends Tagged, out R> {
  readonly [TypeId]: typeof TypeId
  readonly name: string
  /** The normalised settings the engine runs with. */
  readonly definition: Engine.Definition<A, E, R>
  /** What `make` found wrong; empty for a usable consumer. */
  readonly problems: ReadonlyArray<OptionProblem>
}

const NAME = /^[A-Za-z0-9_-]{1,100}$/

const durationOption = (
  problems: Array<OptionProblem>,
  option: string,
  input: Duration.Input | undefined,
  fallback: Duration.Duration,
  allowZero: boolean
): Duration.Duration => {
  if (input === undefined) return fallback
  // Checked as given: parsed, a NaN (say `Number(env.X)`) would already be a zero duration.
  const duration = DurationInput.parse(input)
  if (duration === undefined || !Duration.isFinite(duration) || Duration.toMillis(duration) < (allowZero ? 0 : 1)) {
    problems.push({
      option,
      problem: `must be a finite duration${allowZero ? "" : " above zero"} such as "30 seconds", got ${DurationInput.show(input)}`
    })
    return fallback
  }
  return duration
}

/**
 * The dependencies a consumer pauses on: `undefined` for none, `"all"`, or their names (each a
 * non-empty string; a list of none pauses on none).
 */
const pauseOnOption = (problems: Array<OptionProblem>, pauseOn: unknown): "all" | ReadonlyArray<string> | undefined => {
  if (pauseOn === undefined || pauseOn === "all") return "all"
  if (pauseOn === "none") return undefined
  if (Array.isArray(pauseOn) && pauseOn.every((name) => typeof name === "string" && name !== "")) {
    return pauseOn.length === 0 ? undefined : (pauseOn as ReadonlyArray<string>)
  }
  problems.push({
    option: "dependencies.pauseOn",
    problem: `must be "all", "none" or a list of dependency names, got ${DurationInput.show(pauseOn)}`
  })
  return "all"
}

/** What settles expired work; anything but the two spellings is a problem, never a silent ack. */
const expiredToOption = (problems: Array<OptionProblem>, onExpired: unknown): "Ack" | "DeadLetter" => {
  if (onExpired === undefined || onExpired === "ack") return "Ack"
  if (onExpired === "deadLetter") return "DeadLetter"
  problems.push({ option: "expiry.onExpired", problem: `must be "ack" or "deadLetter", got ${DurationInput.show(onExpired)}` })
  return "Ack"
}

const intOption = (
  problems: Array<OptionProblem>,
  option: string,
  value: number | undefined,
  fallback: number,
  max: number,
  min = 1
): number => {
  if (value === undefined) return fallback
  if (!Number.isInteger(value) || value < min || value > max) {
    problems.push({ option, problem: `must be an integer from ${min} to ${max}, got ${value}` })
    return fallback
  }
  return value
}

/** Checks the ordering model and resolves its limits against the concurrency. */
const orderingOption = <A>(
  problems: Array<OptionProblem>,
  ordering: Ordering<A> | undefined,
  concurrency: number
): Engine.OrderingDefinition<A> => {
  if (ordering === undefined || ordering === "unordered") return { _tag: "Unordered" }
  if (ordering === "sequential") return { _tag: "Sequential" }
  if (typeof ordering !== "object" || ordering === null || typeof ordering.perKey !== "function") {
    problems.push({ option: "ordering", problem: `must be "unordered", "sequential" or { perKey: (event) => key }` })
    return { _tag: "Unordered" }
  }
  const maxQueued = intOption(problems, "ordering.maxQueued", ordering.maxQueued, 2 * concurrency, 10_000, 0)
  const maxQueuedPerKey = intOption(problems, "ordering.maxQueuedPerKey", ordering.maxQueuedPerKey, concurrency, 10_000, 0)
  const maxKeys = intOption(problems, "ordering.maxKeys", ordering.maxKeys, concurrency + maxQueued, 10_000)
  return {
    _tag: "PerKey",
    key: ordering.perKey,
    limits: { maxHeld: concurrency + maxQueued, maxKeys, maxPerLane: 1 + maxQueuedPerKey }
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true })

/** Turns a schema into the engine's payload decoder: bytes -> JSON -> `A`, or a rejection. */
const payloadDecoder = <A>(schema: Schema.Decoder<A>) => {
  const decode = Schema.decodeUnknownExit(schema)
  // An `Envelope.schema`'s own quicker decoder, tried first: what it cannot decode, the schema does.
  const quick = EnvelopeDecoder.quickDecoderOf(schema)
  return (payload: Uint8Array): Result.Result<A, Engine.Rejection> => {
    let json: unknown
    try {
      json = JSON.parse(utf8.decode(payload))
    } catch (error) {
      const reason: RejectReason = "MalformedPayload"
      return Result.fail({
        reason,
        error: ErrorSummary.make("MalformedPayload", `the payload is not UTF-8 JSON: ${String(error)}`, {
          bytes: payload.byteLength
        })
      })
    }
    const decoded = quick?.(json)
    if (decoded !== undefined) return Result.succeed(decoded as A)
    const exit = decode(json)
    if (Exit.isSuccess(exit)) return Result.succeed(exit.value)
    const summary = ErrorSummary.fromCause(exit.cause)
    return Result.fail({ reason: "SchemaInvalid", error: { ...summary, tag: "SchemaInvalid" } })
  }
}

/**
 * Checks and normalises `options` into a consumer. Never throws: problems are kept for `run`.
 *
 * ```ts
 * import { Consumer, Envelope, IdempotencyStore } from "@jetworker/core"
 * import { JetStreamSource } from "@jetworker/nats"
 * import { Effect, Schema } from "effect"
 * import { SqlClient } from "effect/sql"
 *
 * const OrderPlaced = Envelope.schema("order.placed", Schema.Struct({ orderId: Schema.String, sku: Schema.String }))
 *
 * const ship = (event: typeof OrderPlaced.Type) =>
 *   Effect.gen(function*() {
 *     const sql = yield* SqlClient.SqlClient
 *     yield* sql`INSERT INTO shipments (order_id, sku) VALUES (${event.data.orderId}, ${event.data.sku})`
 *   })
 *
 * const shipping = Consumer.make({
 *   name: "shipping",
 *   source: JetStreamSource.make({ stream: "ORDERS" }),
 *   schema: OrderPlaced,
 *   // The dedup row and the effect commit in one transaction: a redelivery ends `Duplicate`.
 *   handle: (event) => IdempotencyStore.commit(event.id, ship(event)),
 *   classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
 *   concurrency: 16
 * })
 *
 * // Runs until interrupted (then drains): under `Worker.runMain`, until SIGTERM.
 * const program = Consumer.run(shipping)
 * ```
 */
export const make = <A, E extends Tagged, R, RS = never>(
  options: Options<A, E, R, RS>
): Consumer<A, E, Exclude<R, CurrentDelivery> | RS> => {
  const problems: Array<OptionProblem> = []
  if (!NAME.test(options.name)) {
    problems.push({ option: "name", problem: `must be 1 to 100 characters from A-Z a-z 0-9 _ -, got ${JSON.stringify(options.name)}` })
  }
  const retry = options.retry ?? Retry.defaultPolicy
  problems.push(...Retry.validate(retry))
  const sequential = options.ordering === "sequential"
  if (sequential && options.concurrency !== undefined && options.concurrency !== 1) {
    problems.push({ option: "concurrency", problem: `must be 1 with ordering "sequential", got ${options.concurrency}` })
  }
  const concurrency = sequential ? 1 : intOption(problems, "concurrency", options.concurrency, 16, 10_000)
  const prefetch = intOption(problems, "prefetch", options.prefetch, concurrency, 10_000)
  const ordering = orderingOption(problems, options.ordering, concurrency)
  const handlerTimeout = durationOption(problems, "handlerTimeout", options.handlerTimeout, Duration.seconds(30), false)
  const drainTimeout = durationOption(problems, "drainTimeout", options.drainTimeout, Duration.seconds(10), true)
  const skew = durationOption(problems, "expiry.skew", options.expiry?.skew, Duration.zero, true)
  const expiredTo = expiredToOption(problems, options.expiry?.onExpired)
  const maxDeliveries = intOption(problems, "maxDeliveries", options.maxDeliveries, 2 * retry.attempts, 10_000)
  const onOutcomeTimeout = durationOption(problems, "onOutcomeTimeout", options.onOutcomeTimeout, Duration.seconds(5), false)
  const progressInterval = durationOption(problems, "progressInterval", options.progressInterval, Duration.seconds(30), true)
  const pauseOn = pauseOnOption(problems, options.dependencies?.pauseOn)
  const maxHold = durationOption(problems, "dependencies.maxHold", options.dependencies?.maxHold, Duration.minutes(5), false)
  const metadata = (options as { readonly metadata?: ((event: A) => Metadata) | undefined }).metadata ??
    ((event: A) => event as unknown as Metadata)
  return {
    [TypeId]: TypeId,
    name: options.name,
    problems,
    definition: {
      name: options.name,
      source: options.source as Source<Exclude<R, CurrentDelivery> | RS>,
      decode: payloadDecoder(options.schema),
      metadata,
      // The engine provides `CurrentDelivery` to every handler run.
      handle: options.handle as (event: A) => Effect.Effect<unknown, E, Exclude<R, CurrentDelivery> | RS | CurrentDelivery>,
      classify: options.classify as Classification<E>,
      retry,
      concurrency,
      prefetch,
      handlerTimeout,
      drainTimeout,
      skewMillis: Duration.toMillis(skew),
      expiredTo,
      onOutcome: options.onOutcome,
      onOutcomeTimeout,
      maxDeliveries,
      ordering,
      progressInterval,
      pauseOn,
      maxHold,
      batch: undefined
    }
  }
}

/**
 * Runs the consumer until interrupted or until its source fails. On interruption it stops
 * reserving messages, releases those still buffered, lets running handlers finish for up to
 * `drainTimeout` (under a worker: until its budget's drain share ends), then interrupts the rest (their transactions roll back and their messages are
 * released, never acked). Fails with {@link InvalidOptions} before any I/O when `make` found
 * problems.
 */
export const run = <A, E extends Tagged, R>(
  consumer: Consumer<A, E, R>
): Effect.Effect<never, InvalidOptions | SourceError, R> =>
  consumer.problems.length > 0
    ? Engine.fail(new InvalidOptions({ consumer: consumer.name, problems: consumer.problems }))
    : Engine.run(consumer.definition)

/**
 * Options of a batch consumer: those of {@link make} without `handle` and `ordering`, plus the
 * batch. `EE` are the elements' own errors, `EW` the errors of the whole run; `classify` covers both.
 */
export interface BaseBatchOptions<A, EE extends Tagged, EW extends Tagged, R, RS>
  extends Omit<BaseOptions<A, EE | EW, R, RS>, "handle" | "ordering" | "concurrency" | "prefetch">
{
  /** How batches form: up to `maxSize` events, or what arrived within `maxWait` of the first. */
  readonly batch: {
    /** The most events in one batch, 1 to 10 000. */
    readonly maxSize: number
    /** How long a batch waits to fill after its first event. Default: 20 milliseconds. */
    readonly maxWait?: Duration.Input | undefined
  }
  /**
   * The batch handler: one result per event, in the order given — `Result.succeed(value)` for an
   * element whose effect committed (or the store's `AlreadyCommitted`: a `Duplicate`), or
   * `Result.fail(error)` for an element that failed on its own (classified like a handler's
   * error; only that element is retried or dead-lettered). `IdempotencyStore.commitBatch` returns
   * exactly this. A failure of the whole effect is not charged to every element: the engine then
   * runs each element alone, as a batch of one, every element's first run before any element's
   * in-process retries, and settles each element (its ack, nak or dead letter, then `onOutcome`)
   * as soon as its verdict is reached. So a poison element fails by itself: an element after it
   * waits for its first run alone at most (up to `handlerTimeout`), never for its retries or a
   * hold. The engine provides `CurrentBatch`.
   */
  readonly handleBatch: (events: ReadonlyArray<A>) => Effect.Effect<ReadonlyArray<Result.Result<unknown, EE>>, EW, R>
  /** Batches running at once, 1 to 10 000. Default: 2. */
  readonly concurrency?: number | undefined
  /** Deliveries reserved ahead and waiting locally, 1 to 10 000. Default: `batch.maxSize`. */
  readonly prefetch?: number | undefined
}

/** Everything `makeBatch` accepts. */
export type BatchOptions<A, EE extends Tagged, EW extends Tagged, R, RS = never> =
  & BaseBatchOptions<A, EE, EW, R, RS>
  & MetadataOption<A>

/**
 * Checks and normalises the options of a batch consumer (BE-JOB-007): deliveries are handled in
 * batches, but each element keeps its own result, outcome and broker command (its own ack, nak or
 * dead letter); rejected and expired elements never reach the handler. Batch consumers are
 * unordered. Never throws: problems are kept for `run`.
 */
export const makeBatch = <A, EE extends Tagged, EW extends Tagged, R, RS = never>(
  options: BatchOptions<A, EE, EW, R, RS>
): Consumer<A, EE | EW, Exclude<R, CurrentDelivery | CurrentBatch> | RS> => {
  type E = EE | EW
  const problems: Array<OptionProblem> = []
  const maxSize = intOption(problems, "batch.maxSize", options.batch?.maxSize ?? 0, 1, 10_000)
  const maxWait = durationOption(problems, "batch.maxWait", options.batch?.maxWait, Duration.millis(20), true)
  // The type leaves `ordering` out, but options spread from a shared object bring it along: a
  // batch runs its elements together, so an ordering other than "unordered" would be dropped silently.
  const ordering = (options as { readonly ordering?: unknown }).ordering
  if (ordering !== undefined && ordering !== "unordered") {
    problems.push({
      option: "ordering",
      problem: `is not supported by a batch consumer, which runs a batch's elements together, unordered: remove it, ` +
        `or use Consumer.make for ordered processing`
    })
  }
  const handleBatch = options.handleBatch as (events: ReadonlyArray<A>) => Effect.Effect<ReadonlyArray<Result.Result<unknown, E>>, E, R>
  // One event alone, as a batch of one: what the engine runs when a batch failed as a whole.
  const single = (event: A) =>
    Effect.gen(function*() {
      const current = yield* CurrentDelivery
      const results = yield* handleBatch([event]).pipe(
        Effect.provideService(CurrentBatch, {
          consumer: current.consumer,
          elements: [{
            eventId: current.eventId,
            subject: current.subject,
            sequence: current.sequence,
            deliveryCount: current.deliveryCount,
            expiresAt: current.expiresAt,
            leaseDeadline: current.leaseDeadline,
            report: current.report
          }]
        })
      )
      const result = results[0]
      if (results.length !== 1 || result === undefined) {
        return yield* Effect.die(new Error(`the batch handler gave ${results.length} results for 1 event`))
      }
      return Result.isSuccess(result) ? result.success : yield* Effect.fail(result.failure)
    })
  const consumer = make({
    ...(options as BaseBatchOptions<A, EE, EW, R, RS> & { readonly metadata?: (event: A) => Metadata }),
    ordering: "unordered",
    handle: single,
    concurrency: options.concurrency ?? 2,
    prefetch: options.prefetch ?? maxSize
  } as Options<A, E, R | CurrentDelivery, RS>)
  return {
    [TypeId]: TypeId,
    name: consumer.name,
    problems: [...consumer.problems, ...problems],
    definition: {
      ...consumer.definition,
      batch: {
        maxSize,
        maxWait,
        handle: handleBatch as Engine.BatchDefinition<A, E, Exclude<R, CurrentDelivery | CurrentBatch> | RS>["handle"]
      }
    }
  } as Consumer<A, E, Exclude<R, CurrentDelivery | CurrentBatch> | RS>
}

/**
 * Run: the handler under the lease (`runHandler`), each run a fiber of its own bounded by
 * `handlerTimeout` and skipped once the event has expired, with the in-process retries built only
 * after a transient failure (`attempt`), then the verdict (`conclude`). The batch path runs an
 * element alone through `attempt` too, its first run and its retries as two steps
 * (`attemptInSteps`).
 */
import { Cause, Duration, Effect, Exit, Option } from "effect"
import type { Tagged } from "../../Classification.ts"
import { CurrentDelivery } from "../../CurrentDelivery.ts"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { isExpired, type Metadata } from "../../Envelope.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import type { DependencyDown } from "../lifecycleService.ts"
import type { BoundedRuns } from "./bounded.ts"
import type { ConcludeStage } from "./conclude.ts"
import { describeDown } from "./dependencyGate.ts"
import { leaseDeadlineOf, noDeadline, pastLease, reporter, takenPastLease } from "./helpers.ts"
import type { Shared } from "./shared.ts"
import { ExpiredBeforeRun, type HandlerTimeout, noReportsYet, type Prepared, type Reports, type Verdict } from "./types.ts"

/** The run stage of one consumer run (`makeRunHandler`). */
export type RunStage<A, E extends Tagged, R> = ReturnType<typeof makeRunHandler<A, E, R>>

/** Builds the run stage of one consumer run. */
export const makeRunHandler = <A, E extends Tagged, R>(
  shared: Shared<A, E, R>,
  { supervised }: BoundedRuns<A, E, R>,
  { conclude }: ConcludeStage<A, E, R>
) => {
  const {
    definition,
    env,
    now,
    wallNow,
    record,
    probe,
    hit,
    keeper,
    leaseMillis,
    handlerDuration,
    inProcess,
    timeoutMessage,
    isTransient,
    dependencyGate,
    heldGauge
  } = shared

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

  /** What the handler's context says of the delivery it runs for (`CurrentDelivery`). */
  const currentDelivery = (delivery: Delivery, metadata: Metadata, attemptNumber: number, reports: Reports, lease: LeaseKeeper.Lease) => ({
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
      Effect.provideService(CurrentDelivery, currentDelivery(delivery, metadata, attemptNumber, reports, lease))
    )

  /**
   * `attempt` in two steps, for a batch element run alone (the batch path runs every element's
   * first run before any element's retries): `first`, the first run, and `retriesAfter(exit)`,
   * the in-process retries `attempt` would go on to after that run's `exit` (a typed transient
   * failure, as `Effect.catch` finds it: no defect), or `undefined` when none is due.
   */
  const attemptInSteps = (
    event: A,
    delivery: Delivery,
    metadata: Metadata,
    attemptNumber: number,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ) => {
    const context = currentDelivery(delivery, metadata, attemptNumber, reports, lease)
    return {
      first: Effect.provideService(runOnce(event, metadata), CurrentDelivery, context),
      retriesAfter: (exit: Exit.Exit<unknown, E | ExpiredBeforeRun | HandlerTimeout>) => {
        if (Exit.isSuccess(exit) || Cause.hasDies(exit.cause) || definition.retry.inProcess.times === 0) return undefined
        const error = Cause.findErrorOption(exit.cause)
        return Option.isSome(error) && isTransient(error.value)
          ? Effect.provideService(retryAfter(event, metadata, error.value), CurrentDelivery, context)
          : undefined
      }
    }
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
    let startedAt = now()
    // Taken past its lease (it waited in the source's buffer, or for its key's turn): the broker may
    // have handed the message to another consumer, and its ack would be withheld anyway, so the
    // handler does not run for nothing, or a second time beside the redelivery.
    if (pastLease(lease.hold, leaseMillis, startedAt)) {
      keeper.unregister(lease)
      return Effect.succeed(takenPastLease(prepared.message))
    }
    // What the store reports about this delivery's effect, whatever the handler returns.
    const reports = noReportsYet()
    const concluded = (exit: Exit.Exit<unknown, unknown>) => {
      keeper.unregister(lease)
      record(handlerDuration, now() - startedAt)
      return conclude(prepared, delivery, exit, reports, lease)
    }
    const run = attempt(prepared.event, delivery, prepared.metadata, prepared.failedBefore + 1, reports, lease)
    // One step for the run's end, where `Effect.exit` and a `flatMap` take three. Paused on
    // dependencies, a transient failure while one of them is down is held, not counted, and the
    // handler runs again once they are back (see `heldAfter`).
    return Effect.matchCauseEffect(restore(run), {
      onSuccess: (value) => concluded(Exit.succeed(value)),
      onFailure: dependencyGate.active
        ? (cause) =>
          Effect.flatMap(
            heldAfter(cause, run, delivery, prepared, reports, lease, restore, () => {
              startedAt = now()
            }),
            concluded
          )
        : (cause) => concluded(Exit.failCause(cause))
    })
  }

  /**
   * The exit to judge a run by, after it failed with `cause`: that failure, unless it may be held
   * (see {@link holdable}) and a dependency the consumer pauses on is down (probed now). Then the
   * delivery is held, its lease kept by the keeper, until the dependencies are back, and `run`
   * runs again (`onRerun` first), as often as it fails so, within `maxHold` from the first hold;
   * past it, the last failure. A hold is interruptible (`restore`): shutdown or a lost lease ends
   * it with the interruption, and so does the consumer's stopping (the gate's `stop`), at once.
   * `holding` carries the end of the hold: a batch's elements, held one after another, share one
   * (`maxHold` bounds the batch's holds together, not each element's).
   */
  const heldAfter = (
    cause: Cause.Cause<unknown>,
    run: Effect.Effect<unknown, unknown, R>,
    delivery: Delivery,
    prepared: Prepared<A>,
    reports: Reports,
    lease: LeaseKeeper.Lease,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    onRerun: () => void,
    holding: Holding = { until: undefined }
  ): Effect.Effect<Exit.Exit<unknown, unknown>, never, R> => {
    const afterFailure = (failure: Cause.Cause<unknown>): Effect.Effect<Exit.Exit<unknown, unknown>, never, R> =>
      !holdable(failure, reports, lease)
        ? Effect.succeed(Exit.failCause(failure))
        : Effect.flatMap(dependencyGate.probe, (down) => (down.length === 0 ? Effect.succeed(Exit.failCause(failure)) : hold(failure, down)))
    const hold = (failure: Cause.Cause<unknown>, down: ReadonlyArray<DependencyDown>): Effect.Effect<Exit.Exit<unknown, unknown>, never, R> => {
      const at = now()
      holding.until ??= at + Duration.toMillis(definition.maxHold)
      const remaining = holding.until - at
      const ended = Effect.logWarning(
        `delivery ${delivery.sequence} held for ${Duration.format(definition.maxHold)} (dependencies.maxHold) while ` +
          `its dependencies stayed down; its failure now counts`
      ).pipe(Effect.annotateLogs({ event: "delivery.hold_ended", sequence: delivery.sequence, eventId: prepared.metadata.id }))
      // A batch's later element, after the batch's hold ran out: its failure counts at once.
      if (remaining <= 0) return Effect.as(ended, Exit.failCause(failure))
      const error = ErrorSummary.describe(ErrorSummary.fromCause(failure))
      const held = Effect.logInfo(
        `delivery ${delivery.sequence} held: its handler failed (${error}) while ${describeDown(down)} ` +
          `${down.length === 1 ? "is" : "are"} down; the failure is not counted, and the handler runs again once ` +
          `${down.length === 1 ? "it is" : "they are"} back (held at most ${Math.max(0, Math.round(remaining))} ms more)`
      ).pipe(Effect.annotateLogs({
        event: "delivery.held",
        sequence: delivery.sequence,
        eventId: prepared.metadata.id,
        dependencies: down.map((d) => d.name).join(","),
        error
      }))
      // Counted in `jetworker.held` while it waits, however the wait ends.
      const waiting = Effect.suspend(() => {
        record(heldGauge, ++shared.held)
        return Effect.ensuring(
          restore(dependencyGate.awaitOpenWithin(remaining)),
          Effect.sync(() => record(heldGauge, --shared.held))
        )
      })
      return Effect.andThen(
        Effect.andThen(dependencyGate.notePaused, held),
        Effect.flatMap(Effect.exit(waiting), (waited) => {
          // Interrupted while held (shutdown past its drain, a lost lease): that ends it.
          if (Exit.isFailure(waited)) return Effect.succeed<Exit.Exit<unknown, unknown>>(waited)
          // The consumer is stopping: released without counting, as by the engine's interruption.
          if (waited.value === "stopped") return Effect.succeed(Exit.interrupt())
          // Held as long as allowed: the failure counts as it would have.
          if (waited.value === "timeout") return Effect.as(ended, Exit.failCause(failure))
          onRerun()
          return Effect.flatMap(Effect.exit(restore(run)), (exit) => (Exit.isSuccess(exit) ? Effect.succeed(exit) : afterFailure(exit.cause)))
        })
      )
    }
    return afterFailure(cause)
  }

  /**
   * Whether a failed run may be held for its dependencies: a transient failure (or a defect) of a
   * run whose effect did not commit, neither interrupted nor past its lease.
   */
  const holdable = (cause: Cause.Cause<unknown>, reports: Reports, lease: LeaseKeeper.Lease): boolean => {
    if (lease.lost || reports.committed || reports.alreadyCommitted || Cause.hasInterrupts(cause)) return false
    const failure = Cause.findErrorOption(cause)
    return Option.isNone(failure) || isTransient(failure.value as E | ExpiredBeforeRun | HandlerTimeout)
  }

  return { attempt, attemptInSteps, runHandler, heldAfter, gated: dependencyGate.active }
}

/** Where a hold ends (monotonic ms), set at its first hold; shared by the elements of a batch. */
export interface Holding {
  until: number | undefined
}

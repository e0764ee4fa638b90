/**
 * Conclude: the verdict on a run of the handler, from the run's exit and what the idempotency store
 * reported (committed, a duplicate, expired, released for a retry, dead-lettered). The single
 * delivery's run and the batch path's failed elements are judged here.
 */
import { Cause, DateTime, Duration, Effect, Exit, Option } from "effect"
import type { Tagged } from "../../Classification.ts"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { WorkExpired } from "../../Expiry.ts"
import { isAlreadyCommitted } from "../../IdempotencyStore.ts"
import { LeaseExpired } from "../../Lease.ts"
import * as Outcome from "../../Outcome.ts"
import * as Retry from "../../Retry.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import type { PrepareStage } from "./prepare.ts"
import type { Shared } from "./shared.ts"
import { effectCommittedIf, ExpiredBeforeRun, HandlerTimeout, type Prepared, type Reports, type Verdict } from "./types.ts"

/** The conclude stage of one consumer run (`makeConclude`). */
export type ConcludeStage<A, E extends Tagged, R> = ReturnType<typeof makeConclude<A, E, R>>

/** Builds the conclude stage of one consumer run. */
export const makeConclude = <A, E extends Tagged, R>(shared: Shared<A, E, R>, { storeUnavailable, expiredRedelivery }: PrepareStage<A, E, R>) => {
  const { definition, attemptStore, probe, hit, isTransient } = shared
  const unrecorded = storeUnavailable("failure not recorded (deliveries are no failed attempts)", undefined)

  // Whether the engine ended the run: the consumer is stopping (a hold ended so) or this fiber is
  // being interrupted (a shutdown past its drain), as opposed to a run that ended interrupted by
  // itself. Called where interruption is masked.
  const cutByEngine: Effect.Effect<boolean> = Effect.suspend(() =>
    shared.dependencyGate.stopped()
      ? Effect.succeed(true)
      : Effect.map(Effect.exit(Effect.interruptible(Effect.void)), Exit.isFailure)
  )
  const interruptedItself = ErrorSummary.make(
    "Interrupted",
    "the handler ended interrupted by itself, with nothing outside it asking it to stop (it joined a fiber that was " +
      "interrupted, or called Effect.interrupt)"
  )

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
      // The handler failed after its effect committed (or was found committed): a publish or a
      // log step after `IdempotencyStore.commit` returned. The failure outcome stays, so that
      // what failed is retried or dead-lettered rather than dropped, and says the effect is
      // applied; the redelivery (or a replay) finds it committed and runs only what followed.
      const committed = effectCommittedIf(reports.committed || reports.alreadyCommitted)
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
        const expired = Outcome.verdict("Expired", {
          message,
          expiresAt: metadata.expiresAt,
          detectedAt: DateTime.makeUnsafe(failure.value.detectedAt),
          stage: "AfterWait"
        })
        // A redelivery: an earlier delivery may have committed the effect (its ack lost), and this
        // run expired before it reached the store's commit (`Duplicate` then, not "no effect").
        return delivery.deliveryCount > 1 ? yield* expiredRedelivery(expired) : expired
      }
      if (Option.isSome(failure) && failure.value instanceof LeaseExpired) {
        // The handler found its lease gone before an irreversible step (`Lease.ensure`).
        return Outcome.verdict("Released", {
          message,
          reason: "LeaseLost",
          error: ErrorSummary.fromError(failure.value),
          retryIn: undefined,
          ...committed
        })
      }
      if (lease.lost && Cause.hasInterrupts(exit.cause)) {
        // The keeper could not hold the lease: another consumer may own the message; leave it.
        return Outcome.verdict("Released", {
          message,
          reason: "LeaseLost",
          error: ErrorSummary.make(
            "LeaseLost",
            `no lease extension was confirmed in time${lease.lastFailure === undefined ? "" : ` (the last: ${lease.lastFailure})`}; ` +
              "the handler was interrupted"
          ),
          retryIn: undefined,
          ...committed
        })
      }
      let summary = error
      if (Option.isNone(failure) && Cause.hasInterrupts(exit.cause) && !Cause.hasDies(exit.cause)) {
        // Interrupted by the engine (shutdown past its drain; this fiber's interruption is pending):
        // the transaction rolled back; hand it back now, no attempt spent.
        if (yield* cutByEngine) {
          return Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero, ...committed })
        }
        // Nothing outside the handler asked it to stop: it failed, and spends an attempt like any
        // failure (released at once, it ran again without a backoff until the attempts ran out).
        summary = interruptedItself
      }
      const transient = Option.isNone(failure) || isTransient(failure.value as E | HandlerTimeout | ExpiredBeforeRun)
      if (!transient) return Outcome.verdict("DeadLettered", { message, reason: "PermanentError", error, ...committed })
      // Without a store, `failedBefore` counts the deliveries before this one but those this run
      // saw commit unacked (see `rememberCommitted`).
      const recorded = attemptStore === undefined
        ? failedBefore + 1
        : yield* attemptStore.recordFailure(key).pipe(Effect.catch(unrecorded))
      // Not recorded (the store is down): only the failures known to be real decide, those read
      // before the run (none if the read failed too) and this one; never the delivery count, which
      // counts releases and naks too. It sets the backoff only, growing over the outage, and the
      // crash-loop guard (`DeliveriesExhausted`) bounds the retries.
      const failed = recorded ?? failedBefore + 1
      if (failed >= definition.retry.attempts) {
        return Outcome.verdict("DeadLettered", { message, reason: "AttemptsExhausted", error: summary, ...committed })
      }
      const retryIn = yield* Retry.delayAfter(definition.retry, recorded ?? Math.max(failed, delivery.deliveryCount))
      return Outcome.verdict("Released", { message, reason: "Retrying", error: summary, retryIn, ...committed })
    })

  return { conclude }
}

/**
 * Prepare: the checks before any wait or handler run (decode, metadata, ordering key, expiry, the
 * delivery and attempt bounds), `checkNow` when they need no I/O, `prepare` when a redelivery reads
 * a store (its failed attempts and any dead letter decided for it from the attempt store; whether
 * an expired event was committed before, `expiredRedelivery`); and the safety nets' verdict
 * (`defect`) for a delivery whose judging died. Both paths, a single delivery's and a batch's,
 * prepare through it.
 */
import { type Cause, DateTime, Duration, Effect, Result, Schema } from "effect"
import type * as AttemptStore from "../../AttemptStore.ts"
import type { Tagged } from "../../Classification.ts"
import type { Delivery } from "../../Delivery.ts"
import { EventId, isExpired, type Metadata } from "../../Envelope.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { IdempotencyError } from "../../IdempotencyStore.ts"
import * as Outcome from "../../Outcome.ts"
import * as Retry from "../../Retry.ts"
import type { BoundedRuns } from "./bounded.ts"
import type { Shared } from "./shared.ts"
import { effectCommittedIf, type Prepared, type Verdict } from "./types.ts"

const textDecoder = new TextDecoder()
const isEventId = Schema.is(EventId)

/** What an attempt store that cannot be read stands for: no failures, no decision. */
const noAttempts: AttemptStore.Attempts = { failures: 0 }

/** The ordering key of every delivery of a consumer without per-key ordering (built once). */
const noKey: Result.Result<string, ErrorSummary.ErrorSummary> = Result.succeed("")

/** The prepare stage of one consumer run (`makePrepare`). */
export type PrepareStage<A, E extends Tagged, R> = ReturnType<typeof makePrepare<A, E, R>>

/** Builds the prepare stage of one consumer run. */
export const makePrepare = <A, E extends Tagged, R>(shared: Shared<A, E, R>, { bounded }: BoundedRuns<A, E, R>) => {
  const {
    definition,
    attemptStore,
    idempotencyStore,
    deadlines,
    deliveryBound,
    record,
    clockSkew,
    wallNow,
    takeUnwritten,
    committedOf,
    releasedOf,
    storedDeadLetterOf
  } = shared

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

  // A rejected delivery's id as its payload states it, when it is JSON with a top-level `id` that
  // is a valid event id: its outcome line and dead letter then name the event an operator looks
  // for ("when the payload could be decoded far enough to read it"). Only on the rejection path.
  const statedId = (delivery: Delivery): string | undefined => {
    try {
      const parsed: unknown = JSON.parse(textDecoder.decode(delivery.payload))
      const id = typeof parsed === "object" && parsed !== null ? (parsed as { readonly id?: unknown }).id : undefined
      return isEventId(id) ? id : undefined
    } catch {
      return undefined
    }
  }
  const rejectedRef = (delivery: Delivery, ref: Outcome.MessageRef): Outcome.MessageRef => {
    const eventId = statedId(delivery)
    return eventId === undefined ? ref : { ...ref, eventId }
  }

  // The delivery as outcomes name it, before its event id is known.
  const messageRef = (delivery: Delivery): Outcome.MessageRef => ({
    consumer: definition.name,
    subject: delivery.subject,
    sequence: delivery.sequence,
    deliveryCount: delivery.deliveryCount,
    eventId: undefined
  })

  // An attempt store that cannot be read or written (`PgAttemptStore` shares the handler's
  // database, so during its outage) gives no failure count, and the delivery count is none: it also
  // counts releases, lease losses, kills and naks. Only failures known to be real then spend the
  // attempts; the crash-loop guard (`deliveryBound`, below MaxDeliver) still bounds the deliveries.
  const storeUnavailable = <X>(doing: string, fallback: X) => (error: { readonly message: string }): Effect.Effect<X> =>
    Effect.as(Effect.logWarning(`attempt store unavailable; ${doing}: ${error.message}`), fallback)
  const unreadable = storeUnavailable("running the handler (deliveries are no failed attempts)", noAttempts)

  // The verdict of a delivery whose judging died: dead-lettered with the cause.
  const defect = (message: Outcome.MessageRef, error: ErrorSummary.ErrorSummary): Verdict =>
    Outcome.verdict("DeadLettered", { message, reason: "Defect", error })
  const defectVerdict = (message: Outcome.MessageRef) => (cause: Cause.Cause<unknown>): Effect.Effect<Verdict> =>
    Effect.succeed(defect(message, ErrorSummary.fromCause(cause)))

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
      // A redelivery reads the attempt store once: its failed attempts so far (a first delivery
      // has none, unless NATS rewound its count, and then the failure's own count catches it) and
      // the dead letter decided for it, if one was (by this process or another, before a restart).
      // A decided dead letter is written again and the message terminated, the handler not run,
      // whatever the other checks say (as for `storedDeadLetterOf`). Without a store, the
      // deliveries before this one count as failures. A store that cannot be read counts none and
      // knows no decision: the handler runs, and fails transiently if its dependency is down too.
      const message = attemptStore === undefined || delivery.deliveryCount === 1 ? undefined : recordedFor(checked)
      if (message === undefined) return judgeChecked(checked, undefined)
      return attemptStore!.read({ scope: definition.name, id: message.eventId! }).pipe(
        Effect.catch(unreadable),
        Effect.flatMap((attempts) =>
          attempts.deadLetter === undefined
            ? judgeChecked(checked, attempts.failures)
            : Effect.succeed(Result.fail(decidedBefore(message, attempts.deadLetter)))
        )
      )
    })

  /**
   * The message whose record a redelivery reads (`prepare`), or `undefined` when it reads none: a
   * rejected one (no dead-letter decision), one this run already knows dead-lettered
   * (`storedDeadLetterOf`), or one found committed.
   */
  const recordedFor = (checked: Result.Result<Prepared<A>, Verdict>): Outcome.MessageRef | undefined => {
    if (Result.isSuccess(checked)) return checked.success.message
    const verdict = checked.failure
    if (verdict.message.eventId === undefined) return undefined
    return verdict._tag === "Expired" || (verdict._tag === "DeadLettered" && storedDeadLetterOf(verdict.message) === undefined)
      ? verdict.message
      : undefined
  }

  /** The verdict on a redelivery whose dead letter was decided before (`AttemptStore.recordDeadLetter`). */
  const decidedBefore = (message: Outcome.MessageRef, decision: AttemptStore.DeadLetterDecision): Verdict =>
    Outcome.verdict("DeadLettered", {
      message,
      reason: decision.reason,
      error: decision.error,
      ...effectCommittedIf(decision.effectCommitted === true)
    })

  /**
   * `prepare` once the checks are done: an expired redelivery asks the idempotency store; a
   * prepared one is held to the attempts, `failures` the store's count when it was read.
   */
  const judgeChecked = (
    checked: Result.Result<Prepared<A>, Verdict>,
    failures: number | undefined
  ): Effect.Effect<Result.Result<Prepared<A>, Verdict>> => {
    if (Result.isFailure(checked)) {
      return checked.failure._tag === "Expired" && idempotencyStore !== undefined
        ? Effect.map(expiredRedelivery(checked.failure), Result.fail)
        : Effect.succeed(checked)
    }
    const prepared = checked.success
    return Effect.succeed(withinAttempts(failures === undefined ? prepared : { ...prepared, failedBefore: failures }))
  }

  /**
   * Whether `delivery` is prepared by `prepare` (it may read a store: a redelivery, with an attempt
   * store or an idempotency store) rather than at once by `checkNow`.
   */
  const readsStores = (delivery: Delivery): boolean =>
    delivery.deliveryCount > 1 && (attemptStore !== undefined || idempotencyStore !== undefined)

  /**
   * The verdict on a redelivery found expired, before its handler ran or by the handler before
   * its commit: `Duplicate` when an earlier delivery committed the effect (its ack was lost, and the
   * broker redelivered it past its deadline), as this run remembers (`committedOf`) or the
   * idempotency store says (`isCommitted` of the engine's key, bounded by `handlerTimeout`);
   * otherwise the `Expired` verdict. `Expired` says "no effect" (and dead-letters the event under
   * `onExpired: "deadLetter"`), so a store that cannot answer never yields it: the redelivery is
   * released (`Retrying`, naked with the retry policy's delay, no attempt spent, as for a handler
   * whose store is unavailable), and its next delivery asks again (expiry is checked before the
   * crash-loop guard: only the broker's MaxDeliver ends that loop, where the source dead-letters
   * the message `DeliveriesExhausted` for an operator to judge). A first delivery cannot have been
   * committed before (unless NATS rewound its count): its verdict stands.
   */
  const expiredRedelivery = (verdict: Extract<Verdict, { readonly _tag: "Expired" }>): Effect.Effect<Verdict> => {
    const message = verdict.message
    if (message.deliveryCount === 1 || message.eventId === undefined) return Effect.succeed(verdict)
    if (committedOf(message) !== undefined) return Effect.succeed(Outcome.verdict("Duplicate", { message }))
    if (idempotencyStore === undefined) return Effect.succeed(verdict)
    return bounded(idempotencyStore.isCommitted({ scope: definition.name, id: message.eventId }), deadlines, lookupTimedOut).pipe(
      Effect.matchEffect({
        onSuccess: (committed) => Effect.succeed(committed ? Outcome.verdict("Duplicate", { message }) : verdict),
        onFailure: (error) =>
          Effect.map(Retry.delayAfter(definition.retry, message.deliveryCount), (retryIn) =>
            Outcome.verdict("Released", {
              message,
              reason: "Retrying",
              error: ErrorSummary.make(
                "IdempotencyError",
                `the event expired (due ${DateTime.formatIso(verdict.expiresAt)}), but whether an earlier delivery committed ` +
                  `it could not be checked: ${error.message}`,
                { reason: error.reason }
              ),
              retryIn
            }))
      })
    )
  }
  const lookupTimedOut = () =>
    Effect.fail(
      new IdempotencyError({
        reason: "Unavailable",
        message: `the idempotency store did not answer within ${Duration.format(definition.handlerTimeout)} (handlerTimeout)`
      })
    )

  /**
   * The checks of `prepare` that need no I/O; `failedBefore` counts the deliveries before this
   * one (without an attempt store) or is 0, and `prepare` reads it from the store for a redelivery
   * (0 when the store cannot be read: the failures known to be real).
   */
  const check = (delivery: Delivery): Result.Result<Prepared<A>, Verdict> => {
    const decoded = definition.decode(delivery.payload)
    const ref = messageRef(delivery)
    if (Result.isFailure(decoded)) {
      return Result.fail(
        Outcome.verdict("Rejected", { message: rejectedRef(delivery, ref), reason: decoded.failure.reason, error: decoded.failure.error })
      )
    }
    const event = decoded.success
    const read = readMetadata(event)
    if (Result.isFailure(read)) {
      return Result.fail(Outcome.verdict("Rejected", { message: rejectedRef(delivery, ref), reason: "MetadataInvalid", error: read.failure }))
    }
    const metadata = read.success
    const message = { ...ref, eventId: metadata.id }
    // The redelivery of a message whose dead letter this run stored, its term unconfirmed: it is
    // terminated again (its dead letter written again, stored once), and the handler never runs.
    if (delivery.deliveryCount > 1) {
      const stored = storedDeadLetterOf(message)
      if (stored !== undefined) {
        return Result.fail(Outcome.verdict("DeadLettered", {
          message,
          reason: stored.reason,
          error: stored.error,
          ...effectCommittedIf(stored.effectCommitted === true)
        }))
      }
    }
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
        // A redelivery whose effect this run saw committed (its ack lost): applied, not expired.
        // What another run committed only the idempotency store knows (`expiredRedelivery`).
        if (delivery.deliveryCount > 1 && committedOf(message) !== undefined) {
          return Result.fail(Outcome.verdict("Duplicate", { message }))
        }
        return Result.fail(Outcome.verdict("Expired", {
          message,
          expiresAt: metadata.expiresAt,
          detectedAt: DateTime.makeUnsafe(nowMillis),
          stage: "BeforeHandler"
        }))
      }
    }
    if (delivery.deliveryCount > deliveryBound) {
      // Earlier deliveries ended without settling (a crash loop, or dead letters not written):
      // stop while the broker still delivers, so the message is dead-lettered rather than dropped
      // at its MaxDeliver; with the reason of a dead letter this run could not write, if any.
      // A message whose effect this run saw committed says so (what is dead-lettered is the rest).
      const unwritten = takeUnwritten(message)
      return Result.fail(Outcome.verdict("DeadLettered", {
        message,
        reason: unwritten?.reason ?? "DeliveriesExhausted",
        error: unwritten?.error ?? ErrorSummary.make(
          "DeliveriesExhausted",
          `delivered ${delivery.deliveryCount} times without settling; the bound is ${deliveryBound} deliveries`
        ),
        ...effectCommittedIf(unwritten?.effectCommitted === true || committedOf(message) !== undefined)
      }))
    }
    const key = { scope: definition.name, id: metadata.id }
    // Without an attempt store, the deliveries before this one, but those this run saw commit
    // without an ack (withheld or unconfirmed): their redelivery is no failed attempt, it must
    // reach the handler and end `Duplicate` (see `rememberCommitted`); nor those it released with
    // no failure (`rememberReleased`). A first delivery reads nothing.
    const failedBefore = attemptStore !== undefined || delivery.deliveryCount === 1
      ? 0
      : delivery.deliveryCount - 1 - (committedOf(message)?.notFailed ?? 0) - releasedOf(message)
    return Result.succeed({ event, metadata, message, orderKey: orderKey.success, key, failedBefore })
  }

  /**
   * The last attempt failed but was not dead-lettered (a crash, a failed dead-letter write, a
   * dead letter withheld past the lease). The dead letter this run decided but did not write keeps
   * its reason and error: a `PermanentError` whose dead-letter writes spent the deliveries (counted
   * as attempts without an attempt store) stays one.
   */
  const withinAttempts = (prepared: Prepared<A>): Result.Result<Prepared<A>, Verdict> =>
    prepared.failedBefore < definition.retry.attempts ? Result.succeed(prepared) : attemptsSpent(prepared)

  const attemptsSpent = (prepared: Prepared<A>): Result.Result<Prepared<A>, Verdict> => {
    const unwritten = takeUnwritten(prepared.message)
    return Result.fail(Outcome.verdict("DeadLettered", {
      message: prepared.message,
      reason: unwritten?.reason ?? "AttemptsExhausted",
      error: unwritten?.error ?? ErrorSummary.make(
        "AttemptsExhausted",
        `${prepared.failedBefore} failed attempts; the retry policy allows ${definition.retry.attempts}`
      ),
      ...effectCommittedIf(unwritten?.effectCommitted === true || committedOf(prepared.message) !== undefined)
    }))
  }

  /** `prepare` for a delivery that needs no I/O (no attempt store, or a first delivery), at once. */
  const checkNow = (delivery: Delivery): Result.Result<Prepared<A>, Verdict> => {
    try {
      const checked = check(delivery)
      return Result.isFailure(checked) ? checked : withinAttempts(checked.success)
    } catch (error) {
      return Result.fail(defect(messageRef(delivery), ErrorSummary.fromError(error, "Defect")))
    }
  }

  return { messageRef, storeUnavailable, defect, defectVerdict, prepare, checkNow, readsStores, expiredRedelivery }
}

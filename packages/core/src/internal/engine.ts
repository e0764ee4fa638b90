/**
 * The consumer engine: the intake loop (bounded by a semaphore of `concurrency` slots), the
 * processing of one delivery (decode, expiry, attempts, handler with in-process retries, a
 * timeout and a lease keeper), the settlement of its outcome, and the drain on interruption.
 * Internal: the public face is `Consumer`.
 */
import { Cause, Clock, Data, DateTime, Duration, Effect, Exit, FiberSet, Metric, Option, Result, Schedule, Semaphore } from "effect"
import { type Classification, classify, type Tagged } from "../Classification.ts"
import { CurrentDelivery } from "../CurrentDelivery.ts"
import type { Delivery } from "../Delivery.ts"
import { isExpired, type Metadata } from "../Envelope.ts"
import * as ErrorSummary from "../ErrorSummary.ts"
import { isDuplicate } from "../IdempotencyStore.ts"
import * as Outcome from "../Outcome.ts"
import * as Probe from "../Probe.ts"
import * as Retry from "../Retry.ts"
import type { Source, SourceError } from "../Source.ts"

/** Why a payload was rejected before the handler ran. */
export interface Rejection {
  readonly reason: Outcome.RejectReason
  readonly error: ErrorSummary.ErrorSummary
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
  readonly settleTimeout: Duration.Duration
  readonly drainTimeout: Duration.Duration
  readonly skewMillis: number
  readonly expiredTo: "Ack" | "DeadLetter"
  readonly onOutcome: ((outcome: Outcome.Outcome) => Effect.Effect<void>) | undefined
}

/** A handler attempt that ran past `handlerTimeout`; transient. */
export class HandlerTimeout extends Data.TaggedError("HandlerTimeout")<{ readonly message: string }> {}

/** The lease keeper could not keep the lease; the handler is interrupted. */
class LeaseLost extends Data.TaggedError("LeaseLost")<{ readonly message: string }> {}

type Verdict = Outcome.Verdict
const finish = Outcome.settled

/** Counts outcomes by consumer and outcome tag. */
export const outcomesCounter = Metric.counter("jetworker.outcomes", {
  description: "Deliveries settled, by consumer and outcome",
  incremental: true
})

/** Fails the engine before it starts. */
export const fail = <E>(error: E): Effect.Effect<never, E> => Effect.fail(error)

const logOutcome = (outcome: Outcome.Outcome): Effect.Effect<void> => {
  const line = Outcome.describe(outcome)
  switch (outcome._tag) {
    case "Committed":
    case "Duplicate":
      return outcome.confirmed ? Effect.logDebug(line) : Effect.logWarning(line)
    case "Released":
      return Effect.logInfo(line)
    default:
      return Effect.logWarning(line)
  }
}

/** Processes one delivery into exactly one settled outcome. Never fails. */
const makeProcess = <A, E extends Tagged, R>(definition: Definition<A, E, R>, lease: Duration.Duration) => {
  const leaseMillis = Duration.toMillis(lease)
  const counters = new Map(
    Outcome.tags.map((tag) => [tag, Metric.withAttributes(outcomesCounter, { consumer: definition.name, outcome: tag })])
  )
  // In-process retries only while the next delay keeps the attempt well inside the lease.
  const inProcess = Retry.inProcessSchedule(definition.retry).pipe(
    Schedule.while(({ duration, elapsed }) => leaseMillis <= 0 || elapsed + Duration.toMillis(duration) < leaseMillis / 2)
  )
  const isTransient = (error: E | HandlerTimeout): boolean =>
    error._tag === "HandlerTimeout" && error instanceof HandlerTimeout
      ? true
      : classify(definition.classify, error as E) === "transient"

  const bounded = <X, Y>(effect: Effect.Effect<X, Y>): Effect.Effect<boolean> =>
    effect.pipe(
      Effect.timeoutOption(definition.settleTimeout),
      Effect.map(Option.isSome),
      Effect.catchCause((cause) =>
        Effect.as(Effect.logWarning("broker command failed", ErrorSummary.fromCause(cause)), false)
      )
    )

  const execute = (delivery: Delivery, command: Outcome.Command): Effect.Effect<boolean> => {
    switch (command._tag) {
      case "Ack":
        return bounded(delivery.ack)
      case "Nak":
        return bounded(delivery.nak(command.delay))
      case "DeadLetter":
        return bounded(delivery.deadLetter(command.record))
      case "Leave":
        return Effect.succeed(true)
    }
  }

  // Extends the lease every third of it while the handler runs; fails with LeaseLost once no
  // extension has been confirmed for 90% of the lease, which interrupts the handler. Each
  // extension waits at most a third of the lease, so a dead broker is noticed in time.
  const extendTimeout = Duration.min(definition.settleTimeout, Duration.millis(leaseMillis / 3))
  const keepLease = (delivery: Delivery, receivedAt: number): Effect.Effect<never, LeaseLost> =>
    Effect.gen(function*() {
      let heldSince = receivedAt
      while (true) {
        yield* Effect.sleep(Duration.millis(leaseMillis / 3))
        const sentAt = yield* Clock.currentTimeMillis
        const extended = yield* delivery.extend.pipe(
          Effect.timeoutOption(extendTimeout),
          Effect.map(Option.isSome),
          Effect.catch(() => Effect.succeed(false))
        )
        const now = yield* Clock.currentTimeMillis
        if (extended) heldSince = sentAt
        else if (now - heldSince >= leaseMillis * 0.9) {
          return yield* new LeaseLost({ message: `no lease extension confirmed for ${now - heldSince} ms` })
        }
      }
    })

  const attempt = (event: A, delivery: Delivery, eventId: string, receivedAt: number) => {
    const handler = definition.handle(event).pipe(
      Effect.timeoutOrElse({
        duration: definition.handlerTimeout,
        orElse: () =>
          Effect.fail(
            new HandlerTimeout({ message: `handler ran longer than ${Duration.format(definition.handlerTimeout)}` })
          )
      }),
      Effect.retry({ schedule: inProcess, while: isTransient }),
      Effect.provideService(CurrentDelivery, {
        consumer: definition.name,
        eventId,
        attempt: delivery.deliveryCount,
        attempts: definition.retry.attempts,
        subject: delivery.subject,
        sequence: delivery.sequence
      })
    )
    return leaseMillis > 0 ? Effect.raceFirst(handler, keepLease(delivery, receivedAt)) : handler
  }

  const judge = (
    delivery: Delivery,
    receivedAt: number,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<Verdict, never, R> =>
    Effect.gen(function*() {
      const decoded = definition.decode(delivery.payload)
      const ref: Outcome.MessageRef = {
        consumer: definition.name,
        subject: delivery.subject,
        sequence: delivery.sequence,
        deliveryCount: delivery.deliveryCount,
        eventId: undefined
      }
      if (Result.isFailure(decoded)) {
        return Outcome.verdict("Rejected", { message: ref, reason: decoded.failure.reason, error: decoded.failure.error })
      }
      const event = decoded.success
      const metadata = definition.metadata(event)
      const message = { ...ref, eventId: metadata.id }
      const now = DateTime.makeUnsafe(yield* Clock.currentTimeMillis)
      if (metadata.expiresAt !== undefined && isExpired(metadata, now, definition.skewMillis)) {
        return Outcome.verdict("Expired", { message, expiresAt: metadata.expiresAt, detectedAt: now, stage: "BeforeHandler" })
      }
      if (delivery.deliveryCount > definition.retry.attempts) {
        // Earlier deliveries ended without settling (a crash loop, a lost nak): stop here.
        return Outcome.verdict("DeadLettered", {
          message,
          reason: "AttemptsExhausted",
          error: ErrorSummary.make(
            "AttemptsExhausted",
            `delivered ${delivery.deliveryCount} times; the retry policy allows ${definition.retry.attempts}`
          )
        })
      }
      yield* Probe.hit({ point: "received", consumer: definition.name, sequence: delivery.sequence, eventId: metadata.id })
      const exit = yield* Effect.exit(restore(attempt(event, delivery, metadata.id, receivedAt)))
      if (Exit.isSuccess(exit)) {
        if (isDuplicate(exit.value)) return Outcome.verdict("Duplicate", { message })
        yield* Probe.hit({ point: "after-commit", consumer: definition.name, sequence: delivery.sequence, eventId: metadata.id })
        return Outcome.verdict("Committed", { message })
      }
      const error = ErrorSummary.fromCause(exit.cause)
      const failure = Cause.findErrorOption(exit.cause)
      if (Option.isSome(failure) && failure.value instanceof LeaseLost) {
        return Outcome.verdict("Released", { message, reason: "LeaseLost", error, retryIn: undefined })
      }
      if (Option.isNone(failure) && Cause.hasInterrupts(exit.cause) && !Cause.hasDies(exit.cause)) {
        // Interrupted (shutdown past its drain): the transaction rolled back; hand it back now.
        return Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
      }
      const transient = Option.isNone(failure) || isTransient(failure.value as E | HandlerTimeout)
      if (!transient) return Outcome.verdict("DeadLettered", { message, reason: "PermanentError", error })
      if (delivery.deliveryCount >= definition.retry.attempts) {
        return Outcome.verdict("DeadLettered", { message, reason: "AttemptsExhausted", error })
      }
      const retryIn = yield* Retry.delayAfter(definition.retry, delivery.deliveryCount)
      return Outcome.verdict("Released", { message, reason: "Retrying", error, retryIn })
    })

  return (delivery: Delivery): Effect.Effect<void, never, R> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        const receivedAt = yield* Clock.currentTimeMillis
        const verdict = yield* judge(delivery, receivedAt, restore)
        const now = DateTime.makeUnsafe(yield* Clock.currentTimeMillis)
        const command = Outcome.toCommand(verdict, { expiredTo: definition.expiredTo, now })
        const confirmed = yield* execute(delivery, command)
        let outcome = finish(verdict, confirmed, (yield* Clock.currentTimeMillis) - receivedAt)
        if (command._tag === "DeadLetter" && !confirmed) {
          // Not terminated, so not lost: ask for a later redelivery, which dead-letters it again.
          const retryIn = yield* Retry.delayAfter(definition.retry, delivery.deliveryCount)
          const naked = yield* execute(delivery, Outcome.Command.Nak({ delay: retryIn }))
          outcome = finish(
            Outcome.verdict("Released", {
              message: verdict.message,
              reason: "DeadLetterFailed",
              error: ErrorSummary.make("DeadLetterFailed", "the dead-letter publish was not confirmed"),
              retryIn
            }),
            naked,
            (yield* Clock.currentTimeMillis) - receivedAt
          )
        } else if (confirmed && command._tag === "Ack") {
          yield* Probe.hit({
            point: "after-ack",
            consumer: definition.name,
            sequence: delivery.sequence,
            eventId: verdict.message.eventId
          })
        }
        yield* Metric.update(counters.get(outcome._tag)!, 1)
        yield* logOutcome(outcome)
        if (definition.onOutcome !== undefined) {
          yield* definition.onOutcome(outcome).pipe(Effect.catchCause(() => Effect.void))
        }
      }).pipe(
        Effect.annotateLogs({ consumer: definition.name, subject: delivery.subject, sequence: delivery.sequence })
      )
    )
}

/** Runs the engine until interrupted (then drains) or until the source fails. */
export const run = <A, E extends Tagged, R>(definition: Definition<A, E, R>): Effect.Effect<never, SourceError, R> =>
  Effect.scoped(
    Effect.gen(function*() {
      const intake = yield* definition.source.open({ prefetch: definition.prefetch, attempts: definition.retry.attempts })
      const slots = yield* Semaphore.make(definition.concurrency)
      const inFlight = yield* FiberSet.make<void, never>()
      // Runs before the FiberSet's own finalizer (which interrupts what is left) and before the
      // intake's: stop reserving, then give running handlers the drain budget.
      yield* Effect.addFinalizer(() =>
        Effect.gen(function*() {
          yield* intake.close
          const drained = yield* FiberSet.awaitEmpty(inFlight).pipe(Effect.timeoutOption(definition.drainTimeout))
          if (Option.isNone(drained)) {
            yield* Effect.logWarning(`drain budget spent; interrupting ${yield* FiberSet.size(inFlight)} handlers`)
          }
        })
      )
      const process = makeProcess(definition, intake.lease)
      const runFiber = FiberSet.run(inFlight)
      yield* Effect.logInfo(
        `consumer ${definition.name} started on ${definition.source.name} ` +
          `(concurrency ${definition.concurrency}, prefetch ${definition.prefetch}, lease ${Duration.format(intake.lease)})`
      )
      return yield* Effect.forever(
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(function*() {
            yield* restore(Semaphore.take(slots, 1))
            const delivery = yield* restore(intake.take).pipe(Effect.onError(() => Semaphore.release(slots, 1)))
            yield* runFiber(process(delivery).pipe(Effect.ensuring(Semaphore.release(slots, 1))))
          })
        )
      )
    })
  ).pipe(Effect.annotateLogs({ consumer: definition.name }))

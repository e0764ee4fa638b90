/**
 * Settle: a verdict's broker command, decided as it is sent (never an ack past the lease), and its
 * outcome once the broker has answered, handed to the record stage; a batch's elements settled
 * together (`settleAll`, the acks through the intake's `ackAll`); a dead letter that was not stored.
 * An ack, or a dead letter's term, that may succeed if sent again (no reply, no responder: a
 * JetStream consumer's leader being elected) is sent again within the lease (`resend`).
 */
import { Cause, DateTime, Duration, Effect, Exit, Option } from "effect"
import { AttemptStoreError } from "../../AttemptStore.ts"
import type { Tagged } from "../../Classification.ts"
import type { Delivery, SettleError } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { timing } from "../../Lease.ts"
import * as Outcome from "../../Outcome.ts"
import * as Retry from "../../Retry.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import type { BoundedRuns } from "./bounded.ts"
import { pastLease } from "./helpers.ts"
import type { RecordStage } from "./record.ts"
import type { Shared } from "./shared.ts"
import { type Decided, effectCommittedIf, type Verdict } from "./types.ts"

/** Whether `verdict` settles with an ack (an `Expired` one: when `expiredTo` is `Ack`). */
const acks = (verdict: Verdict, expiredTo: "Ack" | "DeadLetter"): boolean =>
  (verdict._tag === "Committed" && verdict.ackWithheld === undefined) || verdict._tag === "Duplicate" ||
  (verdict._tag === "Expired" && expiredTo === "Ack")

/** What a `Released` (LeaseLost) says of an expired event whose ack or dead letter was withheld. */
const expiredPastLease = (verdict: Extract<Verdict, { readonly _tag: "Expired" }>, withheld: "ack" | "dead letter") =>
  ErrorSummary.make(
    "Expired",
    `the event expired (found ${verdict.stage === "BeforeHandler" ? "before the handler" : "after a wait"}, due ` +
      `${DateTime.formatIso(verdict.expiresAt)}); found past the lease, its ${withheld} was not sent: another consumer may ` +
      `own the message, and the next delivery decides`,
    { stage: verdict.stage }
  )

/**
 * The verdict for the same work once its lease is lost: no ack (a committed effect stays
 * committed; a duplicate's effect was committed before: `effectCommitted`).
 */
const withholdAck = (verdict: Verdict): Verdict =>
  verdict._tag === "Committed"
    ? { ...verdict, ackWithheld: "LeaseLost" }
    : Outcome.verdict("Released", {
      message: verdict.message,
      reason: "LeaseLost",
      error: verdict._tag === "Expired"
        ? expiredPastLease(verdict, "ack")
        : ErrorSummary.make("LeaseLost", "the lease ran out before the ack; another consumer may own the message"),
      retryIn: undefined,
      ...effectCommittedIf(verdict._tag === "Duplicate")
    })

const finish = Outcome.settled

/**
 * The least delay of the nak after a dead letter that was not written. The retry policy's delay
 * alone (50 ms at a short base) would spend the message's remaining deliveries in the seconds an
 * outage of the dead-letter stream lasts (a failover: about 8 s), up to MaxDeliver, where it is
 * stranded; 5 s (the JetStream source's default settle timeout, the bound of one dead-letter
 * write) makes such an outage cost two or three deliveries.
 */
const deadLetterRetryFloor = Duration.seconds(5)

const EPOCH = DateTime.makeUnsafe(0)

/**
 * The waits between the tries of a command sent again (`resend`): 100 ms, doubling up to 1 s. A
 * JetStream consumer's leader election leaves its acks without a responder for 2 to 5 seconds.
 */
const resendBaseMillis = 100
const resendCapMillis = 1_000
/** How long a command is sent again for a source without leases (nothing else bounds it). */
const resendWithoutLeaseMillis = 5_000

/**
 * Whether a command that failed so may succeed if sent again: no confirmation came (`Timeout`: it
 * may have been applied, and an ack or term applied twice is harmless) or nobody answered
 * (`Unavailable`: no responder, as while a consumer's leader is elected). Not a refusal.
 */
const mayPass = (error: unknown): boolean =>
  typeof error === "object" && error !== null && (error as { readonly _tag?: unknown })._tag === "SettleError" &&
  ((error as SettleError).reason === "Timeout" || (error as SettleError).reason === "Unavailable")

/** The settle stage of one consumer run (`makeSettle`). */
export type SettleStage<A, E extends Tagged, R> = ReturnType<typeof makeSettle<A, E, R>>

/** Builds the settle stage of one consumer run. */
export const makeSettle = <A, E extends Tagged, R>(
  shared: Shared<A, E, R>,
  { recordOutcome, reportAll }: RecordStage<A, E, R>,
  { bounded }: BoundedRuns<A, E, R>
) => {
  const {
    definition,
    deadlines,
    ackAll,
    maxDeliver,
    now,
    wallNow,
    record,
    probe,
    hit,
    leaseMillis,
    settleLatency,
    stranded,
    rememberUnwritten,
    rememberCommitted,
    rememberReleased,
    rememberStored,
    forgetStored,
    attemptStore
  } = shared

  /**
   * The verdict for a dead letter decided past the lease, on a delivery the broker may still
   * redeliver: nothing written, no term (it would end another consumer's delivery, and the dead
   * letter would be a false one if that consumer commits). The error stays said; the next
   * delivery decides, and writes the dead letter (`rememberUnwritten`: with its reason) if it is due;
   * with an attempt store, a `DeadLettered` decision recorded before (`recordDecision`) makes it due
   * (a consumer that commits the message meanwhile clears the record).
   */
  const withholdDeadLetter = (verdict: Extract<Verdict, { readonly _tag: "DeadLettered" | "Rejected" | "Expired" }>): Verdict => {
    rememberUnwritten(verdict)
    return Outcome.verdict("Released", {
      message: verdict.message,
      reason: "LeaseLost",
      // An expired event says so (the next delivery finds it expired again, and dead-letters it).
      error: verdict._tag === "Expired" ? expiredPastLease(verdict, "dead letter") : verdict.error,
      retryIn: undefined,
      ...effectCommittedIf(verdict._tag === "DeadLettered" && verdict.effectCommitted === true)
    })
  }

  /**
   * Remembers what an outcome says of a committed effect not acked (see `rememberCommitted`): a
   * `Committed` or `Duplicate` not confirmed is no failed attempt; a failure after the commit is
   * one, but its message's effect is applied. Not called for a confirmed `Committed` (the common case).
   */
  const noteCommitted = (verdict: Verdict, confirmed: boolean): void => {
    if (verdict._tag === "Committed" || verdict._tag === "Duplicate") {
      if (!confirmed) rememberCommitted(verdict.message, false)
    } else if ((verdict._tag === "Released" || verdict._tag === "DeadLettered") && verdict.effectCommitted === true) {
      rememberCommitted(verdict.message, true)
    }
    // Released with no failure of the handler: cut by the consumer's stopping, or by the lease
    // keeper (its own error, `LeaseLost`; a failure found past the lease keeps the handler's).
    if (
      attemptStore === undefined && verdict._tag === "Released" &&
      (verdict.reason === "Interrupted" || (verdict.reason === "LeaseLost" && verdict.error?.tag === "LeaseLost"))
    ) rememberReleased(verdict.message)
  }

  // Every Delivery command is bounded by its implementation (the Delivery contract), so no
  // second timer here: a failure or timeout just means "not confirmed".
  const succeededCommand = Effect.succeed("confirmed" as const)
  const commandFailed = (cause: Cause.Cause<unknown>): Effect.Effect<"failed"> =>
    Effect.as(Effect.logWarning("broker command failed", ErrorSummary.fromCause(cause)), "failed" as const)
  const confirmed = <X, Y>(effect: Effect.Effect<X, Y>): Effect.Effect<"confirmed" | "failed"> =>
    Effect.matchCauseEffect(effect, { onSuccess: () => succeededCommand, onFailure: commandFailed })

  /**
   * Sends `send` again after it failed with `error`, while its failure may pass (`mayPass`): after
   * 100 ms, then twice as long each time up to 1 s, as long as the next try starts before the local
   * lease deadline (the keeper's 90%, from `hold`: the broker cannot have handed the message to
   * anyone else before, so the command still settles this delivery; without a lease, for 5 s). A
   * decided outcome is thus not left to the broker's redelivery over a blip: an ack lost while a
   * JetStream consumer's leader is elected would bring a committed message back (a `Duplicate`,
   * or worse past its deadline), and a lost term a dead-lettered one (to run the handler again).
   * The wait is interruptible: a shutdown past its drain ends the tries. Whether it was confirmed
   * in the end. Only after a failure: the success path pays nothing.
   */
  const resend = (
    name: string,
    delivery: Delivery,
    send: Effect.Effect<void, SettleError>,
    hold: LeaseKeeper.Hold,
    error: unknown
  ): Effect.Effect<boolean> =>
    Effect.suspend(() => {
      if (!mayPass(error)) return Effect.succeed(false)
      const firstAt = now()
      const deadline = leaseMillis > 0 ? hold.since + leaseMillis * timing.localEnd : firstAt + resendWithoutLeaseMillis
      const again = (tries: number, last: unknown): Effect.Effect<boolean> => {
        const delay = Math.min(resendCapMillis, resendBaseMillis * 2 ** tries)
        if (!mayPass(last) || now() + delay >= deadline) return gaveUp(tries, last)
        return Effect.flatMap(Effect.exit(Effect.interruptible(Effect.sleep(Duration.millis(delay)))), (slept) =>
          Exit.isFailure(slept) || now() >= deadline
            ? gaveUp(tries, last)
            : Effect.matchEffect(send, {
              onSuccess: () =>
                Effect.as(
                  Effect.logInfo(`${name} of delivery ${delivery.sequence} confirmed when sent again (try ${tries + 2})`),
                  true
                ),
              onFailure: (failure) => again(tries + 1, failure)
            }))
      }
      const gaveUp = (tries: number, last: unknown) =>
        tries === 0 ? Effect.succeed(false) : Effect.as(
          Effect.logWarning(
            `${name} of delivery ${delivery.sequence} still not confirmed after ${tries + 1} tries; left to the broker's redelivery`,
            ErrorSummary.fromError(last)
          ),
          false
        )
      return again(0, error)
    })

  /** An ack that failed with `cause`: sent again while that may help (`resend`). */
  const ackFailed = (delivery: Delivery, cause: Cause.Cause<unknown>, hold: LeaseKeeper.Hold): Effect.Effect<"confirmed" | "failed"> =>
    Effect.andThen(
      commandFailed(cause),
      Effect.map(resend("ack", delivery, delivery.ack, hold, Option.getOrUndefined(Cause.findErrorOption(cause))), (done) =>
        done ? "confirmed" as const : "failed" as const)
    )

  /**
   * Sends `command`: `confirmed`, `failed`, or for a dead letter `stored` — written and confirmed,
   * but the term of the original was not (found by the simulation: the outcome must not then
   * claim the message was released). An ack, or the term after a stored dead letter, is sent again
   * while its failure may pass (`resend`; the dead letter is written again with it, stored once by
   * its `Nats-Msg-Id`, since a delivery can only be terminated with its dead letter).
   */
  const execute = (delivery: Delivery, command: Outcome.Command, hold: LeaseKeeper.Hold): Effect.Effect<"confirmed" | "stored" | "failed"> => {
    switch (command._tag) {
      case "Ack":
        return Effect.matchCauseEffect(delivery.ack, { onSuccess: () => succeededCommand, onFailure: (cause) => ackFailed(delivery, cause, hold) })
      case "Nak":
        return confirmed(delivery.nak(command.delay))
      case "DeadLetter":
        return delivery.deadLetter(command.record).pipe(
          Effect.as("confirmed" as const),
          Effect.catchCause((cause) => {
            const error = Cause.findErrorOption(cause)
            const stored = Option.isSome(error) && error.value.command === "Term"
            const logged = Effect.logWarning(
              stored ? "dead letter stored; the term of the original was not confirmed" : "broker command failed",
              ErrorSummary.fromCause(cause)
            )
            if (!stored) return Effect.as(logged, "failed" as const)
            return Effect.andThen(
              logged,
              Effect.map(resend("term", delivery, delivery.deadLetter(command.record), hold, error.value), (done) =>
                done ? "confirmed" as const : "stored" as const)
            )
          })
        )
      case "Leave":
        return Effect.succeed("confirmed")
    }
  }

  /**
   * What a dead letter's result says for later deliveries of its message: stored with the term
   * unconfirmed, its redelivery is terminated again without running the handler
   * (`rememberStored`); terminated, there is nothing to remember.
   */
  const noteDeadLetter = (verdict: Verdict, result: "confirmed" | "stored" | "failed"): void => {
    if (result === "stored") rememberStored(verdict)
    else if (result === "confirmed") forgetStored(verdict.message)
  }

  /** Whether `verdict` is a dead letter whose decision is recorded before it is settled (`recordDecision`). */
  const recordsDecision = (verdict: Verdict): boolean =>
    verdict._tag === "DeadLettered" && attemptStore !== undefined && verdict.message.eventId !== undefined

  /**
   * Records a `DeadLettered` verdict's decision in the attempt store (`AttemptStore.recordDeadLetter`)
   * before the verdict's command is decided and sent: if the term of the original is then lost,
   * even to a crash right after the dead letter is stored, its redelivery (to any process) writes
   * the same dead letter again instead of running the handler; cleared once the term is confirmed
   * (`record.ts`). Before the decision, not in `execute`, so that the time it takes is counted
   * against the lease (a dead letter found past it is withheld: the record stays, and the next
   * delivery writes that dead letter). Best effort: bounded by `handlerTimeout`, and a decision that
   * cannot be recorded is logged and the dead letter written anyway (only this run then remembers
   * a lost term, `rememberStored`).
   */
  const recordDecision = (verdict: Verdict): Effect.Effect<void> => {
    if (verdict._tag !== "DeadLettered" || attemptStore === undefined || verdict.message.eventId === undefined) return Effect.void
    // As the dead letter's record names it: without the stack.
    const { stack: _stack, ...error } = verdict.error
    const decision = { reason: verdict.reason, error, ...(verdict.effectCommitted === true ? { effectCommitted: true } : {}) }
    return bounded(
      attemptStore.recordDeadLetter({ scope: definition.name, id: verdict.message.eventId }, decision),
      deadlines,
      decisionTimedOut
    ).pipe(Effect.catchCause(decisionUnrecorded))
  }
  const decisionTimedOut = () =>
    Effect.fail(
      new AttemptStoreError({ message: `the attempt store did not answer within ${Duration.format(definition.handlerTimeout)} (handlerTimeout)` })
    )
  const decisionUnrecorded = (cause: Cause.Cause<unknown>) =>
    Effect.logWarning(
      "attempt store unavailable; dead-letter decision not recorded (if the term is lost, a redelivery to another process runs the handler again)",
      ErrorSummary.fromCause(cause)
    )

  /**
   * Settle and record: sends the verdict's broker command (never an ack past the lease), then
   * counts, logs and reports the outcome. Never fails. Called as the delivery's effect runs (the
   * continuation of its judging), so the command's time is read as it is sent. An ack, the
   * common command, goes straight to its outcome (no steps of `execute` and no value passed on:
   * each step of the fiber is CPU on every message, see docs/performance.md).
   */
  const settle = (delivery: Delivery, judged: Verdict, receivedAt: number, lease: LeaseKeeper.Lease): Effect.Effect<void> =>
    recordsDecision(judged)
      ? Effect.andThen(recordDecision(judged), Effect.suspend(() => settleDecided(delivery, judged, receivedAt, lease)))
      : settleDecided(delivery, judged, receivedAt, lease)

  /** `settle` once the verdict's dead-letter decision, if any, is recorded: decided as it is sent. */
  const settleDecided = (delivery: Delivery, judged: Verdict, receivedAt: number, lease: LeaseKeeper.Lease): Effect.Effect<void> => {
    const decided = decide(judged, lease)
    if (decided.command._tag === "Ack") {
      return Effect.matchCauseEffect(delivery.ack, {
        onSuccess: () => settledAlone(delivery, decided, "confirmed", receivedAt),
        onFailure: (cause) => Effect.flatMap(ackFailed(delivery, cause, lease.hold), (result) => settledAlone(delivery, decided, result, receivedAt))
      })
    }
    return Effect.flatMap(execute(delivery, decided.command, lease.hold), (result) => settledAlone(delivery, decided, result, receivedAt))
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

  /** `withholdAck`; a duplicate's delivery so withheld is no failed attempt (`rememberCommitted`). */
  const withheldAck = (judged: Verdict): Verdict => {
    if (judged._tag === "Duplicate") rememberCommitted(judged.message, false)
    return withholdAck(judged)
  }

  /** The verdict to act on and its broker command, decided when the command is sent. */
  const decide = (judged: Verdict, lease: LeaseKeeper.Lease): Decided => {
    // Never ack, nak or term past the local lease deadline (with the keeper's 10% margin): the
    // server may have handed the message to another consumer, and it applies each to whoever holds
    // it (a nak would hand it to a third while the second runs it, a term would end the second's
    // run). What was found stays said (an expired event's too, whose ack or dead letter is not
    // sent). Only the broker's last delivery (MaxDeliver) is nobody else's: its dead letter is
    // still written, since no redelivery could write it.
    const commandStart = now()
    const verdict = !pastLease(lease.hold, leaseMillis, commandStart)
      ? judged
      : acks(judged, definition.expiredTo)
      ? withheldAck(judged)
      : judged._tag === "Released" && judged.retryIn !== undefined
      ? { ...judged, reason: "LeaseLost" as const, retryIn: undefined }
      : (judged._tag === "DeadLettered" || judged._tag === "Rejected" || judged._tag === "Expired") &&
          (maxDeliver === undefined || lease.delivery.deliveryCount < maxDeliver)
      ? withholdDeadLetter(judged)
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
  const outcomeOf = ({ command, verdict }: Decided, result: "confirmed" | "stored" | "failed", receivedAt: number, at: number): Outcome.Outcome => {
    // A withheld ack is not a confirmed one, although saying nothing always "succeeds". A
    // dead letter `stored` but whose term was lost stays dead-lettered for good (a redelivery
    // writes the same dead letter again, stored once, and runs no handler: `noteDeadLetter`),
    // unconfirmed, and nothing is naked.
    const confirmed = result === "confirmed" && !(verdict._tag === "Committed" && verdict.ackWithheld !== undefined)
    if (!confirmed || verdict._tag !== "Committed") noteCommitted(verdict, confirmed)
    if (command._tag === "DeadLetter") noteDeadLetter(verdict, result)
    return finish(verdict, confirmed, at - receivedAt)
  }

  /** An ack `ackAll` could not confirm: as `execute` reports a failed ack, sent again while that may help. */
  const unconfirmedAck = (delivery: Delivery, error: unknown, hold: LeaseKeeper.Hold) =>
    Effect.andThen(
      Effect.logWarning("broker command failed", ErrorSummary.fromError(error)),
      Effect.map(resend("ack", delivery, delivery.ack, hold, error), (done) => done ? "confirmed" as const : "failed" as const)
    )

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
  ): Effect.Effect<void> => {
    const settling = settleAllDecided(deliveries, verdicts, receivedAt, leases)
    return attemptStore === undefined || !verdicts.some(recordsDecision)
      ? settling
      : Effect.andThen(Effect.forEach(verdicts.filter(recordsDecision), recordDecision, { concurrency: "unbounded", discard: true }), settling)
  }

  /** `settleAll` once the dead-letter decisions among `verdicts` are recorded. */
  const settleAllDecided = (
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
        (index) => Effect.flatMap(execute(deliveries[index]!, decided[index]!.command, leases[index]!.hold), (result) => settleOne(index, result)),
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
          // One by one when all are confirmed (no fiber each); an ack that failed is sent again
          // (`resend`) beside the others, each within its own lease.
          (errors) =>
            Effect.forEach(
              acked,
              (index, i) =>
                errors[i] === undefined
                  ? settleOne(index, "confirmed")
                  : Effect.flatMap(unconfirmedAck(deliveries[index]!, errors[i], leases[index]!.hold), (result) => settleOne(index, result)),
              errors.every((error) => error === undefined) ? { discard: true } : { concurrency: "unbounded", discard: true }
            )
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
      // Not terminated, so not lost: ask for a later redelivery, which dead-letters it again (with
      // this reason, see `rememberUnwritten`); not sooner than the floor, so that an outage of the
      // dead-letter stream does not use up the deliveries left.
      rememberUnwritten(verdict)
      const retryIn = Duration.max(yield* Retry.delayAfter(definition.retry, delivery.deliveryCount), deadLetterRetryFloor)
      const naked = (yield* confirmed(delivery.nak(retryIn))) === "confirmed"
      return finish(
        Outcome.verdict("Released", {
          message: verdict.message,
          reason: "DeadLetterFailed",
          error: ErrorSummary.make("DeadLetterFailed", "the dead-letter publish was not confirmed"),
          retryIn,
          ...effectCommittedIf(verdict._tag === "DeadLettered" && verdict.effectCommitted === true)
        }),
        naked,
        now() - receivedAt
      )
    })

  return { settle, settleAll }
}

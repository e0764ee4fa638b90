/**
 * Record: what follows a delivery's settling, once its outcome is known: the attempt count's
 * cleanup, metrics, span attributes, log line, progress (and the "drained" line), then `onOutcome`,
 * bounded. The settle stage records every outcome through it, a batch's reported together
 * (`reportAll`).
 */
import { type Cause, Duration, Effect } from "effect"
import type { Tagged } from "../../Classification.ts"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import * as Outcome from "../../Outcome.ts"
import * as Telemetry from "../../Telemetry.ts"
import type { BoundedRuns } from "./bounded.ts"
import { countsInTableOrder } from "./helpers.ts"
import { rememberNewest, type Shared } from "./shared.ts"

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
  if ("error" in outcome && outcome.error !== undefined) {
    annotations.error = ErrorSummary.describe(outcome.error)
    // A thrown exception or a rejected promise, not a typed error: where it threw (bounded frames).
    if (outcome.error.kind === "Defect") {
      annotations.defect = true
      if (outcome.error.stack !== undefined) annotations.stack = outcome.error.stack
    }
  }
  // A failure after the commit: the effect is applied, only what followed it failed.
  if ("effectCommitted" in outcome && outcome.effectCommitted === true) annotations.effectCommitted = true
  return log(Outcome.describe(outcome)).pipe(Effect.annotateLogs(annotations))
}

/**
 * `first`, then `second`, where `Effect.void` stands for nothing to do and costs no step of the
 * fiber (the outcome's bookkeeping is usually nothing but `onOutcome`).
 */
const sequence = (first: Effect.Effect<void>, second: Effect.Effect<void>): Effect.Effect<void> =>
  first === Effect.void ? second : second === Effect.void ? first : Effect.andThen(first, second)

const spanAttributes = (outcome: Outcome.Outcome): Record<string, unknown> => {
  const attributes: Record<string, unknown> = { [Telemetry.Attribute.outcome]: outcome._tag }
  if (outcome.message.eventId !== undefined) attributes[Telemetry.Attribute.messageId] = outcome.message.eventId
  if ("reason" in outcome) attributes[Telemetry.Attribute.outcomeReason] = outcome.reason
  return attributes
}

/** The record stage of one consumer run (`makeRecord`). */
export type RecordStage<A, E extends Tagged, R> = ReturnType<typeof makeRecord<A, E, R>>

/** Builds the record stage of one consumer run. */
export const makeRecord = <A, E extends Tagged, R>(shared: Shared<A, E, R>, { bounded, awaitBounded }: BoundedRuns<A, E, R>) => {
  const {
    definition,
    attemptStore,
    env,
    now,
    record,
    fullSpans,
    counters,
    inFlightGauge,
    retries,
    keyedMetric,
    progress,
    progressMillis,
    reportsProgress,
    outcomeDeadlines,
    leaseMillis,
    awaitingRedelivery
  } = shared

  /**
   * Record: the attempt count's cleanup, metrics, span, log line, progress, then `onOutcome` when
   * `report`. `ownSpan`: the delivery has a span of its own to annotate (a batch element shares its
   * batch's).
   */
  const recordOutcome = (delivery: Delivery, outcome: Outcome.Outcome, ownSpan: boolean, report = true): Effect.Effect<void> => {
    let effect: Effect.Effect<void> = ownSpan && fullSpans ? Effect.annotateCurrentSpan(spanAttributes(outcome)) : Effect.void
    // What may have left a record: failures (a redelivery), or a dead letter, whose decision the
    // settle stage recorded before writing it (`recordDecision`). A first delivery that settles
    // otherwise left none, and costs no store call.
    const mayHaveRecord = delivery.deliveryCount > 1 || outcome._tag === "DeadLettered"
    // Not a dead letter left unconfirmed: its message may be delivered again (the term was lost), to
    // this process or another, and the record it keeps (its dead-letter decision, and its count)
    // stops that delivery before the handler runs (the same dead letter written again, stored
    // once) instead of running the handler afresh; a later settling, or `purge`, removes it.
    if (
      attemptStore !== undefined && outcome._tag !== "Released" && outcome.message.eventId !== undefined && mayHaveRecord &&
      (outcome.confirmed || outcome._tag !== "DeadLettered")
    ) {
      // Bounded growth: a message's record goes once it is settled for good (a record left by a
      // rewound delivery count, or a stranded message, is purged by age: `PgAttemptStore.purge`).
      effect = sequence(attemptStore.clear({ scope: definition.name, id: outcome.message.eventId }).pipe(Effect.ignore), effect)
    }
    record(counters.get(outcome._tag)!, 1)
    record(inFlightGauge, --shared.running)
    recordKind(outcome)
    if (env.debugLogs || !isRoutine(outcome)) effect = sequence(effect, logOutcome(outcome))
    if (reportsProgress) {
      progress.counts.set(outcome._tag, (progress.counts.get(outcome._tag) ?? 0) + 1)
      progress.settled.set(outcome._tag, (progress.settled.get(outcome._tag) ?? 0) + 1)
      if (outcome._tag === "Released") {
        const redeliveryIn = outcome.retryIn === undefined ? leaseMillis : Duration.toMillis(outcome.retryIn)
        rememberNewest(progress.released, outcome.message.sequence, now() + redeliveryIn + leaseMillis)
      } else if (progress.released.size > 0) {
        progress.released.delete(outcome.message.sequence)
      }
      // The last delivery taken left nothing on the broker, nothing runs, and no released delivery
      // waits for its redelivery (JetStream counts those as delivered, not pending): drained.
      if (shared.running === 0 && progress.pending === 0) {
        const at = now()
        if (at - progress.drainedLineAt >= progressMillis && awaitingRedelivery(at) === 0) {
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

  return { recordOutcome, reportAll }
}

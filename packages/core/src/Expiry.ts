/**
 * Expiry checked by the handler itself (BE-JOB-005): after any wait that could outlast the
 * event's deadline (a lock, a dependency, a rate limiter), a handler calls `Expiry.ensure` before
 * its effect. Past the deadline (with the consumer's skew allowance) it fails with
 * {@link WorkExpired}, which the engine turns into the `Expired` outcome (stage `AfterWait`): no
 * effect, acked or dead-lettered per the consumer's contract, counted in `jetworker.expired`. After
 * the idempotency store has committed the delivery's effect, the outcome is `Committed` (or
 * `Duplicate`) instead, acked: only the steps after the check are skipped.
 * The engine itself checks before every run of the handler; this is for waits inside it.
 *
 * Not in a batch handler (`Consumer.makeBatch`): there `ensure` has no current delivery and
 * succeeds. The engine checks each element's deadline once, before the batch handler runs; a
 * batch handler that waits long should keep its batches short (`batch.maxWait`, `handlerTimeout`)
 * or handle such events one by one.
 *
 * It needs no classification entry: the engine recognises it before classifying errors.
 *
 * @since 0.2.0
 */
import { Clock, Data, Effect, Option } from "effect"
import { CurrentDelivery } from "./CurrentDelivery.ts"

/** The event is past its deadline; the engine ends the delivery `Expired`. */
export class WorkExpired extends Data.TaggedError("WorkExpired")<{
  readonly eventId: string
  /** The deadline, with the skew allowance, in epoch milliseconds. */
  readonly deadline: number
  /** When it was found expired, in epoch milliseconds. */
  readonly detectedAt: number
}> {
  override get message(): string {
    return `event ${this.eventId} expired at ${new Date(this.deadline).toISOString()}`
  }
}

/**
 * Fails with {@link WorkExpired} when the current delivery's event is past its deadline; succeeds
 * otherwise, outside a delivery (a batch handler included) or for an event without a deadline.
 *
 * ```ts
 * import { Expiry } from "@jetworker/core"
 * import { Effect } from "effect"
 *
 * declare const waitForSlot: Effect.Effect<void>
 * declare const sendOffer: Effect.Effect<void>
 *
 * // A wait that may outlast the offer's deadline, then the check, then the effect.
 * const handle = Effect.andThen(waitForSlot, Effect.andThen(Expiry.ensure, sendOffer))
 * ```
 */
export const ensure: Effect.Effect<void, WorkExpired> = Effect.flatMap(
  Effect.serviceOption(CurrentDelivery),
  (current) => {
    if (Option.isNone(current) || current.value.expiresAt === undefined) return Effect.void
    const { eventId, expiresAt } = current.value
    return Effect.flatMap(Clock.currentTimeMillis, (now) =>
      now > expiresAt ? Effect.fail(new WorkExpired({ eventId, deadline: expiresAt, detectedAt: now })) : Effect.void)
  }
)

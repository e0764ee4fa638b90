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
 * In a batch handler (`Consumer.makeBatch`) it checks every element: when one is past its
 * deadline it fails with that element's {@link WorkExpired}, which fails the batch as a whole. The
 * engine then runs each element alone, as after any failure of the whole batch: the expired ones
 * end `Expired` before their run, the others run and commit. So a batch handler calls it after a
 * wait and before its commit, as a single-delivery handler does. Inside one element's effect of
 * `IdempotencyStore.commitBatch` it checks that element alone: an expired element fails alone
 * (`Expired`), and the others commit in the same batch.
 *
 * It needs no classification entry: the engine recognises it before classifying errors.
 *
 * @since 0.1.0
 */
import { Clock, Data, Effect } from "effect"
import { currentEvents } from "./internal/currentEvents.ts"

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
 * Fails with {@link WorkExpired} when the current delivery's event is past its deadline, or in a
 * batch handler when an element's event is (the first such element, in the batch's order);
 * succeeds otherwise, outside a delivery or batch, or for events without a deadline.
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
export const ensure: Effect.Effect<void, WorkExpired> = Effect.withFiber((fiber) => {
  const events = currentEvents(fiber.context)
  if (events.every((event) => event.expiresAt === undefined)) return Effect.void
  return Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const expired = events.find((event) => event.expiresAt !== undefined && now > event.expiresAt)
    return expired === undefined
      ? Effect.void
      : Effect.fail(new WorkExpired({ eventId: expired.eventId, deadline: expired.expiresAt!, detectedAt: now }))
  })
})

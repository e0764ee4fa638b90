/**
 * The events the code running in a fiber answers for, as `Expiry.ensure` and `Lease.ensure` judge
 * them: a handler's delivery, one element inside its own effect of `commitBatch`, or every element
 * of a batch handler's batch. One place, so that both checks see the same events.
 */
import { Context } from "effect"
import { CurrentBatch, CurrentDelivery, CurrentElement } from "../CurrentDelivery.ts"

/** An event's id, deadline and lease, as a delivery or a batch element gives them. */
export interface CurrentEvent {
  readonly eventId: string
  /** The deadline with the skew allowance, in epoch millis, if it has one. */
  readonly expiresAt?: number | undefined
  /** The local lease deadline now, in epoch millis, or undefined without a lease. */
  readonly leaseDeadline?: (() => number | undefined) | undefined
}

/**
 * The current delivery's event; else, inside one element's effect (`CurrentElement`), that
 * element alone; else every element of the current batch; else none.
 */
export const currentEvents = (context: Context.Context<never>): ReadonlyArray<CurrentEvent> => {
  const delivery = Context.getOrUndefined(context, CurrentDelivery)
  if (delivery !== undefined) return [delivery]
  const element = Context.getOrUndefined(context, CurrentElement)
  if (element !== undefined) return [element]
  return Context.getOrUndefined(context, CurrentBatch)?.elements ?? []
}

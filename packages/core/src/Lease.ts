/**
 * Ownership checked by the handler itself (BE-JOB-006). The broker does not check who acks or
 * extends (NATS 2.9 answers an old owner's `+WPI` and `+ACK` too), so a confirmed extension proves
 * nothing: before an effect that cannot be undone (a payment call, an e-mail), a handler calls
 * `Lease.ensure`, which fails with {@link LeaseExpired} once the local lease deadline has passed
 * (then another consumer may own the message); the engine ends the delivery `Released`
 * (`LeaseLost`) without an ack. `Lease.fencingToken` gives what to pass downstream so that a
 * receiver can refuse a stale owner: the idempotency key and the delivery's place.
 *
 * The dedup row remains the fence for effects inside the database transaction: an old and a new
 * owner commit at most once together. It needs no classification entry.
 *
 * @since 0.1.0
 */
import { Clock, Data, Effect } from "effect"
import { CurrentDelivery } from "./CurrentDelivery.ts"
import { currentEvents } from "./internal/currentEvents.ts"

/**
 * When a keeper of leases acts, as fractions of the lease (the source's ack wait). The engine's
 * keeper (for running handlers) and a source's keeper (for messages in its buffer) follow the same
 * rules, so that one never gives up a lease the other would still extend: a lease held for
 * `extendAfter` of its length gets an extension, waited for at most that long and sent again at
 * once if it goes unanswered (a request or reply lost across a reconnect); once `localEnd` of
 * it has gone by since it was last known held, it counts as lost. `localEnd` is the local lease
 * deadline ({@link ensure}), short of the broker's so that a settle sent at it still lands in time.
 */
export const timing = { extendAfter: 1 / 3, localEnd: 0.9 } as const

/** The local lease deadline has passed; another consumer may own the message. */
export class LeaseExpired extends Data.TaggedError("LeaseExpired")<{
  readonly eventId: string
  /** The local deadline, in epoch milliseconds. */
  readonly deadline: number
}> {
  override get message(): string {
    return `the lease of event ${this.eventId} ran out at ${new Date(this.deadline).toISOString()}`
  }
}

/** What identifies this owner's attempt: the idempotency key and the delivery. */
export interface FencingToken {
  /** The deduplication scope (the consumer name). */
  readonly scope: string
  /** The event id: with `scope`, the idempotency key to pass downstream. */
  readonly eventId: string
  /** The message's stream sequence. */
  readonly sequence: number
  /** The broker's delivery count: a later owner of the same message has a higher one. */
  readonly deliveryCount: number
}

/**
 * Fails with {@link LeaseExpired} past the local lease deadline; succeeds otherwise, and outside a
 * delivery or batch. The engine ends the delivery `Released` (LeaseLost) without an ack. In a
 * batch handler (`Consumer.makeBatch`) it checks every element: one past its lease fails the
 * batch as a whole, and the engine runs each element alone, where the check ends that element
 * `Released` (LeaseLost) and the others go on.
 *
 * The local deadline counts from the message's receipt, so time the message spent on the way
 * (a link that froze for a few seconds) is not on it: after such a delay another worker may
 * already run the redelivery while this check still passes. It narrows the window, it is no
 * fence: pass {@link fencingToken}'s key to the system the irreversible step goes to, and let it
 * deduplicate.
 *
 * ```ts
 * import { Lease } from "@jetworker/core"
 * import { Effect } from "effect"
 *
 * declare const chargeCard: (key: string, amountCents: number) => Effect.Effect<void>
 *
 * // Just before an effect that cannot be undone: still the owner? Then charge, with the
 * // idempotency key (scope and event id) for the payment provider to deduplicate on.
 * const charge = (amountCents: number) =>
 *   Effect.gen(function*() {
 *     yield* Lease.ensure
 *     const token = yield* Lease.fencingToken
 *     yield* chargeCard(`${token.scope}:${token.eventId}`, amountCents)
 *   })
 * ```
 */
export const ensure: Effect.Effect<void, LeaseExpired> = Effect.withFiber((fiber) => {
  const events = currentEvents(fiber.context)
  if (events.length === 0) return Effect.void
  return Effect.flatMap(Clock.currentTimeMillis, (now) => {
    for (const event of events) {
      const deadline = event.leaseDeadline?.()
      if (deadline !== undefined && now >= deadline) return Effect.fail(new LeaseExpired({ eventId: event.eventId, deadline }))
    }
    return Effect.void
  })
})

/** The current delivery's fencing token. */
export const fencingToken: Effect.Effect<FencingToken, never, CurrentDelivery> = CurrentDelivery.use((d) =>
  Effect.succeed({ scope: d.consumer, eventId: d.eventId, sequence: d.sequence, deliveryCount: d.deliveryCount })
)

/**
 * The lease keeper: one fiber per running consumer (not one per message) that watches every
 * delivery whose handler is running. A delivery held for a third of the lease gets an extension
 * (waited for at most a third of the lease, on top of the delivery's own bound); once no extension
 * has been confirmed for 90% of the lease the lease counts as lost (`Lease.timing`, shared with the
 * sources' keepers of buffered messages): the delivery is marked and its fiber interrupted, so its transaction
 * rolls back and it is never acked. Internal: the engine registers and unregisters deliveries.
 */
import { Clock, Duration, Effect, type Fiber, Option, type Scope } from "effect"
import type { Delivery } from "../Delivery.ts"
import { timing } from "../Lease.ts"
import * as LiveSet from "./liveSet.ts"
import * as Monotonic from "./monotonic.ts"

/** One delivery under watch. */
export interface Lease {
  readonly delivery: Delivery
  readonly fiber: Fiber.Fiber<unknown, unknown>
  /** When the lease was last known to be held (receipt, or the sending of a confirmed extension), in monotonic millis. */
  readonly hold: Hold
  /** Whether an extension is in flight. */
  extending: boolean
  /** Set before the keeper interrupts the fiber: the interruption means "lease lost". */
  lost: boolean
  /** Why the last extension was not confirmed (the broker's error, or no answer in time), for the lost lease's line. */
  lastFailure: string | undefined
  /** Where the keeper holds it (-1 for none). */
  slot: number
}

/**
 * The time a lease was last known held, apart from the lease: what the handler's context reads
 * (`CurrentDelivery.leaseDeadline`) without keeping the delivery alive.
 */
export interface Hold {
  since: number
}

/** Watches running deliveries. */
export interface LeaseKeeper {
  /**
   * Watches `delivery` from `receivedAt`, taken at `takenAt` (the clock's monotonic millis, see
   * `monotonic.ts`). A lease a third spent when taken (it waited in the source's buffer) is
   * extended at once, not at the keeper's next check, which could come after 90% of it.
   */
  readonly register: (delivery: Delivery, receivedAt: number, fiber: Fiber.Fiber<unknown, unknown>, takenAt: number) => Lease
  readonly unregister: (lease: Lease) => void
}

/** A keeper that watches nothing, for a source without leases. */
export const none: LeaseKeeper = {
  register: (delivery, receivedAt, fiber) => ({ delivery, fiber, hold: { since: receivedAt }, extending: false, lost: false, lastFailure: undefined, slot: -1 }),
  unregister: () => undefined
}

/** Starts the keeper's fiber in the current scope. */
export const make = (lease: Duration.Duration): Effect.Effect<LeaseKeeper, never, Scope.Scope> =>
  Effect.gen(function*() {
    const leaseMillis = Duration.toMillis(lease)
    if (!(leaseMillis > 0) || !Number.isFinite(leaseMillis)) return none
    const leases = LiveSet.make<Lease>()
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const extendAfter = leaseMillis * timing.extendAfter
    const extendTimeout = Duration.millis(extendAfter)

    const unanswered = `no answer within ${Math.round(extendAfter)} ms`
    const extend = (lease: Lease, sentAt: number) =>
      lease.delivery.extend.pipe(
        Effect.timeoutOption(extendTimeout),
        Effect.map((answered) => {
          if (Option.isSome(answered)) return true
          lease.lastFailure = unanswered
          return false
        }),
        Effect.catch((error) =>
          Effect.sync(() => {
            lease.lastFailure = error.message
            return false
          })
        ),
        Effect.flatMap((confirmed) =>
          Effect.sync(() => {
            if (confirmed && !lease.lost) lease.hold.since = Math.max(lease.hold.since, sentAt)
            lease.extending = false
          })
        )
      )

    const tick = Effect.gen(function*() {
      // Monotonic, as the broker times its ack wait: a step of the wall clock changes nothing here.
      const now = Monotonic.millis(yield* Clock.Clock)
      for (const lease of leases.members()) {
        const held = now - lease.hold.since
        if (held >= leaseMillis * timing.localEnd) {
          lease.lost = true
          leases.remove(lease.slot, lease)
          lease.fiber.interruptUnsafe()
        } else if (held >= extendAfter && !lease.extending) {
          lease.extending = true
          yield* Effect.forkDetach(extend(lease, now))
        }
      }
    })

    yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(Duration.millis(leaseMillis / 6)), tick)))
    return {
      register: (delivery, receivedAt, fiber, takenAt) => {
        const lease: Lease = { delivery, fiber, hold: { since: receivedAt }, extending: false, lost: false, lastFailure: undefined, slot: -1 }
        lease.slot = leases.add(lease)
        if (takenAt - receivedAt >= extendAfter) {
          lease.extending = true
          runFork(extend(lease, takenAt))
        }
        return lease
      },
      unregister: (lease) => {
        leases.remove(lease.slot, lease)
      }
    }
  })

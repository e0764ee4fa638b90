/**
 * The lease keeper: one fiber per running consumer (not one per message) that watches every
 * delivery whose handler is running. A delivery held for a third of the lease gets an extension
 * (waited for at most a third of the lease, on top of the delivery's own bound); once no extension has been confirmed for 90% of the lease
 * the lease counts as lost: the delivery is marked and its fiber interrupted, so its transaction
 * rolls back and it is never acked. Internal: the engine registers and unregisters deliveries.
 */
import { Clock, Duration, Effect, type Fiber, Option, type Scope } from "effect"
import type { Delivery } from "../Delivery.ts"

/** One delivery under watch. */
export interface Lease {
  readonly delivery: Delivery
  readonly fiber: Fiber.Fiber<unknown, unknown>
  /** When the lease was last known to be held (receipt, or the sending of a confirmed extension). */
  heldSince: number
  /** Whether an extension is in flight. */
  extending: boolean
  /** Set before the keeper interrupts the fiber: the interruption means "lease lost". */
  lost: boolean
}

/** Watches running deliveries. */
export interface LeaseKeeper {
  readonly register: (delivery: Delivery, receivedAt: number, fiber: Fiber.Fiber<unknown, unknown>) => Lease
  readonly unregister: (lease: Lease) => void
}

/** A keeper that watches nothing, for a source without leases. */
export const none: LeaseKeeper = {
  register: (delivery, receivedAt, fiber) => ({ delivery, fiber, heldSince: receivedAt, extending: false, lost: false }),
  unregister: () => undefined
}

/** Starts the keeper's fiber in the current scope. */
export const make = (lease: Duration.Duration): Effect.Effect<LeaseKeeper, never, Scope.Scope> =>
  Effect.gen(function*() {
    const leaseMillis = Duration.toMillis(lease)
    if (!(leaseMillis > 0) || !Number.isFinite(leaseMillis)) return none
    const leases = new Set<Lease>()
    const extendAfter = leaseMillis / 3
    const extendTimeout = Duration.millis(leaseMillis / 3)

    const extend = (lease: Lease, sentAt: number) =>
      lease.delivery.extend.pipe(
        Effect.timeoutOption(extendTimeout),
        Effect.map(Option.isSome),
        Effect.catch(() => Effect.succeed(false)),
        Effect.flatMap((confirmed) =>
          Effect.sync(() => {
            if (confirmed && !lease.lost) lease.heldSince = Math.max(lease.heldSince, sentAt)
            lease.extending = false
          })
        )
      )

    const tick = Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      for (const lease of leases) {
        const held = now - lease.heldSince
        if (held >= leaseMillis * 0.9) {
          lease.lost = true
          leases.delete(lease)
          lease.fiber.interruptUnsafe()
        } else if (held >= extendAfter && !lease.extending) {
          lease.extending = true
          yield* Effect.forkDetach(extend(lease, now))
        }
      }
    })

    yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(Duration.millis(leaseMillis / 6)), tick)))
    return {
      register: (delivery, receivedAt, fiber) => {
        const lease: Lease = { delivery, fiber, heldSince: receivedAt, extending: false, lost: false }
        leases.add(lease)
        return lease
      },
      unregister: (lease) => {
        leases.delete(lease)
      }
    }
  })

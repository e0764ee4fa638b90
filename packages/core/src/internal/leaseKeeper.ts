/**
 * The lease keeper: one fiber per running consumer (not one per message) that watches every
 * delivery whose handler is running. A delivery held for a third of the lease gets an extension
 * (waited for at most a third of the lease, on top of the delivery's own bound), sent again at once
 * if it goes unanswered in that time while the lease is short of its end; once no extension
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

/** How an extension was answered: confirmed, not at all in time, or with a failure. */
type Answer = "confirmed" | "unanswered" | "failed"

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
    const clock = yield* Clock.Clock
    const extendAfter = leaseMillis * timing.extendAfter
    const extendTimeout = Duration.millis(extendAfter)

    const unanswered = `no answer within ${Math.round(extendAfter)} ms`
    // Whether `lease` is watched and `now` short of its local end: an unanswered extension is sent
    // again only then.
    const stillHeld = (lease: Lease, now: number) =>
      !lease.lost && leases.has(lease.slot, lease) && now - lease.hold.since < leaseMillis * timing.localEnd
    const extend = (lease: Lease, sentAt: number): Effect.Effect<void> =>
      lease.delivery.extend.pipe(
        Effect.timeoutOption(extendTimeout),
        Effect.map((answered): Answer => {
          if (Option.isSome(answered)) return "confirmed"
          lease.lastFailure = unanswered
          return "unanswered"
        }),
        Effect.catch((error) =>
          Effect.sync((): Answer => {
            lease.lastFailure = error.message
            return error.reason === "Timeout" ? "unanswered" : "failed"
          })
        ),
        Effect.flatMap((answer) =>
          Effect.suspend(() => {
            if (answer === "confirmed" && !lease.lost) lease.hold.since = Math.max(lease.hold.since, sentAt)
            // An extension that went unanswered (its request or its reply lost, as across a
            // reconnect) is sent again at once rather than at the next check: waiting for that
            // could pass 90% of the lease before a second one is sent. A failure the broker or
            // the connection answered at once waits for the next check instead, as does a
            // `Timeout` that took no time (a source's bug must not spin the keeper).
            if (answer === "unanswered") {
              const now = Monotonic.millis(clock)
              if (now > sentAt && stillHeld(lease, now)) return extend(lease, now)
            }
            lease.extending = false
            return Effect.void
          })
        )
      )

    const tick = Effect.sync(() => {
      // Monotonic, as the broker times its ack wait: a step of the wall clock changes nothing here.
      const now = Monotonic.millis(clock)
      for (const lease of leases.members()) {
        const held = now - lease.hold.since
        if (held >= leaseMillis * timing.localEnd) {
          lease.lost = true
          leases.remove(lease.slot, lease)
          lease.fiber.interruptUnsafe()
        } else if (held >= extendAfter && !lease.extending) {
          lease.extending = true
          runFork(extend(lease, now))
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

/**
 * The engine's pure helpers that more than one stage uses: what a handler's context holds (the
 * store's reporter, the lease deadline), when a delivery's lease started, and the outcome counts in
 * table order. Module-level functions, not closures of a run, on purpose (see `reporter`).
 */
import type { Clock } from "effect"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { timing } from "../../Lease.ts"
import * as Outcome from "../../Outcome.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import * as Monotonic from "../monotonic.ts"
import type { Reports, Verdict } from "./types.ts"

/**
 * The functions a handler's context holds (`CurrentDelivery`, `CurrentBatch`) are built here, at
 * module level, so that each captures only what it uses: a closure built inside the per-delivery
 * path keeps that whole scope alive (the delivery, its message, the decoded event). And such a
 * context can outlive the delivery: `SqlClient.afterCommit` keeps it until a full collection,
 * whose scavenges then carry (and promote) all of it (see docs/performance-log.md).
 */
export const reporter = (reports: Reports, now: () => number) => (report: "Committed" | "AlreadyCommitted"): void => {
  if (report === "Committed") {
    reports.committed = true
    reports.committedAt = now()
  } else reports.alreadyCommitted = true
}
/**
 * The verdict for a delivery taken past 90% of its local lease (it waited in the source's buffer,
 * or for its key's turn): released, uncounted, its handler not run, since its ack would be
 * withheld and the broker may already have handed it to another consumer.
 */
export const takenPastLease = (message: Outcome.MessageRef): Verdict =>
  Outcome.verdict("Released", {
    message,
    reason: "LeaseLost",
    error: ErrorSummary.make("LeaseLost", "the lease ran out before the handler could run (the delivery waited in the source's buffer, or for its key's turn)"),
    retryIn: undefined
  })
/**
 * Whether a lease last known held at `hold.since` is past its local deadline at `at` (90% of
 * `leaseMillis`, the keeper's margin); never for a source without leases (`leaseMillis` 0).
 */
export const pastLease = (hold: LeaseKeeper.Hold, leaseMillis: number, at: number): boolean =>
  leaseMillis > 0 && at - hold.since >= leaseMillis * timing.localEnd
/** Since when `delivery`'s lease has run, taken at `takenAt`: never later than the source's receipt. */
export const leaseStart = (delivery: Delivery, takenAt: number): number =>
  delivery.receivedAt === undefined ? takenAt : Math.min(takenAt, delivery.receivedAt)
/**
 * The local lease deadline as the handler reads it: a wall time (epoch millis), reckoned at each
 * call from the monotonic time left, so that `Lease.ensure`, comparing it with the wall clock at
 * once, follows the monotonic lease across a step of the wall clock.
 */
export const leaseDeadlineOf = (hold: LeaseKeeper.Hold, leaseMillis: number, clock: Clock.Clock) => (): number =>
  clock.currentTimeMillisUnsafe() + (hold.since + leaseMillis * timing.localEnd - Monotonic.millis(clock))
/** The lease deadline where the source gives no lease (zero): none. */
export const noDeadline = (): undefined => undefined

/** Counts by outcome tag, in the outcome table's order (so a line reads the same way every time). */
export const countsInTableOrder = (counts: ReadonlyMap<Outcome.Tag, number>): Record<string, number> => {
  const ordered: Record<string, number> = {}
  for (const tag of Outcome.tags) {
    const n = counts.get(tag)
    if (n !== undefined) ordered[tag] = n
  }
  return ordered
}

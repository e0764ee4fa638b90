/**
 * The delivery a handler is running for, as a service the engine provides to each handler run:
 * the consumer name (the deduplication scope), the event id, the attempt and the message's place
 * in the broker. Handlers read it for logging or to pass ids on; the idempotency store reads it
 * for its key and reports through it what happened to the delivery's effect, so the outcome says
 * what happened whatever the handler returns.
 *
 * @since 0.1.0
 */
import { Context, Effect } from "effect"

/**
 * What an idempotency store found for the delivery's own key: `AlreadyCommitted` (an earlier
 * delivery committed this event: the outcome is `Duplicate`), or `Committed` (the effect's
 * transaction committed, reported after `COMMIT` even if the handler was interrupted meanwhile).
 */
export type Report = "AlreadyCommitted" | "Committed"

/** What a running handler knows about its delivery. */
export interface Info {
  /** The consumer name; also the deduplication scope. */
  readonly consumer: string
  /** The event's stable id. */
  readonly eventId: string
  /**
   * The attempt (1-based): the broker's delivery count, less the earlier deliveries this consumer
   * run saw commit without an ack (they were no failed attempts), or the failed attempts counted
   * by an attempt store when one is used.
   */
  readonly attempt: number
  /** The retry policy's attempts: when `attempt === attempts`, this is the last one. */
  readonly attempts: number
  /** The subject the message was published on. */
  readonly subject: string
  /** The broker's position of the message. */
  readonly sequence: number
  /** The broker's delivery count (1-based); `attempt` counts failed attempts instead when an attempt store is used. */
  readonly deliveryCount: number
  /** The event's deadline with the consumer's skew allowance, in epoch millis, if it has one (see `Expiry.ensure`). */
  readonly expiresAt: number | undefined
  /** The local lease deadline now, in epoch millis, or undefined without a lease (see `Lease.ensure`). */
  readonly leaseDeadline: () => number | undefined
  /** Tells the engine what happened to this delivery's effect (see {@link Report}); for stores. */
  readonly report: (report: Report) => void
}

/** The delivery the current handler runs for. */
export class CurrentDelivery extends Context.Service<CurrentDelivery, Info>()("@jetworker/core/CurrentDelivery") {}

/** One element of the batch a batch handler runs for. */
export interface BatchElement {
  /** The event's stable id. */
  readonly eventId: string
  /** The subject the message was published on. */
  readonly subject: string
  /** The broker's position of the message. */
  readonly sequence: number
  /** The broker's delivery count (1-based). */
  readonly deliveryCount: number
  /**
   * The event's deadline with the consumer's skew allowance, in epoch millis, if it has one (see
   * `Expiry.ensure`). Optional so that a batch built by hand (a test's) needs none.
   */
  readonly expiresAt?: number | undefined
  /** The element's local lease deadline now, in epoch millis, or undefined without a lease (see `Lease.ensure`). */
  readonly leaseDeadline?: (() => number | undefined) | undefined
  /** Tells the engine what happened to this element's effect (see {@link Report}); for stores. */
  readonly report: (report: Report) => void
}

/** What a running batch handler knows about its batch (`Consumer.makeBatch`). */
export interface BatchInfo {
  /** The consumer name; also the deduplication scope. */
  readonly consumer: string
  /** The elements, in the order of the events the handler received. */
  readonly elements: ReadonlyArray<BatchElement>
}

/** The batch the current batch handler runs for. */
export class CurrentBatch extends Context.Service<CurrentBatch, BatchInfo>()("@jetworker/core/CurrentBatch") {}

/**
 * The element whose own effect is running inside a batch handler: `IdempotencyStore.commitBatch`
 * provides it to each element's effect, so that `Expiry.ensure` and `Lease.ensure` there judge
 * that element alone (the batch, `CurrentBatch`, stays whole).
 */
export class CurrentElement extends Context.Service<CurrentElement, BatchElement>()("@jetworker/core/CurrentElement") {}

/**
 * Reports `report` for the delivery being handled, when `key` is its own (the consumer's scope and
 * the event's id), or for the element of the batch being handled whose key it is; a commit of
 * another key, or no delivery at all, reports nothing.
 */
export const reportFor = (key: { readonly scope: string; readonly id: string }, report: Report): Effect.Effect<void> =>
  reportAllFor([key], report)

/**
 * Reports `report` for every key of `keys` that is the current delivery's or an element's of the
 * current batch, as {@link reportFor} does for one (the batch's elements are matched once).
 */
export const reportAllFor = (keys: ReadonlyArray<{ readonly scope: string; readonly id: string }>, report: Report): Effect.Effect<void> =>
  // Read straight from the fiber's context: it runs on every commit.
  Effect.withFiber((fiber) => {
    reporterIn(fiber.context, keys, report)?.()
    return Effect.void
  })

/**
 * What {@link reportAllFor} would report in `context`, as a function that reports it when called
 * (after a `COMMIT`, say), or `undefined` when `keys` name neither the current delivery nor an
 * element of the current batch. The function holds the reporters it calls and nothing else (not
 * the context, the delivery or the keys): a store can keep it until its transaction commits, and
 * whatever keeps it alive meanwhile keeps no more than that.
 */
export const reporterIn = (
  context: Context.Context<never>,
  keys: ReadonlyArray<{ readonly scope: string; readonly id: string }>,
  report: Report
): (() => void) | undefined => {
  const current = Context.getOption(context, CurrentDelivery)
  if (current._tag === "Some") {
    for (const key of keys) {
      if (current.value.consumer === key.scope && current.value.eventId === key.id) return reportingTo(current.value.report, report)
    }
    return undefined
  }
  const batch = Context.getOption(context, CurrentBatch)
  if (batch._tag === "None") return undefined
  const ids = new Set<string>()
  for (const key of keys) if (key.scope === batch.value.consumer) ids.add(key.id)
  const reporters = batch.value.elements.filter((element) => ids.has(element.eventId)).map((element) => element.report)
  return reporters.length === 0 ? undefined : reportingToAll(reporters, report)
}

// Built apart from `reporterIn`, so that each function captures its arguments only.
const reportingTo = (reporter: (report: Report) => void, report: Report) => (): void => reporter(report)
const reportingToAll = (reporters: ReadonlyArray<(report: Report) => void>, report: Report) => (): void => {
  for (const reporter of reporters) reporter(report)
}

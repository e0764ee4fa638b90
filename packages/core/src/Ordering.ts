/**
 * A consumer's ordering model (BE-JOB-004): which deliveries may run at the same time.
 *
 * - `"unordered"` (the default): up to `concurrency` handlers at once, in any order. The
 *   handler must not depend on order. Cheapest: nothing waits but for a free slot.
 * - `{ perKey: (event) => key }` ({@link PerKey}): deliveries with the same key run one at a time, in the order this instance
 *   received them; different keys run in parallel. A delivery waits in its key's lane, holding
 *   no slot; the lanes have finite limits, and when one is reached the engine stops pulling from
 *   the broker instead of buffering more. Costs one wait per delivery and, with a hot key, the
 *   parallelism of that key (one).
 * - `"sequential"`: one delivery at a time (concurrency 1), and the broker-side consumer must
 *   have `max_ack_pending` 1, checked when the consumer starts. That is the only model with
 *   strict order across redeliveries and instances; its throughput is one handler's.
 *
 * What JetStream does and does not guarantee: a consumer delivers in stream order, but a
 * redelivery (a nak with a delay, a lease run out, a crash) comes after later messages, and
 * several instances on one durable consumer each receive a share. `perKey` therefore keeps order
 * within one instance and between first deliveries; a message released for a later retry lets
 * the next message of its key go first, and two instances may run the same key at once. For
 * strict order per key across instances, give each instance its own subjects (partition the
 * subject space, e.g. `orders.<shard>.>`, one durable consumer per shard with a filter subject)
 * or choose `"sequential"`; either way the idempotent commit stays the guard against duplicates.
 *
 * @since 0.1.0
 */

/** Limits of per-key ordering. Every limit is finite. */
export interface PerKeyLimits {
  /**
   * Deliveries held waiting, beyond the `concurrency` running ones: waiting for their key's turn
   * or for a free slot. 0 to 10 000. Default: twice the concurrency.
   */
  readonly maxQueued?: number | undefined
  /** Deliveries of one key waiting behind the one that runs. 0 to 10 000. Default: the concurrency. */
  readonly maxQueuedPerKey?: number | undefined
  /** Distinct keys held at once (running or waiting). 1 to 10 000. Default: concurrency + maxQueued. */
  readonly maxKeys?: number | undefined
}

/** Same-key deliveries run one at a time, in the order received; different keys in parallel. */
export interface PerKey<in A> extends PerKeyLimits {
  /**
   * The key of an event, e.g. an account id. A key that cannot be read (the function throws or
   * returns something other than a string) rejects the message (`MetadataInvalid`).
   */
  readonly perKey: (event: A) => string
}

/**
 * A consumer's ordering model, as `Consumer.make`'s `ordering` option: `"unordered"` (the
 * default), `"sequential"`, or `{ perKey: (event) => key, ...limits }`. An object rather than a
 * constructor, so the key function's parameter is typed from the consumer's schema.
 */
export type Ordering<A> = "unordered" | "sequential" | PerKey<A>

/**
 * The attempts budget's memory: how many times the handler has failed for an event, kept outside
 * the broker. The broker's delivery count also counts releases (shutdowns, interruptions, naks
 * of buffered messages) and NATS 2.9 can rewind it (a nak and a reconnect bring a message back as
 * delivery 1), so it can neither spend a budget fairly nor bound it. With a store, the engine
 * counts only failed attempts of the handler, keyed like the dedup row (consumer name + event
 * id), and keeps the delivery count as a crash-loop guard with its own, larger bound
 * (`Consumer` option `maxDeliveries`). Without one, the delivery count is the attempt count.
 *
 * When the store is unavailable (`PgAttemptStore` lives in the handler's database, so exactly
 * during its outage) the engine does not fall back to the delivery count, which would spend the
 * budget on deliveries that were no failures: a redelivery whose count cannot be read runs the
 * handler (a dependency that is down makes it fail transiently, and it is released with a
 * backoff); a failure that cannot be recorded is dead-lettered `AttemptsExhausted` only when the
 * failures known to be real (those read before the run, none if that read failed, and this one)
 * reach the policy's attempts, and is otherwise released for a retry, with a backoff that grows
 * with the delivery count. The crash-loop guard then is the hard bound: a message delivered more
 * than `maxDeliveries` times (default twice the attempts, lowered to the broker's MaxDeliver − 1)
 * is dead-lettered `DeliveriesExhausted` on its next delivery, before MaxDeliver. So during an
 * outage a failing message may run up to that bound rather than the policy's attempts.
 *
 * `@jetworker/sql-pg` implements it on PostgreSQL (`PgAttemptStore`). This module holds the
 * contract only.
 *
 * @since 0.1.0
 */
import { Context, Data, type Effect } from "effect"
import type { Key } from "./IdempotencyStore.ts"

/**
 * The store could not be read or written. The engine then counts only the failures it knows to be
 * real, never the delivery count, and the crash-loop guard bounds the deliveries (see the module).
 */
export class AttemptStoreError extends Data.TaggedError("AttemptStoreError")<{ readonly message: string }> {}

/** A record of failed attempts per event. */
export interface AttemptStoreShape {
  /** The failed attempts recorded for `key` (0 when none). */
  readonly failures: (key: Key) => Effect.Effect<number, AttemptStoreError>
  /** Records one more failed attempt of `key`, atomically, and returns the new count. */
  readonly recordFailure: (key: Key) => Effect.Effect<number, AttemptStoreError>
  /** Forgets `key` once its message has reached a final outcome. */
  readonly clear: (key: Key) => Effect.Effect<void, AttemptStoreError>
}

/** The attempt store service; optional: the engine uses it when the context has one. */
export class AttemptStore extends Context.Service<AttemptStore, AttemptStoreShape>()("@jetworker/core/AttemptStore") {}

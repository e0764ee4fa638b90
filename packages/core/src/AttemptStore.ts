/**
 * The attempts budget's memory: how many times the handler has failed for an event, kept outside
 * the broker. The broker's delivery count also counts releases (shutdowns, interruptions, naks
 * of buffered messages) and NATS 2.9 can rewind it (a nak and a reconnect bring a message back as
 * delivery 1), so it can neither spend a budget fairly nor bound it. With a store, the engine
 * counts only failed attempts of the handler, keyed like the dedup row (consumer name + event
 * id), and keeps the delivery count as a crash-loop guard with its own, larger bound
 * (`Consumer` option `maxDeliveries`). Without one, the delivery count is the attempt count.
 *
 * `@jetworker/sql-pg` implements it on PostgreSQL (`PgAttemptStore`). This module holds the
 * contract only.
 *
 * @since 0.2.0
 */
import { Context, Data, type Effect } from "effect"
import type { Key } from "./IdempotencyStore.ts"

/** The store could not be read or written; the engine then falls back to the delivery count. */
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

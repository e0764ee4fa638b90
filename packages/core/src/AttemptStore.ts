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
 * It also keeps the engine's dead-letter decisions (`recordDeadLetter`): before a message's dead
 * letter is written, the engine records its reason and the error it names, and clears the record
 * once the original's term is confirmed. A term that is lost (a JetStream consumer's leader being
 * elected, a crash between the dead letter's storing and the term) brings the message back after
 * its ack wait, perhaps to another process: the record, read with the failures in the same call
 * (`read`), makes that redelivery write the same dead letter again and terminate the message,
 * without running the handler (which might now succeed, and apply an event whose dead letter says
 * it was refused). A decision that cannot be recorded is logged and the dead letter written anyway
 * (then only the process that decided remembers it).
 *
 * `@jetworker/sql-pg` implements it on PostgreSQL (`PgAttemptStore`). This module holds the
 * contract only.
 *
 * @since 0.1.0
 */
import { Context, Data, type Effect } from "effect"
import type { ErrorSummary } from "./ErrorSummary.ts"
import type { Key } from "./IdempotencyStore.ts"
import type { DeadLetterReason } from "./Outcome.ts"

/**
 * The store could not be read or written. The engine then counts only the failures it knows to be
 * real, never the delivery count, and the crash-loop guard bounds the deliveries (see the module).
 */
export class AttemptStoreError extends Data.TaggedError("AttemptStoreError")<{ readonly message: string }> {}

/**
 * A dead letter the engine decided for an event: what it needs to write the same dead letter
 * again on a redelivery (the `DeadLettered` outcome's reason, error and `effectCommitted`).
 */
export interface DeadLetterDecision {
  /** The `DeadLettered` outcome's reason. */
  readonly reason: DeadLetterReason
  /** The error the dead letter names (as in its record: no stack). */
  readonly error: ErrorSummary
  /** `true` when the event's effect was committed before the failure; absent otherwise. */
  readonly effectCommitted?: boolean | undefined
}

/**
 * What the store holds for an event: its failed attempts, and the dead letter decided for it, if
 * one was recorded and not yet cleared.
 */
export interface Attempts {
  /** The failed attempts recorded (0 when none). */
  readonly failures: number
  /** The dead letter decided for the event and not yet cleared, if any. */
  readonly deadLetter?: DeadLetterDecision | undefined
}

/** A record of failed attempts, and of decided dead letters, per event. */
export interface AttemptStoreShape {
  /**
   * What is recorded for `key`, in one read: its failed attempts (0 when none) and its dead-letter
   * decision, if any. The engine reads it for redeliveries only.
   */
  readonly read: (key: Key) => Effect.Effect<Attempts, AttemptStoreError>
  /** Records one more failed attempt of `key`, atomically, and returns the new count. */
  readonly recordFailure: (key: Key) => Effect.Effect<number, AttemptStoreError>
  /**
   * Records that `key`'s message is dead-lettered with `decision` (replacing an earlier decision;
   * its failures are kept). Written before the dead letter, so a redelivery after a lost term
   * writes the same one again instead of running the handler.
   */
  readonly recordDeadLetter: (key: Key, decision: DeadLetterDecision) => Effect.Effect<void, AttemptStoreError>
  /** Forgets `key` (its failures and its dead-letter decision) once its message has reached a final outcome. */
  readonly clear: (key: Key) => Effect.Effect<void, AttemptStoreError>
}

/** The attempt store service; optional: the engine uses it when the context has one. */
export class AttemptStore extends Context.Service<AttemptStore, AttemptStoreShape>()("@jetworker/core/AttemptStore") {}

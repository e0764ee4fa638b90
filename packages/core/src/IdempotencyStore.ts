/**
 * The idempotency store: commits a handler's effects together with a deduplication row keyed by
 * (scope, id), so that an event's irreversible effect happens at most once however often it is
 * delivered (BE-JOB-002). Duplicate detection and the commit of the protected result are one
 * atomic step; a failed commit leaves no row. `@jetworker/sql-pg` implements it on PostgreSQL
 * (the row and the effects in one transaction).
 *
 * This module holds the contract only: no I/O, no database.
 *
 * @since 0.1.0
 */
import { Context, Data, Effect, Option } from "effect"
import { CurrentDelivery, reportFor } from "./CurrentDelivery.ts"

/** The deduplication key: a scope (the consumer name) and the event's stable id. */
export interface Key {
  readonly scope: string
  readonly id: string
}

const AlreadyCommittedTypeId: unique symbol = Symbol.for("@jetworker/core/IdempotencyStore/AlreadyCommitted")

/**
 * The result of a commit when the key was already committed: nothing was done. The engine learns
 * it from the store's report (`CurrentDelivery.report`), not from this value, so a handler may map
 * or discard it and the outcome is still `Duplicate`.
 */
export interface AlreadyCommitted {
  readonly [AlreadyCommittedTypeId]: typeof AlreadyCommittedTypeId
  readonly _tag: "AlreadyCommitted"
  readonly key: Key
}

/** Whether a commit's result says "already committed: nothing was done". */
export const isAlreadyCommitted = (value: unknown): value is AlreadyCommitted =>
  typeof value === "object" && value !== null && AlreadyCommittedTypeId in value

/** Builds the {@link AlreadyCommitted} marker. */
export const alreadyCommitted = (key: Key): AlreadyCommitted => ({
  [AlreadyCommittedTypeId]: AlreadyCommittedTypeId,
  _tag: "AlreadyCommitted",
  key
})

/** @deprecated Renamed {@link AlreadyCommitted} (the outcome is `Duplicate`; this is the store's result). */
export type Duplicate = AlreadyCommitted
/** @deprecated Renamed {@link isAlreadyCommitted}. */
export const isDuplicate: (value: unknown) => value is AlreadyCommitted = isAlreadyCommitted
/** @deprecated Renamed {@link alreadyCommitted}. */
export const duplicate: (key: Key) => AlreadyCommitted = alreadyCommitted

/** Why the store could not decide or commit. */
export class IdempotencyError extends Data.TaggedError("IdempotencyError")<{
  /**
   * `Unavailable`: the store cannot be reached or the commit's result is unknown (retry: the key
   * tells a later attempt what happened). `Conflict`: a serialisation or deadlock failure, or a
   * lock or statement timeout (retry). `Misconfigured`: the store's tables are missing or wrong
   * (no retry helps). `InvalidData`: the database rejected the data of the commit, such as a key
   * it cannot store (a NUL character in the id) or a violated constraint; the same event fails the
   * same way every time, so no retry helps and it should be dead-lettered at once.
   */
  readonly reason: "Unavailable" | "Conflict" | "Misconfigured" | "InvalidData"
  readonly message: string
}> {
  /** Whether a later attempt may succeed: only for `Unavailable` and `Conflict`. */
  get isRetryable(): boolean {
    return this.reason === "Unavailable" || this.reason === "Conflict"
  }
}

/** An idempotency store. */
export class IdempotencyStore extends Context.Service<IdempotencyStore, {
  /**
   * Runs `effect` and records `key` in one atomic commit, or does nothing and returns
   * {@link AlreadyCommitted} when `key` is already recorded. A store reports both to the current
   * delivery (`CurrentDelivery.reportFor`): `AlreadyCommitted` when it finds the key, `Committed`
   * once the transaction's `COMMIT` succeeded (even if the fiber was interrupted meanwhile). A concurrent commit of the same key waits
   * for the other to finish: it is a duplicate when the other commits, and proceeds when the
   * other rolls back. When `effect` fails, or the commit does, nothing is recorded.
   */
  readonly commit: <A, E, R>(key: Key, effect: Effect.Effect<A, E, R>) => Effect.Effect<
    A | AlreadyCommitted,
    E | IdempotencyError,
    R
  >
  /** Whether `key` has been committed. */
  readonly isCommitted: (key: Key) => Effect.Effect<boolean, IdempotencyError>
}>()("@jetworker/core/IdempotencyStore") {}

/**
 * Runs `effect` at most once per event: `effect` and the deduplication row for `id` commit
 * together. The scope is the current delivery's consumer name unless `scope` is given.
 * Returns the effect's value, or {@link AlreadyCommitted} when this event was already committed;
 * either way the engine learns it from the store's report, so the handler may discard the result.
 */
export const commit = <A, E, R>(
  id: string,
  effect: Effect.Effect<A, E, R>,
  options?: { readonly scope?: string | undefined }
): Effect.Effect<A | AlreadyCommitted, E | IdempotencyError, R | IdempotencyStore> =>
  Effect.gen(function*() {
    const store = yield* IdempotencyStore
    let scope = options?.scope
    if (scope === undefined) {
      const current = yield* Effect.serviceOption(CurrentDelivery)
      if (Option.isNone(current)) {
        return yield* new IdempotencyError({
          reason: "Misconfigured",
          message: "IdempotencyStore.commit outside a delivery needs an explicit scope"
        })
      }
      scope = current.value.consumer
    }
    const key = { scope, id }
    const result = yield* store.commit(key, effect)
    // Any store's "already committed" reaches the engine, even one that does not report it itself.
    if (isAlreadyCommitted(result)) yield* reportFor(key, "AlreadyCommitted")
    return result
  })

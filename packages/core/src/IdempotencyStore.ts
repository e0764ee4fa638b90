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
import { Context, Data, Effect, Option, Result } from "effect"
import { type BatchInfo, CurrentBatch, CurrentDelivery, CurrentElement, reportAllFor, reportFor } from "./CurrentDelivery.ts"

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

/** The index of the first NUL or lone surrogate of `text`, or -1 when it has none. */
const unstorableAt = (text: string): number => {
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i)
    if (unit === 0) return i
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const next = text.charCodeAt(i + 1)
      if (next >= 0xdc00 && next <= 0xdfff) i++
      else return i
    } else if (unit >= 0xdc00 && unit <= 0xdfff) {
      return i
    }
  }
  return -1
}

const storable = (text: string): boolean => text.isWellFormed() && !text.includes("\u0000")

/**
 * The refusal of a key that no store may take, or `undefined` for a good key: a scope or id holding
 * a NUL (PostgreSQL's text type refuses it) or a lone surrogate (UTF-8 cannot encode it, so the
 * driver would send U+FFFD and distinct ids would collide, the second commit a false duplicate).
 * `InvalidData`: the same event fails the same way on every attempt. Every store refuses such a key
 * this way before anything runs, so that a store in memory fails where the database would.
 */
export const keyProblem = (key: Key, operation: string): IdempotencyError | undefined => {
  if (storable(key.scope) && storable(key.id)) return undefined
  const [part, value] = storable(key.scope) ? ["id", key.id] as const : ["scope", key.scope] as const
  const at = unstorableAt(value)
  const what = value.charCodeAt(at) === 0 ? "a NUL, which PostgreSQL cannot store in text" : (
    "not well-formed Unicode (a lone surrogate), which PostgreSQL would store as U+FFFD so that distinct keys collide"
  )
  return new IdempotencyError({
    reason: "InvalidData",
    message: `${operation}: the idempotency key's ${part} ${JSON.stringify(value)} holds at index ${at} ${what}; ` +
      `derive keys from well-formed strings without NUL`
  })
}

/** {@link keyProblem} of the first of `keys` that is refused, or `undefined` when all are good. */
export const firstKeyProblem = (keys: Iterable<Key>, operation: string): IdempotencyError | undefined => {
  for (const key of keys) {
    const problem = keyProblem(key, operation)
    if (problem !== undefined) return problem
  }
  return undefined
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
  /**
   * Commits a batch in one atomic step: records every key not yet recorded and runs its effect;
   * each element gets its own result, in the order given: the effect's value,
   * {@link AlreadyCommitted} for a key already recorded (its effect does not run; a key that
   * appears twice runs once), or the effect's own failure, which undoes that element's effect and
   * its record and nothing else. The store reports each element as `commit` does (through
   * `CurrentBatch`). It fails as a whole (nothing recorded) only when the commit itself fails or
   * an effect dies or is interrupted. Keys are recorded in one statement in key order, so two
   * overlapping batches wait for each other instead of deadlocking.
   */
  readonly commitBatch: <A, E, R>(items: ReadonlyArray<BatchItem<A, E, R>>) => Effect.Effect<
    ReadonlyArray<Result.Result<A | AlreadyCommitted, E>>,
    IdempotencyError,
    R
  >
  /**
   * Commits a batch as one set (all or nothing): records every key not yet recorded and runs
   * `effect` once with the positions of those new keys (it writes their effects together, e.g.
   * one multi-row insert); a key already recorded, or given twice, is {@link AlreadyCommitted}.
   * The cheapest batch commit, at the price of isolation: when `effect` or the commit fails,
   * nothing is recorded and the failure is the whole batch's. Reports like `commitBatch`.
   */
  readonly commitAll: <A, E, R>(
    keys: ReadonlyArray<Key>,
    effect: (fresh: ReadonlyArray<number>) => Effect.Effect<A, E, R>
  ) => Effect.Effect<ReadonlyArray<A | AlreadyCommitted>, E | IdempotencyError, R>
  /** Whether `key` has been committed. */
  readonly isCommitted: (key: Key) => Effect.Effect<boolean, IdempotencyError>
}>()("@jetworker/core/IdempotencyStore") {}

/** One element of {@link IdempotencyStore}'s `commitBatch`: a key and the effect it protects. */
export interface BatchItem<A, E, R> {
  readonly key: Key
  readonly effect: Effect.Effect<A, E, R>
}

/** The scope of a commit: `scope` when given, else the current delivery's or batch's consumer. */
const scopeIn = (context: Context.Context<never>, scope: string | undefined, caller: string): string | IdempotencyError => {
  if (scope !== undefined) return scope
  const delivery = Context.getOption(context, CurrentDelivery)
  if (Option.isSome(delivery)) return delivery.value.consumer
  const batch = Context.getOption(context, CurrentBatch)
  if (Option.isSome(batch)) return batch.value.consumer
  return new IdempotencyError({
    reason: "Misconfigured",
    message: `IdempotencyStore.${caller} outside a delivery needs an explicit scope`
  })
}

/** Runs `f` with the store and the commit's scope (read from the fiber's context, without a generator). */
const withStore = <A, E, R>(
  scope: string | undefined,
  caller: string,
  f: (store: IdempotencyStore["Service"], scope: string) => Effect.Effect<A, E, R>
): Effect.Effect<A, E | IdempotencyError, R | IdempotencyStore> =>
  IdempotencyStore.use((store) =>
    Effect.withFiber((fiber): Effect.Effect<A, E | IdempotencyError, R> => {
      const found = scopeIn(fiber.context, scope, caller)
      return typeof found === "string" ? f(store, found) : Effect.fail(found)
    })
  )

/**
 * Runs `effect` at most once per event: `effect` and the deduplication row for `id` commit
 * together. The scope is the current delivery's consumer name unless `scope` is given.
 * Returns the effect's value, or {@link AlreadyCommitted} when this event was already committed;
 * either way the engine learns it from the store's report, so the handler may discard the result.
 *
 * ```ts
 * import { IdempotencyStore } from "@jetworker/core"
 * import { Effect } from "effect"
 * import { SqlClient } from "effect/sql"
 *
 * // In a handler: the transfer's two statements and the dedup row of `transfer.id` commit together.
 * const apply = (transfer: { readonly id: string; readonly from: string; readonly to: string; readonly amount: number }) =>
 *   Effect.gen(function*() {
 *     const sql = yield* SqlClient.SqlClient
 *     const result = yield* IdempotencyStore.commit(transfer.id, Effect.gen(function*() {
 *       yield* sql`UPDATE accounts SET balance = balance - ${transfer.amount} WHERE id = ${transfer.from}`
 *       yield* sql`UPDATE accounts SET balance = balance + ${transfer.amount} WHERE id = ${transfer.to}`
 *     }))
 *     if (IdempotencyStore.isAlreadyCommitted(result)) yield* Effect.logDebug(`transfer ${transfer.id} was applied before`)
 *   })
 * ```
 */
export const commit = <A, E, R>(
  id: string,
  effect: Effect.Effect<A, E, R>,
  options?: { readonly scope?: string | undefined }
): Effect.Effect<A | AlreadyCommitted, E | IdempotencyError, R | IdempotencyStore> =>
  withStore(options?.scope, "commit", (store, scope) => {
    const key = { scope, id }
    return Effect.flatMap(store.commit(key, effect), (result): Effect.Effect<A | AlreadyCommitted> =>
      // Any store's "already committed" reaches the engine, even one that does not report it itself.
      isAlreadyCommitted(result) ? Effect.as(reportFor(key, "AlreadyCommitted"), result) : Effect.succeed(result))
  })

/**
 * Commits a batch of events at most once each, in one transaction (see the store's
 * `commitBatch`): each `effect` runs with its event's deduplication row unless the event was
 * already committed. Returns one result per item, in order — the effect's value,
 * {@link AlreadyCommitted}, or the effect's own failure (that element alone is undone) — which is
 * what a batch handler (`Consumer.makeBatch`) returns to the engine. The scope is the current
 * batch's consumer name unless `scope` is given. Each `effect` runs as its own element's
 * (`CurrentElement`), so `Expiry.ensure` in it fails only when its own event has expired (that
 * element ends `Expired`, the others commit).
 */
export const commitBatch = <A, E, R>(
  items: ReadonlyArray<{ readonly id: string; readonly effect: Effect.Effect<A, E, R> }>,
  options?: { readonly scope?: string | undefined }
): Effect.Effect<ReadonlyArray<Result.Result<A | AlreadyCommitted, E>>, IdempotencyError, R | IdempotencyStore> =>
  withStore(options?.scope, "commitBatch", (store, scope) =>
    Effect.withFiber((fiber) => {
      const batch = Context.getOrUndefined(fiber.context, CurrentBatch)
      const keyed = items.map((item) => ({ key: { scope, id: item.id }, effect: asElement(batch, scope, item.id, item.effect) }))
      return Effect.flatMap(store.commitBatch(keyed), (results) => {
        const already: Array<Key> = []
        for (const [i, result] of results.entries()) {
          if (Result.isSuccess(result) && isAlreadyCommitted(result.success)) already.push({ scope, id: items[i]!.id })
        }
        return reportingAlreadyCommitted(already, results)
      })
    }))

/**
 * `effect` run as its own element's: with `CurrentElement` the element of `id`, so that
 * `Expiry.ensure` and `Lease.ensure` in one element's effect judge that element alone (a sibling's
 * deadline must not fail it). Unchanged outside a batch, or for a key of another scope.
 */
const asElement = <A, E, R>(
  batch: BatchInfo | undefined,
  scope: string,
  id: string,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> => {
  if (batch === undefined || batch.consumer !== scope) return effect
  const element = batch.elements.find((candidate) => candidate.eventId === id)
  return element === undefined ? effect : Effect.provideService(effect, CurrentElement, element)
}

/**
 * Commits a batch of events as one set, all or nothing (see the store's `commitAll`): the events
 * not yet committed are recorded and `effect` runs once with their positions in `ids`, to write
 * their effects together. Returns one result per id — the effect's value, or
 * {@link AlreadyCommitted} for an event committed before — which a batch handler
 * (`Consumer.makeBatch`) returns as it is; a failure fails the whole batch, and the engine then
 * runs each event alone, so one bad event cannot hold back the others. The scope is the current
 * batch's consumer name unless `scope` is given.
 */
export const commitAll = <A, E, R>(
  ids: ReadonlyArray<string>,
  effect: (fresh: ReadonlyArray<number>) => Effect.Effect<A, E, R>,
  options?: { readonly scope?: string | undefined }
): Effect.Effect<ReadonlyArray<Result.Result<A | AlreadyCommitted, never>>, E | IdempotencyError, R | IdempotencyStore> =>
  withStore(options?.scope, "commitAll", (store, scope) =>
    Effect.flatMap(store.commitAll(ids.map((id) => ({ scope, id })), effect), (values) => {
      const already: Array<Key> = []
      const results = values.map((value, i) => {
        if (isAlreadyCommitted(value)) already.push({ scope, id: ids[i]! })
        return Result.succeed(value)
      })
      return reportingAlreadyCommitted(already, results)
    }))

/** `results`, once each key of `already` is reported `AlreadyCommitted` to its delivery or batch element. */
const reportingAlreadyCommitted = <X>(already: ReadonlyArray<Key>, results: X): Effect.Effect<X> =>
  already.length === 0 ? Effect.succeed(results) : Effect.as(reportAllFor(already, "AlreadyCommitted"), results)

/**
 * An idempotency store in memory, with the contract of the PostgreSQL one: a commit runs its
 * effect and records its key atomically (the key's effects count only once the effect has
 * succeeded and the commit is recorded), a concurrent commit of the same key waits for the other
 * and is then `AlreadyCommitted` (or proceeds if the other failed), and the store reports both to
 * the current delivery. Every commit is appended to `commits` with a global order, for
 * invariants; `failCommit` injects a failure of the commit itself (its result unknown to the
 * caller, nothing recorded). A batch commit locks its keys in key order, runs the effect of each
 * key not yet recorded, and records those that succeeded together (an element's failure is its
 * own; a failed commit records none). Like the PostgreSQL store, it refuses a key PostgreSQL cannot
 * store (a NUL, or a lone surrogate that would be stored as U+FFFD) with `IdempotencyError`
 * `InvalidData`, before anything runs.
 *
 * It deliberately has no durability: it lives as long as the test.
 *
 * @since 0.1.0
 */
import { CurrentDelivery, IdempotencyStore } from "@jetworker/core"
import { Cause, Clock, Effect, Exit, Layer, Result, Semaphore } from "effect"

/** One recorded commit. */
export interface Commit {
  readonly scope: string
  readonly id: string
  readonly index: number
  readonly at: number
}

/** An in-memory store and what it recorded. */
export interface InMemoryIdempotencyStore {
  /** The store, for `Layer.succeed(IdempotencyStore.IdempotencyStore, store.service)`. */
  readonly service: IdempotencyStore.IdempotencyStore["Service"]
  /** The store as a layer. */
  readonly layer: Layer.Layer<IdempotencyStore.IdempotencyStore>
  /** Every commit, in order. */
  readonly commits: () => ReadonlyArray<Commit>
}

/** Options of {@link make}. */
export interface Options {
  /** A global counter shared with other recorders (e.g. a broker), so their events are ordered. */
  readonly clock?: {
    /** The next number of the shared order, greater than every one before. */
    readonly next: () => number
  } | undefined
  /** Whether the next commit of `key` fails (`IdempotencyError` `Unavailable`, nothing recorded). Default: never. */
  readonly failCommit?: ((key: IdempotencyStore.Key) => boolean) | undefined
}

/** Creates a store. */
export const make = (options: Options = {}): InMemoryIdempotencyStore => {
  const order = options.clock ?? (() => {
    let n = 0
    return { next: () => ++n }
  })()
  const committed = new Set<string>()
  const commits: Array<Commit> = []
  const locks = new Map<string, Semaphore.Semaphore>()
  const lockOf = (name: string) => {
    let lock = locks.get(name)
    if (lock === undefined) {
      lock = Semaphore.makeUnsafe(1)
      locks.set(name, lock)
    }
    return lock
  }

  // Unambiguous whatever the parts hold: ("a\0b", "c") and ("a", "b\0c") are distinct names.
  const nameOf = (key: IdempotencyStore.Key) => JSON.stringify([key.scope, key.id])
  // Runs `effect` holding the locks of `names`, taken in key order (the first outermost), like
  // the database's key-ordered insert, so overlapping batches wait instead of deadlocking.
  const withLocks = <A, E, R>(names: ReadonlyArray<string>, effect: Effect.Effect<A, E, R>) =>
    [...new Set(names)].sort().map(lockOf).reduceRight((inner, lock) => Semaphore.withPermits(lock, 1)(inner), effect)

  const commit = <A, E, R>(
    key: IdempotencyStore.Key,
    effect: Effect.Effect<A, E, R>
  ): Effect.Effect<A | IdempotencyStore.AlreadyCommitted, E | IdempotencyStore.IdempotencyError, R> => {
    const malformed = IdempotencyStore.keyProblem(key, "commit")
    if (malformed !== undefined) return Effect.fail(malformed)
    const name = nameOf(key)
    return Semaphore.withPermits(lockOf(name), 1)(
      Effect.suspend((): Effect.Effect<A | IdempotencyStore.AlreadyCommitted, E | IdempotencyStore.IdempotencyError, R> => {
        if (committed.has(name)) {
          return Effect.as(CurrentDelivery.reportFor(key, "AlreadyCommitted"), IdempotencyStore.alreadyCommitted(key))
        }
        return Effect.flatMap(effect, (value) =>
          // The commit itself: atomic, and not interruptible once it starts.
          Effect.uninterruptible(Effect.flatMap(Clock.currentTimeMillis, (now) => {
            if (options.failCommit?.(key) === true) {
              return Effect.fail(new IdempotencyStore.IdempotencyError({ reason: "Unavailable", message: "commit failed (injected)" }))
            }
            committed.add(name)
            commits.push({ scope: key.scope, id: key.id, index: order.next(), at: now })
            return Effect.as(CurrentDelivery.reportFor(key, "Committed"), value)
          })))
      })
    )
  }

  const commitBatch = <A, E, R>(
    items: ReadonlyArray<IdempotencyStore.BatchItem<A, E, R>>
  ): Effect.Effect<ReadonlyArray<Result.Result<A | IdempotencyStore.AlreadyCommitted, E>>, IdempotencyStore.IdempotencyError, R> => {
    const malformed = IdempotencyStore.firstKeyProblem(items.map((item) => item.key), "commitBatch")
    if (malformed !== undefined) return Effect.fail(malformed)
    const names = items.map((item) => nameOf(item.key))
    const run: Effect.Effect<
      ReadonlyArray<Result.Result<A | IdempotencyStore.AlreadyCommitted, E>>,
      IdempotencyStore.IdempotencyError,
      R
    > = Effect.gen(function*() {
      const results: Array<Result.Result<A | IdempotencyStore.AlreadyCommitted, E>> = []
      const first = new Map<string, number>()
      for (const [i, item] of items.entries()) {
        const earlier = first.get(names[i]!)
        if (earlier !== undefined || committed.has(names[i]!)) {
          const result = earlier === undefined ? undefined : results[earlier]!
          results.push(result !== undefined && Result.isFailure(result) ? result : Result.succeed(IdempotencyStore.alreadyCommitted(item.key)))
          continue
        }
        first.set(names[i]!, i)
        const exit = yield* Effect.exit(item.effect)
        if (Exit.isSuccess(exit)) results.push(Result.succeed(exit.value))
        else {
          const failure = exit.cause.reasons.find((reason) => reason._tag === "Fail")
          if (failure === undefined || exit.cause.reasons.some((reason) => reason._tag !== "Fail")) {
            // An effect died or was interrupted: the whole batch fails, nothing recorded.
            return yield* (Cause.hasInterrupts(exit.cause) ? Effect.interrupt : Effect.die(Cause.squash(exit.cause)))
          }
          results.push(Result.fail(failure.error as E))
        }
      }
      // The commit itself: atomic, and not interruptible once it starts.
      return yield* Effect.uninterruptible(Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (items.some((item) => options.failCommit?.(item.key) === true)) {
          return Effect.fail(new IdempotencyStore.IdempotencyError({ reason: "Unavailable", message: "commit failed (injected)" }))
        }
        return Effect.gen(function*() {
          for (const [i, item] of items.entries()) {
            const result = results[i]!
            if (first.get(names[i]!) !== i || Result.isFailure(result) || IdempotencyStore.isAlreadyCommitted(result.success)) continue
            committed.add(names[i]!)
            commits.push({ scope: item.key.scope, id: item.key.id, index: order.next(), at: now })
            yield* CurrentDelivery.reportFor(item.key, "Committed")
          }
          return results as ReadonlyArray<Result.Result<A | IdempotencyStore.AlreadyCommitted, E>>
        })
      }))
    })
    return withLocks(names, run)
  }

  const commitAll = <A, E, R>(
    keys: ReadonlyArray<IdempotencyStore.Key>,
    effect: (fresh: ReadonlyArray<number>) => Effect.Effect<A, E, R>
  ): Effect.Effect<ReadonlyArray<A | IdempotencyStore.AlreadyCommitted>, E | IdempotencyStore.IdempotencyError, R> => {
    const malformed = IdempotencyStore.firstKeyProblem(keys, "commitAll")
    if (malformed !== undefined) return Effect.fail(malformed)
    const names = keys.map(nameOf)
    const run = Effect.gen(function*() {
      const seen = new Set<string>()
      const fresh: Array<number> = []
      for (const [i, name] of names.entries()) {
        if (!committed.has(name) && !seen.has(name)) fresh.push(i)
        seen.add(name)
      }
      if (fresh.length === 0) return keys.map(IdempotencyStore.alreadyCommitted)
      const value = yield* effect(fresh)
      return yield* Effect.uninterruptible(Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (fresh.some((i) => options.failCommit?.(keys[i]!) === true)) {
          return Effect.fail(new IdempotencyStore.IdempotencyError({ reason: "Unavailable", message: "commit failed (injected)" }))
        }
        return Effect.gen(function*() {
          for (const i of fresh) {
            committed.add(names[i]!)
            commits.push({ scope: keys[i]!.scope, id: keys[i]!.id, index: order.next(), at: now })
            yield* CurrentDelivery.reportFor(keys[i]!, "Committed")
          }
          const isFresh = new Set(fresh)
          return keys.map((key, i) => (isFresh.has(i) ? value : IdempotencyStore.alreadyCommitted(key)))
        })
      }))
    })
    return withLocks(names, run)
  }

  const service = IdempotencyStore.IdempotencyStore.of({
    commit,
    commitBatch,
    commitAll,
    isCommitted: (key) =>
      Effect.suspend(() => {
        const malformed = IdempotencyStore.keyProblem(key, "isCommitted")
        return malformed === undefined ? Effect.succeed(committed.has(nameOf(key))) : Effect.fail(malformed)
      })
  })
  return {
    service,
    layer: Layer.succeed(IdempotencyStore.IdempotencyStore, service),
    commits: () => commits
  }
}

/**
 * An idempotency store in memory, with the contract of the PostgreSQL one: a commit runs its
 * effect and records its key atomically (the key's effects count only once the effect has
 * succeeded and the commit is recorded), a concurrent commit of the same key waits for the other
 * and is then `AlreadyCommitted` (or proceeds if the other failed), and the store reports both to
 * the current delivery. Every commit is appended to `commits` with a global order, for
 * invariants; `failCommit` injects a failure of the commit itself (its result unknown to the
 * caller, nothing recorded).
 *
 * It deliberately has no durability: it lives as long as the test.
 *
 * @since 0.2.0
 */
import { CurrentDelivery, IdempotencyStore } from "@jetworker/core"
import { Clock, Effect, Layer, Semaphore } from "effect"

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
  readonly clock?: { next: () => number } | undefined
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

  const commit = <A, E, R>(key: IdempotencyStore.Key, effect: Effect.Effect<A, E, R>) => {
    const name = `${key.scope}\u0000${key.id}`
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

  const service = IdempotencyStore.IdempotencyStore.of({
    commit,
    isCommitted: (key) => Effect.sync(() => committed.has(`${key.scope}\u0000${key.id}`))
  })
  return {
    service,
    layer: Layer.succeed(IdempotencyStore.IdempotencyStore, service),
    commits: () => commits
  }
}

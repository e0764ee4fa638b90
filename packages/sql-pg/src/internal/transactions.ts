/**
 * `withTransaction` and `afterCommit` for `PgPipelinedClient`, with the behaviour of
 * `effect/sql`'s `makeWithTransaction` (a top-level transaction, savepoints for nested ones that
 * take turns, rollback on failure or interruption, `afterCommit` callbacks run once the outermost
 * `COMMIT` succeeded, `Reactivity` invalidations deferred to then, `BeginTransaction`) in fewer
 * steps of the runtime: 7 fewer per transaction, of the 72 that `PgIdempotencyStore.commit` takes
 * with `effect/sql`'s (`bench/commit-in-memory.ts`'s count, with this module on its stand-in).
 * What they leave out:
 *
 * - no `sql.transaction` span unless a tracing backend is installed (the native tracer exports
 *   nothing, and its span cost its attributes, events and clock reads per transaction);
 * - a level's `afterCommit` buffer and its savepoints' semaphore live on the level itself (the
 *   value of the transaction service), the semaphore made only when a savepoint is taken, instead
 *   of a `WeakMap` entry and a service per transaction;
 * - `Reactivity`'s deferred form is built once per `Reactivity`, not per transaction.
 *
 * Both must come from here together: a level that `effect/sql` began has no buffer here, and one
 * begun here none there.
 */
import { Clock, Context, Effect, Exit, Scope, Semaphore, Tracer } from "effect"
import type { Reactivity } from "effect/reactivity/Reactivity"
import { Reactivity as ReactivityService } from "effect/reactivity/Reactivity"
import { BeginTransaction, type TransactionConnection } from "effect/sql/SqlClient"
import type { Connection } from "effect/sql/SqlConnection"
import type { SqlError } from "effect/sql/SqlError"

/**
 * The key `effect/sql` gives the innermost transaction's service (internal to it), which
 * `SqlResolver` reads to keep a transaction's requests out of other batches. A test checks that it
 * still is.
 */
export const currentTransactionServiceKey = "effect/sql/CurrentTransactionService"

/** Callbacks registered with `afterCommit` in one level; a committed savepoint hands them up. */
interface AfterCommitBuffer {
  readonly callbacks: Array<Effect.Effect<void>>
  readonly parent: AfterCommitBuffer | undefined
  open: boolean
}

/** The transaction service's value for a level begun here: `[conn, depth]`, and what goes with it. */
type Level<C extends Connection> = readonly [conn: C, depth: number] & {
  readonly buffer: AfterCommitBuffer
  /** Savepoints of this level take turns (made with the first). */
  savepoints: Semaphore.Semaphore | undefined
}

const makeLevel = <C extends Connection>(conn: C, depth: number, buffer: AfterCommitBuffer): Level<C> =>
  Object.assign([conn, depth] as const, { buffer, savepoints: undefined })

/** The innermost level in `services`: begun here, so its connection is the client's kind. */
const levelIn = <C extends Connection>(
  services: Context.Context<never>,
  key: Context.Key<TransactionConnection, TransactionConnection.Service>
) => Context.getOrUndefined(services, key) as Level<C> | undefined

const runAfterCommit = (effect: Effect.Effect<void>): Effect.Effect<void> =>
  Effect.ignoreCause(effect, { log: "Unhandled", message: "Unhandled error in SqlClient.afterCommit callback" })

/** A transaction's span, when a tracing backend is installed, and the clock of its events. */
interface Traced {
  readonly span: Tracer.Span
  readonly clock: Clock.Clock
}

/** What a client's transactions run on (connections of kind `C`), and the statements that begin and end them. */
export interface Options<C extends Connection> {
  readonly transactionService: Context.Service<TransactionConnection, TransactionConnection.Service>
  readonly spanAttributes: ReadonlyArray<readonly [string, unknown]>
  /** A top-level transaction's connection, released when the scope closes. */
  readonly acquire: Effect.Effect<C, SqlError, Scope.Scope>
  /** `statement` is the `BeginTransaction` in effect, if any. */
  readonly begin: (conn: C, statement: string | undefined) => Effect.Effect<void, SqlError>
  readonly commit: (conn: C) => Effect.Effect<void, SqlError>
  /** `exit` is the transaction's effect's failure (or interruption). */
  readonly rollback: (conn: C, exit: Exit.Exit<unknown, unknown>) => Effect.Effect<void, SqlError>
  readonly savepoint: (conn: C, id: number) => Effect.Effect<void, SqlError>
  readonly releaseSavepoint: (conn: C, id: number) => Effect.Effect<void, SqlError>
  readonly rollbackSavepoint: (conn: C, id: number) => Effect.Effect<void, SqlError>
}

/** A client's `withTransaction` and `afterCommit`. */
export const make = <C extends Connection>(options: Options<C>) => {
  const { transactionService } = options

  const afterCommit = <R>(effect: Effect.Effect<void, never, R>): Effect.Effect<void, never, R> =>
    Effect.withFiber((fiber) => {
      const buffer = levelIn(fiber.context, transactionService)?.buffer
      if (buffer === undefined) return runAfterCommit(effect as Effect.Effect<void>)
      for (let current: AfterCommitBuffer | undefined = buffer; current !== undefined; current = current.parent) {
        if (!current.open) return Effect.die(new Error("SqlClient.afterCommit: the transaction has already ended"))
      }
      // Runs later with the services in scope now, without the transaction.
      buffer.callbacks.push(Effect.provideContext(effect, Context.omit(transactionService)(fiber.context) as Context.Context<R>))
      return Effect.void
    })

  let deferredFor: Reactivity | undefined
  let deferred: Reactivity | undefined
  /** `reactivity` with its invalidations run after the commit (the same object for the same one). */
  const deferInvalidations = (reactivity: Reactivity): Reactivity => {
    if (deferredFor !== reactivity) {
      const invalidate = (keys: Parameters<Reactivity["invalidate"]>[0]) =>
        afterCommit(Effect.sync(() => reactivity.invalidateUnsafe(keys)))
      deferred = { ...reactivity, invalidate, mutation: (keys, effect) => Effect.tap(effect, invalidate(keys)) }
      deferredFor = reactivity
    }
    return deferred!
  }

  /** Ends a level: commit (top) or nothing (savepoint) on success, roll back otherwise. */
  const end = (conn: C, id: number, exit: Exit.Exit<unknown, unknown>, traced: Traced | undefined) => {
    let effect: Effect.Effect<void, SqlError>
    if (Exit.isSuccess(exit)) {
      traced?.span.event(id === 0 ? "effect.sql.transaction.commit" : "effect.sql.transaction.savepoint", traced.clock.currentTimeNanosUnsafe())
      effect = id === 0 ? options.commit(conn) : Effect.void
    } else {
      traced?.span.event("effect.sql.transaction.rollback", traced.clock.currentTimeNanosUnsafe())
      // A rollback that fails is a defect, as `effect/sql` makes it; so is a failed release.
      effect = Effect.orDie(id === 0 ? options.rollback(conn, exit) : options.rollbackSavepoint(conn, id))
    }
    return id === 0 ? effect : Effect.andThen(effect, Effect.orDie(options.releaseSavepoint(conn, id)))
  }

  const transaction = <A, E, R>(
    effect: Effect.Effect<A, E, R>,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    traced: Traced | undefined
  ): Effect.Effect<A, E | SqlError, R> =>
    Effect.withFiber((fiber) => {
      const services = fiber.context
      const outer = levelIn<C>(services, transactionService)
      const id = outer === undefined ? 0 : outer[1] + 1
      const buffer: AfterCommitBuffer = { callbacks: [], parent: outer?.buffer, open: true }
      let committed = false
      const run = (conn: C): Effect.Effect<A, E | SqlError, R> =>
        Effect.flatMap(
          id === 0 ? options.begin(conn, fiber.getRef(BeginTransaction)) : options.savepoint(conn, id),
          () => {
            const reactivity = Context.getOrUndefined(services, ReactivityService)
            let context = Context.add(services, transactionService, makeLevel(conn, id, buffer))
            context = Context.addUnsafe(context, currentTransactionServiceKey, transactionService)
            if (reactivity !== undefined) context = Context.add(context, ReactivityService, deferInvalidations(reactivity))
            if (traced !== undefined) context = Context.add(context, Tracer.ParentSpan, traced.span)
            return Effect.onExitPrimitive(
              Effect.provideContext(restore(effect), context as Context.Context<R>),
              (exit) =>
                Effect.map(end(conn, id, exit, traced), () => {
                  committed = Exit.isSuccess(exit)
                }),
              true
            )
          }
        )
      let level: Effect.Effect<A, E | SqlError, R>
      if (outer !== undefined) {
        level = run(outer[0])
      } else {
        const scope = Scope.makeUnsafe()
        level = Effect.onExitPrimitive(
          Effect.flatMap(Scope.provide(restore(options.acquire), scope), run),
          (exit) => Scope.close(scope, exit),
          true
        )
      }
      // Runs once the connection is released, whether or not that succeeded.
      const settled = Effect.onExitPrimitive(level, () => {
        buffer.open = false
        if (!committed || buffer.callbacks.length === 0) return undefined
        if (buffer.parent !== undefined) {
          buffer.parent.callbacks.push(...buffer.callbacks)
          return undefined
        }
        return Effect.forEach(buffer.callbacks, runAfterCommit, { discard: true })
      }, true)
      if (outer === undefined) return settled
      outer.savepoints ??= Semaphore.makeUnsafe(1)
      return outer.savepoints.withPermit(settled)
    })

  const withTransaction = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.withFiber((fiber) =>
        // With no tracing backend nothing reads a span (the native tracer exports nothing).
        Context.get(fiber.context, Tracer.Tracer) === Tracer.nativeTracer
          ? transaction(effect, restore, undefined)
          : Effect.useSpan("sql.transaction", { kind: "internal" }, (span) => {
            for (const [key, value] of options.spanAttributes) span.attribute(key, value)
            return transaction(effect, restore, { span, clock: fiber.getRef(Clock.Clock) })
          })
      )
    )

  return { withTransaction, afterCommit }
}

/**
 * The idempotency store on PostgreSQL (BE-JOB-002). `commit(key, effect)` runs in one
 * transaction: it first inserts the deduplication row `(scope, id)` with
 * `INSERT ... ON CONFLICT DO NOTHING`, then runs `effect` on the same transaction, then commits
 * both together. When the row already exists the effect does not run and the result is
 * `Duplicate`. A concurrent commit of the same key blocks on the primary key until the first
 * transaction ends: it is a `Duplicate` when that one commits and proceeds when it rolls back
 * (PostgreSQL's behaviour under READ COMMITTED), so exactly one commit of a key ever succeeds.
 *
 * For the atomicity to hold, `effect` must write through the same `SqlClient` the store was built
 * with (its statements then join the transaction). Called inside an already open transaction,
 * the row joins that transaction (a savepoint) and commits with it.
 *
 * Errors: the effect's own errors pass through unchanged, even `SqlError`s; a failure of the
 * store's own statements (the dedup insert, `BEGIN`, `COMMIT`) becomes core's `IdempotencyError`,
 * classified by the SQLSTATE PostgreSQL reported: `Unavailable` or `Conflict` (retryable),
 * `Misconfigured`, or `InvalidData` for data the database rejects (a key it cannot store, a
 * constraint violated at `COMMIT`, a data or program error such as a trigger's `RAISE EXCEPTION`),
 * which no retry fixes. A key whose scope or id holds a NUL or is not well-formed Unicode (a lone
 * UTF-16 surrogate, which UTF-8 would turn into U+FFFD so that distinct keys collide) is refused
 * with `InvalidData` before anything is sent, by every operation taking keys (core's
 * `IdempotencyStore.keyProblem`, which the store in memory shares).
 *
 * When the transaction's connection dies under the effect, its `ROLLBACK` fails too (`@effect/sql`
 * makes that a defect); the store still ends with a typed failure, never a defect: the effect's own
 * error when it failed (a dead connection commits nothing, so that error is the truth, as when the
 * rollback succeeds), else `IdempotencyError` `Unavailable`. An interruption stays one.
 *
 * `commitBatch(items)` runs a batch in one transaction: one `INSERT ... SELECT ... FROM unnest(...)
 * ORDER BY scope, id ON CONFLICT DO NOTHING` records every key in key order (so two overlapping
 * batches lock their rows in the same order and wait for each other instead of deadlocking), then
 * each new key's effect runs inside its own savepoint; an effect that fails rolls back to its
 * savepoint and its row is deleted again, so the other elements commit without it. The batch fails
 * as a whole with `IdempotencyError` `Unavailable`, naming the element (and its own error), when an
 * element's savepoint cannot be ended: its connection died, or its effect recovered from a failed
 * SQL statement and succeeded, which leaves PostgreSQL's whole transaction aborted (`RELEASE
 * SAVEPOINT` fails with 25P02; an element's own failure type cannot carry it, so the batch's does;
 * nothing of the batch commits, as for `commit`'s aborted `COMMIT`).
 * `commitAll(keys, effect)` records the keys the same way and runs one `effect` for all the new
 * ones (no savepoints): all or nothing.
 *
 * {@link commitStatement} commits an effect that is a single statement with its row in one round
 * trip, without `BEGIN` and `COMMIT`.
 *
 * It deliberately does not create its table (see `Migrations`; its {@link layer} refuses to build
 * without it), retry, or delete rows on its own: rows stay until {@link purge} removes them, and
 * they must outlive the redelivery horizon.
 *
 * @since 0.1.0
 */
import * as CurrentDelivery from "@jetworker/core/CurrentDelivery"
import {
  alreadyCommitted,
  type AlreadyCommitted,
  type BatchItem,
  IdempotencyError,
  IdempotencyStore,
  firstKeyProblem,
  type Key,
  keyProblem
} from "@jetworker/core/IdempotencyStore"
import * as Probe from "@jetworker/core/Probe"
import { Cause, Context, Duration, Effect, Exit, Layer, Option, Result, Tracer } from "effect"
import { SqlClient, type SqlError, type Statement } from "effect/sql"
import * as DurationInput from "@jetworker/core/DurationInput"
import {
  batchCleanupFailure,
  box,
  classify,
  classifyPurge,
  classifyStatement,
  type DedupTableState,
  failedCleanup,
  reasonOf,
  settle,
  UserFailure
} from "./internal/errors.ts"
import { TransactionConnection, transactionGuard } from "./internal/pipelinedSession.ts"
import * as PurgeLimit from "./internal/purgeLimit.ts"
import * as StatementGuard from "./internal/statementGuard.ts"
import * as Table from "./internal/table.ts"
import { type MissingTable, requireTable } from "./internal/tableCheck.ts"

/** Options of the store. */
export interface Options {
  /**
   * The deduplication table, a lowercase identifier optionally qualified by a schema
   * (`"schema.table"`). It must have the shape the migrations create. Default: `"jetworker_dedup"`.
   */
  readonly table?: string | undefined
}

/** A key as one string; a NUL cannot be stored in a key, so it cannot be ambiguous. */
const keyOf = (key: Key): string => `${key.scope}\u0000${key.id}`

/** The name of the table the store uses when none is given. */
export const defaultTable: string = Table.defaultTable

/**
 * The deduplication table of the store that {@link layer} provides, beside it: what
 * {@link commitStatement} uses when it is not given a table, so that `commit` and
 * `commitStatement` record keys in one table. Default: {@link defaultTable}.
 *
 * @since 0.1.0
 */
export const DedupTable = Context.Reference<string>("@jetworker/sql-pg/PgIdempotencyStore/DedupTable", {
  defaultValue: () => Table.defaultTable
})

const resolveTable = (table: string | undefined): Effect.Effect<string, IdempotencyError> => {
  const name = table ?? Table.defaultTable
  const quoted = Table.quote(name)
  return quoted === undefined
    ? Effect.fail(new IdempotencyError({ reason: "Misconfigured", message: Table.invalidMessage(name, "idempotency") }))
    : Effect.succeed(quoted)
}

/**
 * Reports `Committed` for `keys` once the outermost transaction of `sql` commits (at once outside
 * a transaction): one callback for all of them, which holds the reporters it calls and nothing
 * else. Why so lean: `afterCommit` keeps each callback with a copy of the context it was
 * registered in, and a transaction that outlives a scavenge keeps them until a full collection
 * (they hang off a `WeakMap` entry whose key, the transaction, was promoted). Registered in the
 * handler's context, the copy held the delivery's services and spans, and V8 promoted them all
 * with it. So the callback is registered in a context holding the transaction's entry alone
 * (`setContext`; `provideContext` would merge it into the handler's).
 */
const reportCommitted = (sql: SqlClient.SqlClient, keys: ReadonlyArray<Key>): Effect.Effect<void> =>
  Effect.withFiber((fiber) => {
    const report = CurrentDelivery.reporterIn(fiber.context, keys, "Committed")
    if (report === undefined) return Effect.void
    const transaction = Context.getOrUndefined(fiber.context, sql.transactionService)
    if (transaction === undefined) return Effect.sync(report)
    return Effect.setContext(sql.afterCommit(Effect.sync(report)), Context.make(sql.transactionService, transaction))
  })

/** Builds the store on the current `SqlClient`; fails with `Misconfigured` when the table name is invalid. */
export const make: (options?: Options) => Effect.Effect<
  IdempotencyStore["Service"],
  IdempotencyError,
  SqlClient.SqlClient
> = Effect.fnUntraced(function*(options?: Options) {
  const table = yield* resolveTable(options?.table)
  const sql = yield* SqlClient.SqlClient
  // Built once: each call only binds its two parameters (and the text's prepared statement is cached).
  const insertText =
    `INSERT INTO ${table} (scope, id) VALUES ($1, $2) ON CONFLICT (scope, id) DO NOTHING RETURNING true AS inserted`
  // The same row as a transaction's first statement on `PgPipelinedClient`, sent with its BEGIN.
  const insertFirstText = `INSERT INTO ${table} (scope, id) SELECT $1, $2 WHERE ${transactionGuard} ` +
    `ON CONFLICT (scope, id) DO NOTHING RETURNING true AS inserted`
  const selectText = `SELECT true AS found FROM ${table} WHERE scope = $1 AND id = $2`
  const insertManyText = `INSERT INTO ${table} (scope, id) SELECT s, k FROM unnest($1::text[], $2::text[]) AS u(s, k) ` +
    `ORDER BY s, k ON CONFLICT (scope, id) DO NOTHING RETURNING scope, id`
  const deleteText = `DELETE FROM ${table} WHERE scope = $1 AND id = $2`
  const settled = settle(table)
  /** `attempt` in a transaction, ended with the typed cause {@link settle} makes of a failure. */
  const inTransaction = <A, E, R>(attempt: Effect.Effect<A, UserFailure<E> | SqlError.SqlError | IdempotencyError, R>) =>
    Effect.catchCause(sql.withTransaction(attempt), (cause) => Effect.failCause(settled(cause)))

  const beforeCommit = (key: Key): Effect.Effect<void> =>
    Effect.flatMap(Effect.serviceOption(CurrentDelivery.CurrentDelivery), (delivery) =>
      Probe.hit({
        point: "before-commit",
        consumer: key.scope,
        sequence: Option.isSome(delivery) ? delivery.value.sequence : -1,
        eventId: key.id
      }))

  /**
   * The dedup row's statement, inside the commit's transaction. With no tracing backend (the
   * native tracer, which exports nothing) it goes straight to the transaction's connection: a
   * `Statement` would build a span, its attributes and a scope that nothing reads (4 of the 30 µs
   * a commit costs over a connection that answers at once). With a tracer installed it stays a
   * statement, with its span. Either way its rows are read as they come (no row transform). As
   * the first statement of a `PgPipelinedClient` transaction it leaves with the transaction's
   * BEGIN, in one round trip, traced or not (the connection records the same span).
   */
  const insertRow = (key: Key): Effect.Effect<ReadonlyArray<{ readonly inserted: boolean }>, SqlError.SqlError> =>
    Effect.withFiber((fiber) => {
      const transaction = Context.getOrUndefined(fiber.context, sql.transactionService)
      if (transaction === undefined) return sql.unsafe<{ readonly inserted: boolean }>(insertText, [key.scope, key.id])
      const connection = transaction[0]
      const traced = Context.get(fiber.context, Tracer.Tracer) !== Tracer.nativeTracer
      // Traced or not: it records the statement's span itself.
      if (transaction[1] === 0 && connection instanceof TransactionConnection && connection.canPipelineFirst) {
        return connection.executeFirst(insertFirstText, insertText, [key.scope, key.id], traced) as Effect.Effect<
          ReadonlyArray<{ readonly inserted: boolean }>,
          SqlError.SqlError
        >
      }
      if (traced) {
        return sql.unsafe<{ readonly inserted: boolean }>(insertText, [key.scope, key.id])
      }
      return connection.execute(insertText, [key.scope, key.id], undefined) as Effect.Effect<
        ReadonlyArray<{ readonly inserted: boolean }>,
        SqlError.SqlError
      >
    })

  const commit = <A, E, R>(
    key: Key,
    effect: Effect.Effect<A, E, R>
  ): Effect.Effect<A | AlreadyCommitted, E | IdempotencyError, R> =>
    Effect.withFiber((fiber) => {
      const malformed = keyProblem(key, "commit")
      if (malformed !== undefined) return Effect.fail(malformed)
      // The probe point only when a probe watches (tests, diagnostics): it is read per commit.
      const boxed = Effect.mapError(effect, box)
      const protectedEffect: Effect.Effect<A, UserFailure<E>, R> = fiber.getRef(Probe.Probe) === Probe.noop
        ? boxed
        : Effect.tap(boxed, () => beforeCommit(key))
      const attempt = Effect.flatMap(
        insertRow(key),
        (rows): Effect.Effect<A | AlreadyCommitted, UserFailure<E>, R> =>
          rows.length === 0
            ? Effect.as(CurrentDelivery.reportFor(key, "AlreadyCommitted"), alreadyCommitted(key))
            : Effect.andThen(
              // Runs after the outermost COMMIT succeeded, even if the fiber was interrupted while
              // it ran: the engine then reports the truth (committed), not a rollback. (`onExit`
              // around the transaction would not do: the interruption lands as the transaction's
              // uninterruptible region ends, before `onExit` could see its success.)
              reportCommitted(sql, [key]),
              protectedEffect
            )
      )
      return inTransaction(attempt)
    })

  /** Records every key not yet recorded, in one statement in key order; returns those it recorded (`keyOf`). */
  const insertKeys = (keys: ReadonlyArray<Key>) =>
    Effect.map(
      sql.unsafe<{ readonly scope: string; readonly id: string }>(insertManyText, [keys.map((key) => key.scope), keys.map((key) => key.id)]),
      (rows) => new Set(rows.map(keyOf))
    )

  const commitBatch = <A, E, R>(
    items: ReadonlyArray<BatchItem<A, E, R>>
  ): Effect.Effect<ReadonlyArray<Result.Result<A | AlreadyCommitted, E>>, IdempotencyError, R> => {
    if (items.length === 0) return Effect.succeed([])
    const keys = items.map((item) => item.key)
    const malformed = firstKeyProblem(keys, "commitBatch")
    if (malformed !== undefined) return Effect.fail(malformed)
    const attempt = Effect.gen(function*() {
      const inserted = yield* insertKeys(keys)
      // A key given twice runs once: the later copy shares the first one's fate.
      const first = new Map<string, number>()
      const results: Array<Result.Result<A | AlreadyCommitted, E>> = []
      const committed: Array<Key> = []
      for (const [i, item] of items.entries()) {
        const key = keyOf(item.key)
        const earlier = first.get(key)
        if (earlier !== undefined) {
          const result = results[earlier]!
          results.push(Result.isFailure(result) ? result : Result.succeed(alreadyCommitted(item.key)))
          continue
        }
        first.set(key, i)
        if (!inserted.has(key)) {
          results.push(Result.succeed(alreadyCommitted(item.key)))
          continue
        }
        // A savepoint per element (a nested transaction): its failure undoes its own writes only.
        let succeeded = false
        const exit = yield* Effect.exit(sql.withTransaction(Effect.mapError(
          Effect.map(item.effect, (value) => {
            succeeded = true
            return value
          }),
          box
        )))
        if (Exit.isSuccess(exit)) {
          committed.push(item.key)
          results.push(Result.succeed(exit.value))
          continue
        }
        const failure = Cause.findErrorOption(exit.cause)
        if (Option.isSome(failure) && failure.value instanceof UserFailure && !Cause.hasInterrupts(exit.cause) && !Cause.hasDies(exit.cause)) {
          yield* sql.unsafe(deleteText, [item.key.scope, item.key.id])
          results.push(Result.fail(failure.value.error as E))
          continue
        }
        // The savepoint itself failed, or an effect died or was interrupted: the whole batch fails.
        if (Option.isSome(failure) && !(failure.value instanceof UserFailure)) return yield* Effect.fail(failure.value)
        // Its rollback or release failed (the connection died, or the effect recovered from a failed
        // statement, which aborted the transaction): the transaction is lost, typed as such.
        const cleanup = failedCleanup(exit.cause, succeeded)
        if (cleanup !== undefined) return yield* Effect.fail(batchCleanupFailure(item.key, cleanup, table))
        return yield* (Cause.hasInterrupts(exit.cause) ? Effect.interrupt : Effect.die(Cause.squash(exit.cause)))
      }
      // The elements that committed their savepoint, once the batch's transaction commits.
      if (committed.length > 0) yield* reportCommitted(sql, committed)
      yield* beforeCommit(items[0]!.key)
      return results
    })
    return inTransaction(attempt)
  }

  const commitAll = <A, E, R>(
    keys: ReadonlyArray<Key>,
    effect: (fresh: ReadonlyArray<number>) => Effect.Effect<A, E, R>
  ): Effect.Effect<ReadonlyArray<A | AlreadyCommitted>, E | IdempotencyError, R> => {
    if (keys.length === 0) return Effect.succeed([])
    const malformed = firstKeyProblem(keys, "commitAll")
    if (malformed !== undefined) return Effect.fail(malformed)
    // Without a generator: one suspended across the statements' round trips is the kind V8
    // promotes with everything it last held (see docs/performance-log.md).
    const attempt = Effect.flatMap(insertKeys(keys), (inserted): Effect.Effect<ReadonlyArray<A | AlreadyCommitted>, UserFailure<E> | SqlError.SqlError, R> => {
      const fresh: Array<number> = []
      for (const [i, key] of keys.entries()) {
        // `delete`: a key given twice is fresh once.
        if (inserted.delete(keyOf(key))) fresh.push(i)
      }
      if (fresh.length === 0) return Effect.succeed(keys.map(alreadyCommitted))
      return Effect.flatMap(Effect.mapError(effect(fresh), box), (value) =>
        reportCommitted(sql, fresh.map((i) => keys[i]!)).pipe(
          Effect.andThen(beforeCommit(keys[fresh[0]!]!)),
          Effect.map(() => {
            const isFresh = new Set(fresh)
            return keys.map((key, i) => (isFresh.has(i) ? value : alreadyCommitted(key)))
          })
        ))
    })
    return inTransaction(attempt)
  }

  const isCommitted = (key: Key): Effect.Effect<boolean, IdempotencyError> => {
    const malformed = keyProblem(key, "isCommitted")
    if (malformed !== undefined) return Effect.fail(malformed)
    return sql.unsafe<{ readonly found: boolean }>(selectText, [key.scope, key.id]).pipe(
      Effect.map((rows) => rows.length > 0),
      Effect.mapError((error) => classify(error, table))
    )
  }

  return IdempotencyStore.of({ commit, commitBatch, commitAll, isCommitted })
})

/**
 * The store as a layer over the current `SqlClient`, with its table as {@link DedupTable}. Building
 * it fails with `Misconfigured` when the table name is invalid, and with `Migrations.MissingTable`
 * when the table does not exist (the migrations have not run on this database and schema: run
 * them first, or provide `Migrations.layer` beneath this layer), so that a worker refuses to
 * start instead of dead-lettering every message. The check is one bounded query: a database that
 * cannot be reached fails it with its `SqlError` (waited for while a worker starts), never as a
 * missing table. {@link make} checks nothing.
 */
export const layer = (
  options?: Options
): Layer.Layer<IdempotencyStore, IdempotencyError | MissingTable | SqlError.SqlError, SqlClient.SqlClient> =>
  Layer.merge(
    Layer.effect(IdempotencyStore, Effect.tap(make(options), () => requireTable(options?.table ?? Table.defaultTable, "idempotency"))),
    Layer.succeed(DedupTable, options?.table ?? Table.defaultTable)
  )

/**
 * Commits an effect that is one data-modifying statement (`INSERT`, `UPDATE` or `DELETE`) together
 * with the deduplication row of `key`, in a single statement: one round trip to PostgreSQL instead
 * of four (`BEGIN`, the row, the effect, `COMMIT`). The statement is built by `statement(fresh)`,
 * and must be guarded by `fresh`, a condition true only when this call recorded `key`:
 *
 * ```ts
 * import { PgIdempotencyStore } from "@jetworker/sql-pg"
 * import { Effect } from "effect"
 * import { SqlClient } from "effect/sql"
 *
 * const ship = (event: { readonly id: string; readonly data: { readonly orderId: string; readonly sku: string } }) =>
 *   Effect.gen(function*() {
 *     const sql = yield* SqlClient.SqlClient
 *     return yield* PgIdempotencyStore.commitStatement({ scope: "shipper", id: event.id }, (fresh) =>
 *       sql`INSERT INTO shipments (order_id, sku) SELECT ${event.data.orderId}, ${event.data.sku} WHERE ${fresh}`)
 *   })
 * ```
 *
 * It runs as `WITH fresh AS (INSERT <row> ON CONFLICT DO NOTHING RETURNING 1), effect AS
 * (<statement>) SELECT ...`: one statement is one atomic commit, so the row and the effect are
 * committed together or not at all, and a concurrent commit of the same key waits for the other
 * and then finds the row (its guard is false), exactly as {@link make}'s `commit`. Inside an open
 * transaction it joins that transaction. Like `commit`, it reports `Committed` or
 * `AlreadyCommitted` to the current delivery, so the outcome is `Committed` or `Duplicate`.
 *
 * Its table is `options.table`, else the table of the store {@link layer} provides
 * ({@link DedupTable}), so it shares its keys with that store's `commit`.
 *
 * A statement that does not use `fresh` is refused (`Misconfigured`) before anything is sent: it
 * would repeat its effect on every redelivery. So is one that does not begin with `INSERT`, `UPDATE`
 * or `DELETE` (after whitespace and comments, nested block comments read as PostgreSQL reads them),
 * a `SELECT` of a function that writes included: PostgreSQL skips a read-only `WITH` query that
 * nothing reads, so its effect would never run while the key was recorded. So is one whose `fresh`
 * stands inside a comment or quoted text, one whose parentheses do not balance outside comments
 * and quoted text (a `)` too many would close its `WITH` query and run what follows unguarded), and
 * one that ends inside a comment or quoted text. Any failure, the statement's own included (a
 * violated constraint is `InvalidData`), is an `IdempotencyError` classified as for `commit`; a
 * `Misconfigured` one names the statement as at fault when a probe of the dedup table (bounded, on
 * the failure path only) finds the table usable, and says to run the migrations when it does not.
 * There is no `before-commit` probe point: nothing runs between the effect and its commit.
 *
 * Interrupted outside a transaction (a handler timeout, a shutdown), it waits for the driver to
 * drain the statement and then looks the key up (bounded, 2 seconds): found, it reports
 * `Committed`, as `commit` does for a `COMMIT` that succeeded under an interruption, so the engine
 * ends the delivery `Committed` (ack withheld) instead of counting a failed attempt.
 */
export const commitStatement = (
  key: Key,
  statement: (fresh: Statement.Fragment) => Statement.Fragment,
  options?: Options
): Effect.Effect<void | AlreadyCommitted, IdempotencyError, SqlClient.SqlClient> =>
  // Read from the fiber's context, without a generator: it runs on every commit.
  Effect.withFiber((fiber): Effect.Effect<void | AlreadyCommitted, IdempotencyError> => {
    const malformed = keyProblem(key, "commitStatement")
    if (malformed !== undefined) return Effect.fail(malformed)
    const name = options?.table ?? fiber.getRef(DedupTable)
    const table = Table.quote(name)
    if (table === undefined) {
      return Effect.fail(new IdempotencyError({ reason: "Misconfigured", message: Table.invalidMessage(name, "idempotency") }))
    }
    const sql = Context.getUnsafe(fiber.context, SqlClient.SqlClient)
    const fresh = sql.literal("EXISTS (SELECT 1 FROM jetworker_fresh)")
    const effect = statement(fresh)
    // PostgreSQL runs a data-modifying WITH query exactly once, and skips a read-only one that
    // nothing reads: a `SELECT` (even of a function that writes) would record the row alone. And
    // the statement must stay inside its WITH query, with its guard in code (see StatementGuard).
    // Interpolation copies segments by reference: the guard is its segment.
    const problem = StatementGuard.problem(effect.segments, fresh.segments[0]!)
    if (problem !== undefined) {
      return Effect.fail(new IdempotencyError({ reason: "Misconfigured", message: StatementGuard.message(problem) }))
    }
    const committed = Effect.flatMap(
      sql<{ readonly inserted: boolean }>`WITH jetworker_fresh AS (
  INSERT INTO ${sql.literal(table)} (scope, id) VALUES (${key.scope}, ${key.id}) ON CONFLICT (scope, id) DO NOTHING RETURNING 1
), jetworker_effect AS (${effect}
)
SELECT EXISTS (SELECT 1 FROM jetworker_fresh) AS inserted`,
      (rows): Effect.Effect<void | AlreadyCommitted> =>
        rows[0]?.inserted === true
          // At once, or once an enclosing transaction commits.
          ? Effect.as(reportCommitted(sql, [key]), undefined)
          : Effect.as(CurrentDelivery.reportFor(key, "AlreadyCommitted"), alreadyCommitted(key))
    )
    // The statement and its report in one region, so that an interruption landing anywhere in it
    // (even between the reply and the report) looks for the key.
    const inTransaction = Context.getOrUndefined(fiber.context, sql.transactionService) !== undefined
    return Effect.catchCause(
      Effect.onExitPrimitive(committed, (exit) =>
        !inTransaction && Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause) ? reportIfCommitted(sql, key, table) : undefined),
      (cause) => statementFailed(sql, table, cause)
    )
  })

/** How long a failed {@link commitStatement} probes its dedup table before it words its error without knowing. */
const tableProbe = Duration.seconds(2)

/**
 * The failure of {@link commitStatement}'s statement, classified. A `Misconfigured` one may be the
 * user's statement's (an undefined table, a privilege) or the dedup table's, in one statement and
 * with one SQLSTATE: a bounded probe of the dedup row's insert alone (`EXPLAIN`, which plans it,
 * checking the table, its columns, its key and the privilege, and writes nothing), outside any
 * transaction (one the failure aborted would refuse it), tells which, so that a statement's own
 * error is not worded as a missing dedup table.
 */
const statementFailed = (
  sql: SqlClient.SqlClient,
  table: string,
  cause: Cause.Cause<SqlError.SqlError>
): Effect.Effect<never, IdempotencyError> => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isNone(failure) || reasonOf(failure.value, table) !== "Misconfigured") {
    return Effect.failCause(Cause.map(cause, (error) => classify(error, table)))
  }
  const probe = sql.unsafe(`EXPLAIN INSERT INTO ${table} (scope, id) VALUES ('', '') ON CONFLICT (scope, id) DO NOTHING`).pipe(
    Effect.timeoutOption(tableProbe),
    Effect.map((done): DedupTableState => Option.isSome(done) ? "usable" : "unknown"),
    Effect.catch((error) => Effect.succeed<DedupTableState>(reasonOf(error, table) === "Misconfigured" ? "unusable" : "unknown")),
    Effect.updateContext((context: Context.Context<never>) => Context.omit(sql.transactionService)(context))
  )
  return Effect.flatMap(probe, (state) => Effect.failCause(Cause.map(cause, (error) => classifyStatement(error, table, state))))
}

/** How long an interrupted {@link commitStatement} looks for its key before it gives up reporting. */
const interruptedLookup = Duration.seconds(2)

/**
 * Reports `Committed` when `key` is recorded: what {@link commitStatement} does when it was
 * interrupted outside a transaction (a handler timeout, a shutdown). Its statement may have
 * committed before the reply came, and the driver drains the statement before the interruption
 * ends, so by now the key is recorded if it ever will be. Like `commit`, which reports a `COMMIT`
 * that succeeded under an interruption, it tells the engine the truth, so an applied event is not
 * counted as a failed attempt (nor dead-lettered on the last one). A row of an earlier delivery
 * looks the same; the event is applied either way. The look is bounded (and a failed one reports
 * nothing, as before); it runs as a finalizer, so uninterruptibly. Inside a transaction the
 * interruption rolls the statement back with it: nothing to look for.
 */
const reportIfCommitted = (sql: SqlClient.SqlClient, key: Key, table: string): Effect.Effect<void> =>
  sql.unsafe<{ readonly found: boolean }>(`SELECT true AS found FROM ${table} WHERE scope = $1 AND id = $2`, [key.scope, key.id]).pipe(
    Effect.timeoutOption(interruptedLookup),
    Effect.flatMap((rows) => Option.isSome(rows) && rows.value.length > 0 ? CurrentDelivery.reportFor(key, "Committed") : Effect.void),
    Effect.ignore
  )

/** Options of {@link purge}. */
export interface PurgeOptions {
  /** Delete rows committed longer ago than this, measured by the database's clock; finite and not negative. */
  readonly olderThan: Duration.Input
  /** The most rows one call deletes, an integer from 1 to 2147483647 (PostgreSQL's `integer`), which bounds its locks and its time. */
  readonly limit: number
  /** The deduplication table. Default: `"jetworker_dedup"`. */
  readonly table?: string | undefined
}

/**
 * Deletes at most `limit` deduplication rows committed more than `olderThan` ago and returns how
 * many it deleted. Choose `olderThan` longer than the longest time an event can still arrive
 * (redelivery, dead-letter replay, producer republish): a purged key is no longer a duplicate.
 * Rows locked by a running transaction are skipped, so it never waits on live commits.
 *
 * Fails with `IdempotencyError` `Misconfigured`, before any statement, when `olderThan` is not a
 * finite, non-negative duration (a NaN included, which would otherwise read as zero and purge
 * every row) or `limit` is not an integer from 1 to 2147483647; a statement that fails
 * is classified like the store's own, with a message about the purge.
 */
export const purge = (options: PurgeOptions): Effect.Effect<number, IdempotencyError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const table = yield* resolveTable(options.table)
    const olderThan = DurationInput.parse(options.olderThan)
    if (olderThan === undefined || !Duration.isFinite(olderThan) || Duration.isNegative(olderThan)) {
      return yield* new IdempotencyError({
        reason: "Misconfigured",
        message: `purge: olderThan must be a finite, non-negative duration such as "30 days", got ${DurationInput.show(options.olderThan)}`
      })
    }
    const limitProblem = PurgeLimit.problem(options.limit)
    if (limitProblem !== undefined) return yield* new IdempotencyError({ reason: "Misconfigured", message: limitProblem })
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql.unsafe<{ readonly deleted: number }>(
      `WITH doomed AS (
  SELECT scope, id FROM ${table}
  WHERE committed_at < now() - make_interval(secs => $1::double precision)
  ORDER BY committed_at
  LIMIT $2::integer
  FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM ${table} AS t USING doomed WHERE t.scope = doomed.scope AND t.id = doomed.id RETURNING 1
)
SELECT count(*)::integer AS deleted FROM deleted`,
      [Duration.toMillis(olderThan) / 1000, options.limit]
    ).pipe(Effect.mapError((error) => classifyPurge(error, table)))
    return rows[0]?.deleted ?? 0
  })

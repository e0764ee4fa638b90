/**
 * `PgPipelinedClient`'s transactions (its own `withTransaction` and `afterCommit`, in fewer steps
 * of the runtime than `effect/sql`'s) behave as `@effect/sql-pg`'s `PgClient`'s: each scenario runs
 * on both clients and must give what is expected on each. Covered: `afterCommit` after
 * the outermost `COMMIT` only, handed up by a committed savepoint and dropped by a failed one,
 * refused once its transaction ended; `Reactivity` invalidations deferred to the commit;
 * savepoints of several fibers taking turns; the transaction `SqlResolver` sees; the
 * `sql.transaction` span with a tracing backend, and its statements' spans beneath it.
 */
import { assert, layer } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Option, type Tracer } from "effect"
import * as Reactivity from "effect/reactivity/Reactivity"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as SpanLog from "../../testing/src/SpanLog.ts"
import { currentTransactionServiceKey } from "../src/internal/transactions.ts"
import { clientKinds, database, ledgerRows, record } from "./support.ts"

/** What one client did in the scenarios, compared across clients. */
type Seen = Record<string, unknown>

const scenarios = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const seen: Seen = {}

  // afterCommit: after the outermost COMMIT, when the row is visible to others; a committed
  // savepoint's callbacks wait for it, a failed savepoint's never run.
  const note = randomUUID()
  const order: Array<string> = []
  const observed: Array<number> = []
  yield* sql.withTransaction(Effect.gen(function*() {
    yield* record(note)
    yield* sql.afterCommit(Effect.andThen(Effect.orDie(ledgerRows(note)), (rows) => Effect.sync(() => {
      order.push("outer")
      observed.push(rows)
    })))
    yield* sql.withTransaction(sql.afterCommit(Effect.sync(() => order.push("kept savepoint"))))
    yield* Effect.exit(sql.withTransaction(
      Effect.andThen(sql.afterCommit(Effect.sync(() => order.push("failed savepoint"))), Effect.fail("inner"))
    ))
    order.push("body done")
  }))
  seen.afterCommitOrder = order
  seen.rowsSeenAfterCommit = observed
  const rolledBack: Array<string> = []
  yield* Effect.exit(sql.withTransaction(Effect.andThen(sql.afterCommit(Effect.sync(() => rolledBack.push("ran"))), Effect.fail("no"))))
  seen.afterRollback = rolledBack

  // afterCommit from a fiber that outlived its transaction: refused as a defect.
  const ended = yield* Deferred.make<void>()
  const late = yield* sql.withTransaction(
    Effect.forkDetach(Effect.andThen(Deferred.await(ended), sql.afterCommit(Effect.void)))
  )
  yield* Deferred.succeed(ended, undefined)
  const lateExit = yield* Fiber.await(late)
  seen.lateAfterCommit = Exit.isFailure(lateExit) && String(lateExit.cause).includes("already ended")

  // Reactivity: an invalidation inside a transaction is deferred to its commit, and dropped on rollback.
  const reactivity = yield* Reactivity.Reactivity
  const invalidations: Array<string> = []
  const key = randomUUID()
  const unregister = reactivity.registerUnsafe([key], () => invalidations.push("invalidated"))
  yield* sql.withTransaction(Effect.gen(function*() {
    yield* Reactivity.invalidate([key])
    invalidations.push("body done")
  }))
  yield* Effect.exit(sql.withTransaction(Effect.andThen(Reactivity.invalidate([key]), Effect.fail("no"))))
  unregister()
  seen.invalidations = invalidations

  // Savepoints of several fibers take turns: the failing one takes only its own row.
  const turns = randomUUID()
  yield* sql.withTransaction(Effect.all(
    [0, 1, 2, 3].map((i) =>
      Effect.exit(sql.withTransaction(Effect.andThen(record(turns), i === 2 ? Effect.fail("this one") : Effect.void)))
    ),
    { concurrency: "unbounded" }
  ))
  seen.rowsOfSavepointsTakingTurns = yield* ledgerRows(turns)

  // The transaction SqlResolver reads: the client's, inside; none outside.
  const currentService = Context.Reference<unknown>(currentTransactionServiceKey, { defaultValue: () => undefined })
  seen.currentTransactionService = yield* sql.withTransaction(Effect.map(
    Effect.context<never>(),
    (context) => Context.get(context, currentService) === sql.transactionService
  ))
  seen.currentTransactionServiceOutside = yield* Effect.map(Effect.context<never>(), (context) => Context.get(context, currentService))

  // With a tracing backend: the transaction's span, its events, and its statements beneath it.
  const log = yield* SpanLog.make
  yield* Effect.exit(sql.withTransaction(Effect.andThen(
    Effect.andThen(sql`SELECT 1`, Effect.exit(sql.withTransaction(Effect.andThen(sql`SELECT 2`, Effect.fail("inner"))))),
    Effect.fail("outer")
  )).pipe(Effect.withTracer(log.tracer)))
  yield* sql.withTransaction(sql`SELECT 3`).pipe(Effect.withTracer(log.tracer))
  const spans = yield* log.all
  const transactions: ReadonlyArray<Tracer.AnySpan> = spans.filter((span) => span.name === "sql.transaction")
  const parentOf = (span: Tracer.NativeSpan) => Option.match(span.parent, { onNone: () => "none", onSome: (parent) => transactions.indexOf(parent) })
  seen.transactionSpans = transactions.map((span) => ({
    events: (span as Tracer.NativeSpan).events.map(([name]) => name),
    system: (span as Tracer.NativeSpan).attributes.get("db.system.name"),
    parent: parentOf(span as Tracer.NativeSpan)
  }))
  seen.statementParents = spans.filter((span) => span.name !== "sql.transaction").map(parentOf)
  return seen
})

const expected: Seen = {
  afterCommitOrder: ["body done", "outer", "kept savepoint"],
  rowsSeenAfterCommit: [1],
  afterRollback: [],
  lateAfterCommit: true,
  invalidations: ["body done", "invalidated"],
  rowsOfSavepointsTakingTurns: 3,
  currentTransactionService: true,
  currentTransactionServiceOutside: undefined,
  transactionSpans: [
    { events: ["effect.sql.transaction.rollback"], system: "postgresql", parent: "none" },
    { events: ["effect.sql.transaction.rollback"], system: "postgresql", parent: 0 },
    { events: ["effect.sql.transaction.commit"], system: "postgresql", parent: "none" }
  ],
  statementParents: [0, 1, 2]
}

for (const client of clientKinds) {
  layer(database(client), { excludeTestServices: true })(`transactions on ${client}`, (it) => {
    it.effect("afterCommit, Reactivity, savepoints taking turns, SqlResolver's transaction and spans behave as expected", () =>
      Effect.gen(function*() {
        const seen = yield* Effect.provide(scenarios, Reactivity.layer)
        assert.deepStrictEqual(seen, expected)
      }))
  })
}

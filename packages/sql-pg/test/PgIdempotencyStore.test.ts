import { assert, describe, it, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { CurrentDelivery } from "@jetworker/core/CurrentDelivery"
import { commit, IdempotencyError, IdempotencyStore, isDuplicate, type Key } from "@jetworker/core/IdempotencyStore"
import * as Probe from "@jetworker/core/Probe"
import { Data, Deferred, Effect, Exit, Fiber, Layer, Option, Redacted, Ref } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import * as SqlErrors from "effect/sql/SqlError"
import { randomUUID } from "node:crypto"
import * as SpanLog from "../../testing/src/SpanLog.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import { classify, reasonForSqlState, sqlState, sqlStateReasons } from "../src/internal/errors.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import {
  awaitLockWaiters,
  awaitNoLockWaiters,
  backendPid,
  clientKinds,
  database,
  dedupRows,
  ledgerRows,
  Observer,
  pollUntil,
  record
} from "./support.ts"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

/** A key no other test uses. */
const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

/** Fails the test (bounded) when `fiber` does not finish in time. */
const joinWithin = <A, E>(fiber: Fiber.Fiber<A, E>) => Effect.timeout(Fiber.join(fiber), "5 seconds")

/**
 * Starts a commit of `key` whose effect writes `note`, reports its backend pid, then waits for
 * `release` before it ends (with `outcome`): a transaction holding the uncommitted dedup row.
 */
const holdKey = Effect.fnUntraced(function*(key: Key, note: string, outcome: Effect.Effect<string, Boom>) {
  const store = yield* IdempotencyStore
  const inside = yield* Deferred.make<number>()
  const release = yield* Deferred.make<void>()
  const fiber = yield* Effect.forkChild(store.commit(
    key,
    Effect.gen(function*() {
      yield* record(note)
      yield* Deferred.succeed(inside, yield* backendPid)
      yield* Deferred.await(release)
      return yield* outcome
    })
  ))
  const pid = yield* Effect.timeout(Deferred.await(inside), "5 seconds")
  return { fiber, pid, release: Deferred.succeed(release, undefined) } as const
})

// `excludeTestServices`: these tests do real I/O, so they run on the live clock (bounded waits
// with Effect.timeout need it), like `it.live`.
for (const client of clientKinds) {
layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database(client)),
  { excludeTestServices: true }
)(`PgIdempotencyStore on ${client}`, (it) => {
  it.effect("BE-JOB-002: atomicity of deduplication: a commit records the dedup row and the effect in one transaction", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const seen = yield* Ref.make<ReadonlyArray<number>>([])
      // At before-commit both writes are done but, seen from another connection, neither exists yet.
      const probe: Probe.ProbeShape = {
        hit: () =>
          Effect.flatMap(
            Effect.all([dedupRows(key), ledgerRows(key.id)]),
            ([dedup, ledger]) => Ref.set(seen, [dedup, ledger])
          ).pipe(Effect.orDie, Effect.provideService(Observer, observer))
      }
      const observer = yield* Observer
      const result = yield* store.commit(key, Effect.as(record(key.id), "done")).pipe(
        Effect.provideService(Probe.Probe, probe)
      )
      assert.strictEqual(result, "done")
      assert.deepStrictEqual(yield* Ref.get(seen), [0, 0])
      assert.strictEqual(yield* dedupRows(key), 1)
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      assert.isTrue(yield* store.isCommitted(key))
    }))

  it.effect("BE-JOB-002: atomicity of deduplication: a failing effect leaves neither the dedup row nor its writes, and the key stays free", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const boom = new Boom({ message: "transfer rejected" })
      const error = yield* Effect.flip(store.commit(key, Effect.andThen(record(key.id), Effect.fail(boom))))
      assert.strictEqual(error, boom)
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      assert.isFalse(yield* store.isCommitted(key))
      // A redelivery after the failure is not a duplicate: it runs and commits.
      assert.strictEqual(yield* store.commit(key, Effect.as(record(key.id), "retried")), "retried")
      assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))

  it.effect("BE-JOB-002: a duplicate commit has no effect and returns Duplicate", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const runs = yield* Ref.make(0)
      const effect = Effect.andThen(Ref.update(runs, (n) => n + 1), Effect.as(record(key.id), "applied"))
      assert.strictEqual(yield* store.commit(key, effect), "applied")
      const second = yield* store.commit(key, effect)
      assert.isTrue(isDuplicate(second))
      assert.deepStrictEqual(isDuplicate(second) ? second.key : undefined, key)
      assert.strictEqual(yield* Ref.get(runs), 1)
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      assert.strictEqual(yield* dedupRows(key), 1)
    }))

  it.effect("BE-JOB-002: a concurrent duplicate waits on the first transaction and is Duplicate when it commits", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const first = yield* holdKey(key, `${key.id}/first`, Effect.succeed("first"))
      const secondRan = yield* Ref.make(false)
      const second = yield* Effect.forkChild(
        store.commit(key, Effect.andThen(Ref.set(secondRan, true), Effect.as(record(`${key.id}/second`), "second")))
      )
      // The second commit's INSERT is blocked by the first transaction, as PostgreSQL reports it.
      const [waiter] = yield* awaitLockWaiters(first.pid)
      assert.strictEqual(waiter!.waitEvent, "transactionid")
      // The dedup insert; once in a while (full-suite load) PostgreSQL still shows the BEGIN it
      // was pipelined with. Either way the waiter waits on the first transaction's id.
      assert.match(waiter!.query, /ON CONFLICT|^BEGIN/)
      assert.isUndefined(second.pollUnsafe())

      yield* first.release
      assert.strictEqual(yield* joinWithin(first.fiber), "first")
      const result = yield* joinWithin(second)
      assert.isTrue(isDuplicate(result))
      assert.isFalse(yield* Ref.get(secondRan))
      assert.strictEqual(yield* ledgerRows(`${key.id}/first`), 1)
      assert.strictEqual(yield* ledgerRows(`${key.id}/second`), 0)
      assert.strictEqual(yield* dedupRows(key), 1)
    }))

  it.effect("BE-JOB-002: a concurrent duplicate proceeds and commits when the first transaction rolls back", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const boom = new Boom({ message: "first attempt failed" })
      const first = yield* holdKey(key, `${key.id}/first`, Effect.fail(boom))
      const second = yield* Effect.forkChild(store.commit(key, Effect.as(record(`${key.id}/second`), "second")))
      yield* awaitLockWaiters(first.pid)
      assert.isUndefined(second.pollUnsafe())

      yield* first.release
      const firstExit = yield* Effect.timeout(Fiber.await(first.fiber), "5 seconds")
      assert.deepStrictEqual(firstExit, Exit.fail(boom))
      assert.strictEqual(yield* joinWithin(second), "second")
      assert.strictEqual(yield* ledgerRows(`${key.id}/first`), 0)
      assert.strictEqual(yield* ledgerRows(`${key.id}/second`), 1)
      assert.strictEqual(yield* dedupRows(key), 1)
    }))

  it.effect("BE-JOB-002: an interrupted commit waiting on the key stops waiting and leaves nothing", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const first = yield* holdKey(key, `${key.id}/first`, Effect.succeed("first"))
      const secondRan = yield* Ref.make(false)
      const second = yield* Effect.forkChild(
        store.commit(key, Effect.andThen(Ref.set(secondRan, true), record(`${key.id}/second`)))
      )
      yield* awaitLockWaiters(first.pid)
      yield* Effect.timeout(Fiber.interrupt(second), "5 seconds")
      yield* awaitNoLockWaiters(first.pid)

      yield* first.release
      assert.strictEqual(yield* joinWithin(first.fiber), "first")
      assert.isFalse(yield* Ref.get(secondRan))
      assert.strictEqual(yield* dedupRows(key), 1)
      assert.strictEqual(yield* ledgerRows(`${key.id}/second`), 0)
    }))

  it.effect("the effect's own SqlError passes through unchanged, not as an IdempotencyError", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const raised = yield* Ref.make<unknown>(undefined)
      const failing = SqlClient.SqlClient.use((sql) => sql`SELECT * FROM no_such_business_table`).pipe(
        Effect.tapError((error) => Ref.set(raised, error))
      )
      const error = yield* Effect.flip(store.commit(key, failing))
      assert.strictEqual(error, yield* Ref.get(raised))
      assert.strictEqual(error._tag, "SqlError")
      assert.isFalse(yield* store.isCommitted(key))
    }))

  it.effect("an effect that recovers from a SQL error inside the transaction commits nothing: the aborted COMMIT is an IdempotencyError", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      // PostgreSQL aborts the transaction at the failed statement; recovering in Effect does not undo that.
      const swallowing = Effect.andThen(
        record(key.id),
        SqlClient.SqlClient.use((sql) => sql`SELECT * FROM no_such_business_table`).pipe(Effect.ignore)
      )
      const error = yield* Effect.flip(store.commit(key, swallowing))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual((error as IdempotencyError).reason, "Unavailable")
      assert.include(error.message, "aborted transaction")
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("BE-JOB-003: a key the database cannot store is permanent InvalidData, not retried as unavailable", () =>
    Effect.gen(function*() {
      const ran = yield* Ref.make(false)
      // PostgreSQL cannot store a NUL character in a text column (22021): the store refuses the key
      // before sending anything (core's IdempotencyStore.keyProblem).
      const error = yield* Effect.flip(commit("a\u0000b", Ref.set(ran, true), { scope: "ledger-applier" }))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual(error.reason, "InvalidData", error.message)
      assert.isFalse(error.isRetryable)
      assert.isFalse(yield* Ref.get(ran))
    }))

  it.effect("BE-JOB-003: a constraint that fails only at COMMIT is permanent InvalidData and records nothing", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const store = yield* IdempotencyStore
      const key = freshKey()
      // Deferred: the effect's INSERT succeeds, and the store's own COMMIT reports the violation (23505).
      yield* sql`CREATE TABLE IF NOT EXISTS deferred_note (note text UNIQUE DEFERRABLE INITIALLY DEFERRED)`
      yield* sql`INSERT INTO deferred_note VALUES (${key.id})`
      const error = yield* Effect.flip(store.commit(key, sql`INSERT INTO deferred_note VALUES (${key.id})`))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual((error as IdempotencyError).reason, "InvalidData", error.message)
      assert.isFalse((error as IdempotencyError).isRetryable)
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("a missing dedup table is an IdempotencyError Misconfigured that says to run the migrations", () =>
    Effect.gen(function*() {
      const store = yield* PgIdempotencyStore.make({ table: "missing_dedup" })
      const ran = yield* Ref.make(false)
      const error = yield* Effect.flip(store.commit(freshKey(), Ref.set(ran, true)))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual(error.reason, "Misconfigured")
      assert.isFalse(error.isRetryable)
      assert.match(error.message, /missing_dedup.*run the jetworker migrations/s)
      assert.isFalse(yield* Ref.get(ran))
      const checkError = yield* Effect.flip(store.isCommitted(freshKey()))
      assert.strictEqual(checkError.reason, "Misconfigured")
    }))

  it.effect("a table without the (scope, id) primary key is Misconfigured, never a silent non-deduplicating store", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql`CREATE TABLE keyless_dedup (scope text, id text, committed_at timestamptz DEFAULT now())`
      const store = yield* PgIdempotencyStore.make({ table: "keyless_dedup" })
      const error = yield* Effect.flip(store.commit(freshKey(), Effect.void))
      assert.strictEqual(error._tag, "IdempotencyError")
      assert.strictEqual((error as IdempotencyError).reason, "Misconfigured")
    }))

  it.effect("a schema-qualified table name is accepted", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const store = yield* PgIdempotencyStore.make({ table: `${schema.name}.jetworker_dedup` })
      const key = freshKey()
      assert.strictEqual(yield* store.commit(key, Effect.succeed("ok")), "ok")
      assert.isTrue(isDuplicate(yield* store.commit(key, Effect.succeed("again"))))
    }))

  it.effect("an invalid table name fails the layer with Misconfigured, before any SQL", () =>
    Effect.gen(function*() {
      for (const table of ["dedup; DROP TABLE ledger", "Dedup", "a.b.c", "", "1dedup", "x".repeat(64)]) {
        const error = yield* Effect.flip(Layer.build(PgIdempotencyStore.layer({ table })))
        assert.instanceOf(error, IdempotencyError, table)
        assert.strictEqual((error as IdempotencyError).reason, "Misconfigured", table)
        assert.include(error.message, "invalid idempotency table name")
      }
    }))

  it.effect("a lock timeout while waiting on the key is a retryable IdempotencyError Conflict", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const first = yield* holdKey(key, `${key.id}/first`, Effect.succeed("first"))
      // A second pool whose sessions give up on a lock after 200ms.
      const error = yield* Effect.gen(function*() {
        const impatient = yield* PgIdempotencyStore.make()
        return yield* Effect.flip(Effect.timeout(impatient.commit(key, Effect.void), "5 seconds"))
      }).pipe(Effect.provide(TestDatabase.client({ maxConnections: 1, startupParameters: { lock_timeout: "200ms" } })))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual((error as IdempotencyError).reason, "Conflict")
      assert.isTrue((error as IdempotencyError).isRetryable)
      yield* first.release
      assert.strictEqual(yield* joinWithin(first.fiber), "first")
    }))

  it.effect("reports before-commit to the Probe with the delivery's sequence, or -1 outside a delivery", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const hits = yield* Ref.make<ReadonlyArray<Probe.Hit>>([])
      const probe: Probe.ProbeShape = { hit: (hit) => Ref.update(hits, (all) => [...all, hit]) }
      const inDelivery = freshKey()
      yield* store.commit(inDelivery, Effect.void).pipe(
        Effect.provideService(CurrentDelivery, {
          consumer: inDelivery.scope,
          eventId: inDelivery.id,
          attempt: 1,
          attempts: 3,
          subject: "ledger.transfer",
          sequence: 42,
          deliveryCount: 1,
          expiresAt: undefined,
          leaseDeadline: () => undefined,
          report: () => undefined
        }),
        Effect.provideService(Probe.Probe, probe)
      )
      const outside = freshKey()
      yield* store.commit(outside, Effect.void).pipe(Effect.provideService(Probe.Probe, probe))
      // A duplicate runs no effect, so it reaches no before-commit point.
      yield* store.commit(outside, Effect.void).pipe(Effect.provideService(Probe.Probe, probe))
      assert.deepStrictEqual(yield* Ref.get(hits), [
        { point: "before-commit", consumer: inDelivery.scope, sequence: 42, eventId: inDelivery.id },
        { point: "before-commit", consumer: outside.scope, sequence: -1, eventId: outside.id }
      ])
    }))

  it.effect("inside an open transaction the dedup row joins it: rolling that back frees the key", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const store = yield* IdempotencyStore
      const key = freshKey()
      const boom = new Boom({ message: "outer transaction fails later" })
      const error = yield* Effect.flip(sql.withTransaction(
        Effect.andThen(store.commit(key, record(key.id)), Effect.fail(boom))
      ))
      assert.strictEqual(error, boom)
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      assert.isFalse(yield* store.isCommitted(key))
    }))

  it.effect("with a tracer installed the dedup row's statement has its span in the transaction's; with none, the commit records the same", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const log = yield* SpanLog.make
      const traced = freshKey()
      assert.strictEqual(yield* store.commit(traced, Effect.as(record(traced.id), "traced")).pipe(Effect.withTracer(log.tracer)), "traced")
      const spans = yield* log.all
      const [transaction] = yield* log.named("sql.transaction")
      assert.isDefined(transaction)
      const dedup = spans.find((span) => String(span.attributes.get("db.query.text")).includes("ON CONFLICT (scope, id) DO NOTHING"))
      assert.isDefined(dedup, spans.map((span) => span.name).join(", "))
      assert.strictEqual(Option.getOrUndefined(dedup!.parent)?.spanId, transaction!.spanId)
      // Without a backend the row goes straight to the transaction's connection: same rows, same result.
      const untraced = freshKey()
      assert.strictEqual(yield* store.commit(untraced, Effect.as(record(untraced.id), "untraced")), "untraced")
      assert.isTrue(isDuplicate(yield* store.commit(untraced, Effect.as(record(untraced.id), "again"))))
      for (const key of [traced, untraced]) {
        assert.strictEqual(yield* dedupRows(key), 1)
        assert.strictEqual(yield* ledgerRows(key.id), 1)
      }
    }))

  it.effect("BE-JOB-002: the delivery hears Committed only once the outermost COMMIT succeeded: at once for its own transaction, after an enclosing one, never after a rollback", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const store = yield* IdempotencyStore
      const heard: Array<string> = []
      const inDelivery = (key: Key) =>
        Effect.provideService(CurrentDelivery, {
          consumer: key.scope,
          eventId: key.id,
          attempt: 1,
          attempts: 3,
          subject: "ledger.transfer",
          sequence: 1,
          deliveryCount: 1,
          expiresAt: undefined,
          leaseDeadline: () => undefined,
          report: (report) => heard.push(`${key.id}:${report}`)
        })
      const own = freshKey()
      yield* store.commit(own, Effect.tap(record(own.id), () => Effect.sync(() => assert.deepStrictEqual(heard, [])))).pipe(inDelivery(own))
      assert.deepStrictEqual(heard, [`${own.id}:Committed`])
      // Inside an enclosing transaction: not before that one commits.
      const enclosed = freshKey()
      yield* sql.withTransaction(Effect.andThen(
        store.commit(enclosed, record(enclosed.id)),
        Effect.sync(() => assert.deepStrictEqual(heard, [`${own.id}:Committed`], "not before the enclosing COMMIT"))
      )).pipe(inDelivery(enclosed))
      assert.deepStrictEqual(heard, [`${own.id}:Committed`, `${enclosed.id}:Committed`])
      // An enclosing transaction that rolls back: never.
      const rolledBack = freshKey()
      const boom = new Boom({ message: "the enclosing transaction fails" })
      assert.strictEqual(
        yield* Effect.flip(sql.withTransaction(Effect.andThen(store.commit(rolledBack, record(rolledBack.id)), Effect.fail(boom)))).pipe(
          inDelivery(rolledBack)
        ),
        boom
      )
      // A duplicate is heard as such, at once.
      yield* store.commit(own, record(own.id)).pipe(inDelivery(own))
      assert.deepStrictEqual(heard, [`${own.id}:Committed`, `${enclosed.id}:Committed`, `${own.id}:AlreadyCommitted`])
      assert.strictEqual(yield* dedupRows(rolledBack), 0)
    }))

  it.effect("purge deletes only rows older than olderThan, at most limit per call", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const scope = `purge-${randomUUID()}`
      yield* sql`INSERT INTO jetworker_dedup (scope, id, committed_at)
        SELECT ${scope}, 'old-' || n, now() - interval '2 hours' - n * interval '1 minute' FROM generate_series(1, 3) AS n`
      yield* sql`INSERT INTO jetworker_dedup (scope, id, committed_at)
        SELECT ${scope}, 'new-' || n, now() - interval '10 minutes' FROM generate_series(1, 2) AS n`
      const remaining = Effect.map(
        sql<{ readonly id: string }>`SELECT id FROM jetworker_dedup WHERE scope = ${scope} ORDER BY id`,
        (rows) => rows.map((row) => row.id)
      )
      assert.strictEqual(yield* PgIdempotencyStore.purge({ olderThan: "1 hour", limit: 2 }), 2)
      // The oldest go first.
      assert.deepStrictEqual(yield* remaining, ["new-1", "new-2", "old-1"])
      assert.strictEqual(yield* PgIdempotencyStore.purge({ olderThan: "1 hour", limit: 2 }), 1)
      assert.strictEqual(yield* PgIdempotencyStore.purge({ olderThan: "1 hour", limit: 2 }), 0)
      assert.deepStrictEqual(yield* remaining, ["new-1", "new-2"])
    }))

  it.effect("purge refuses a non-positive limit or an infinite age with Misconfigured", () =>
    Effect.gen(function*() {
      for (const options of [{ olderThan: "1 hour", limit: 0 }, { olderThan: "1 hour", limit: 1.5 }, {
        olderThan: "Infinity",
        limit: 10
      }] as const) {
        const error = yield* Effect.flip(PgIdempotencyStore.purge(options))
        assert.strictEqual(error.reason, "Misconfigured")
      }
    }))

  it.effect("purge on a missing table is Misconfigured", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(PgIdempotencyStore.purge({ olderThan: "1 day", limit: 10, table: "nope" }))
      assert.strictEqual(error.reason, "Misconfigured")
    }))

  it.effect("BE-JOB-002: commitStatement records the dedup row and the effect in one statement; a duplicate does nothing and reports so", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const reports: Array<string> = []
      const delivery = {
        consumer: key.scope,
        eventId: key.id,
        attempt: 1,
        attempts: 3,
        subject: "ledger.transfer",
        sequence: 7,
        deliveryCount: 1,
        expiresAt: undefined,
        leaseDeadline: () => undefined,
        report: (report: "Committed" | "AlreadyCommitted") => {
          reports.push(report)
        }
      }
      const statement = (fresh: Statement.Fragment) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`
      const first = yield* PgIdempotencyStore.commitStatement(key, statement).pipe(Effect.provideService(CurrentDelivery, delivery))
      assert.isUndefined(first)
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      assert.strictEqual(yield* dedupRows(key), 1)
      const second = yield* PgIdempotencyStore.commitStatement(key, statement).pipe(Effect.provideService(CurrentDelivery, delivery))
      assert.isTrue(isDuplicate(second))
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      assert.deepStrictEqual(reports, ["Committed", "AlreadyCommitted"])
    }))

  it.effect("BE-JOB-002: commitStatement waits for a concurrent commit of its key: Duplicate when that commits, applied when it rolls back", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const statement = (note: string) => (fresh: Statement.Fragment) => sql`INSERT INTO ledger (note) SELECT ${note} WHERE ${fresh}`
      // The other commits.
      const key = freshKey()
      const first = yield* holdKey(key, `${key.id}/first`, Effect.succeed("first"))
      const second = yield* Effect.forkChild(PgIdempotencyStore.commitStatement(key, statement(`${key.id}/second`)))
      const [waiter] = yield* awaitLockWaiters(first.pid)
      assert.match(waiter!.query, /jetworker_fresh/)
      yield* first.release
      assert.strictEqual(yield* joinWithin(first.fiber), "first")
      assert.isTrue(isDuplicate(yield* joinWithin(second)))
      assert.strictEqual(yield* ledgerRows(`${key.id}/second`), 0)
      assert.strictEqual(yield* dedupRows(key), 1)
      // The other rolls back.
      const other = freshKey()
      const failing = yield* holdKey(other, `${other.id}/first`, Effect.fail(new Boom({ message: "rolled back" })))
      const proceeding = yield* Effect.forkChild(PgIdempotencyStore.commitStatement(other, statement(`${other.id}/second`)))
      yield* awaitLockWaiters(failing.pid)
      yield* failing.release
      yield* Effect.timeout(Fiber.await(failing.fiber), "5 seconds")
      assert.isUndefined(yield* joinWithin(proceeding))
      assert.strictEqual(yield* ledgerRows(`${other.id}/first`), 0)
      assert.strictEqual(yield* ledgerRows(`${other.id}/second`), 1)
      assert.strictEqual(yield* dedupRows(other), 1)
    }))

  it.effect("commitStatement refuses a statement that does not use its guard, before sending anything", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, () => sql`INSERT INTO ledger (note) VALUES (${key.id})`))
      assert.strictEqual(error.reason, "Misconfigured")
      assert.match(error.message, /fresh/)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("commitStatement refuses a statement that is not INSERT, UPDATE or DELETE, before sending anything: PostgreSQL skips a read-only WITH query nothing reads, so its effect would never run", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // An effect done by a function, called from a SELECT: inside the one statement it would be
      // an unreferenced read-only WITH query, which PostgreSQL never evaluates, while the dedup
      // row committed and the outcome said Committed.
      yield* sql.unsafe(
        `CREATE OR REPLACE FUNCTION jw_test_note(n text) RETURNS void LANGUAGE sql AS $$ INSERT INTO ledger (note) VALUES (n) $$`
      )
      const key = freshKey()
      for (const statement of [
        (fresh: Statement.Fragment) => sql`SELECT jw_test_note(${key.id}) WHERE ${fresh}`,
        (fresh: Statement.Fragment) => sql`WITH n AS (SELECT ${key.id} AS note) INSERT INTO ledger (note) SELECT note FROM n WHERE ${fresh}`,
        (fresh: Statement.Fragment) => sql`${sql.literal("VALUES (1)")} LIMIT (CASE WHEN ${fresh} THEN 1 ELSE 0 END)`
      ]) {
        const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, statement))
        assert.strictEqual(error.reason, "Misconfigured")
        assert.match(error.message, /INSERT, UPDATE or DELETE/)
      }
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("commitStatement takes UPDATE and DELETE, in any case and after comments", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      yield* sql`INSERT INTO ledger (note) VALUES (${`${key.id}/old`})`
      assert.isUndefined(
        yield* PgIdempotencyStore.commitStatement(key, (fresh) =>
          sql`
  -- renames the note
  /* once */ update ledger SET note = ${key.id} WHERE note = ${`${key.id}/old`} AND ${fresh}`)
      )
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      const other = freshKey()
      assert.isUndefined(
        yield* PgIdempotencyStore.commitStatement(other, (fresh) => sql`Delete FROM ledger WHERE note = ${key.id} AND ${fresh}`)
      )
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      assert.strictEqual(yield* dedupRows(other), 1)
    }))

  it.effect("BE-JOB-002: commitStatement records its key in the table of the store the layer was given, so commit and commitStatement see each other's keys", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(`CREATE TABLE IF NOT EXISTS custom_dedup (LIKE jetworker_dedup INCLUDING ALL)`)
      const key = freshKey()
      yield* Effect.gen(function*() {
        assert.isUndefined(
          yield* PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`)
        )
        const store = yield* IdempotencyStore
        assert.isTrue(isDuplicate(yield* store.commit(key, record(`${key.id}/again`))), "commit did not see commitStatement's key")
      }).pipe(Effect.provide(PgIdempotencyStore.layer({ table: "custom_dedup" })))
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      assert.strictEqual(yield* ledgerRows(`${key.id}/again`), 0)
      const [rows] = yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM custom_dedup WHERE scope = ${key.scope} AND id = ${key.id}`
      assert.strictEqual(rows?.n, 1)
      assert.strictEqual(yield* dedupRows(key), 0, "nothing in the default table")
    }))

  it.effect("commitStatement: a statement that fails records nothing and is classified (a NOT NULL violation is InvalidData)", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const error = yield* Effect.flip(
        PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT NULL WHERE ${fresh}`)
      )
      assert.strictEqual(error.reason, "InvalidData", error.message)
      assert.strictEqual(yield* dedupRows(key), 0)
      // And the key is still free.
      assert.isUndefined(yield* PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`))
      assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))

  it.effect("polls observe the blocked backend until it is gone", () =>
    // Guards the helpers above: an idle database has no waiter on a backend that holds nothing.
    Effect.gen(function*() {
      const pid = yield* backendPid
      yield* awaitNoLockWaiters(pid)
      const none = yield* Effect.exit(
        pollUntil("a value that never comes", Effect.succeed(Option.none<number>()), "100 millis")
      )
      assert.isTrue(Exit.isFailure(none))
    }))
})
}

describe("PgIdempotencyStore without a reachable database", () => {
  it.live("an unreachable database is an IdempotencyError Unavailable", () =>
    Effect.gen(function*() {
      const store = yield* PgIdempotencyStore.make()
      const ran = yield* Ref.make(false)
      const error = yield* Effect.flip(Effect.timeout(store.commit(freshKey(), Ref.set(ran, true)), "10 seconds"))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual((error as IdempotencyError).reason, "Unavailable")
      assert.isTrue((error as IdempotencyError).isRetryable)
      assert.isFalse(yield* Ref.get(ran))
    }).pipe(
      Effect.provide(PgClient.layer({ url: Redacted.make("postgres://postgres@127.0.0.1:1/test"), connectTimeout: "2 seconds" }))
    ))
})

describe("PgIdempotencyStore error classification", () => {
  const dedupTable = "\"jetworker_dedup\""
  const sqlError = (reason: SqlErrors.SqlErrorReason) => new SqlErrors.SqlError({ reason })
  // What PgConnection passes to the reason it picks from the SQLSTATE: the server's fields on an Error.
  const reported = (code: string, fields: Readonly<Record<string, string>> = {}) => ({
    cause: Object.assign(new Error(`server error ${code}`), { code, ...fields }),
    message: "PgConnection: Query failed",
    operation: "query"
  })
  const retryable: ReadonlyArray<IdempotencyError["reason"]> = ["Unavailable", "Conflict"]

  it("maps one SQLSTATE of every class in the table, as the driver reports it, to its reason", () => {
    // Each reason class is the one @effect/sql-pg's classifySqlState picks for that code.
    const cases: ReadonlyArray<readonly [SqlErrors.SqlErrorReason, IdempotencyError["reason"]]> = [
      [new SqlErrors.ConnectionError(reported("08006")), "Unavailable"],
      [new SqlErrors.UnknownError(reported("53300")), "Unavailable"],
      [new SqlErrors.UnknownError(reported("57P01")), "Unavailable"],
      [new SqlErrors.UnknownError(reported("58030")), "Unavailable"],
      [new SqlErrors.SerializationError(reported("40001")), "Conflict"],
      [new SqlErrors.DeadlockError(reported("40P01")), "Conflict"],
      [new SqlErrors.UnknownError(reported("40003")), "Conflict"],
      [new SqlErrors.LockTimeoutError(reported("55P03")), "Conflict"],
      [new SqlErrors.StatementTimeoutError(reported("57014")), "Conflict"],
      [new SqlErrors.SqlSyntaxError(reported("42703")), "Misconfigured"],
      [new SqlErrors.SqlSyntaxError(reported("42P01")), "Misconfigured"],
      [new SqlErrors.AuthorizationError(reported("42501")), "Misconfigured"],
      [new SqlErrors.UnknownError(reported("3F000")), "Misconfigured"],
      [new SqlErrors.UnknownError(reported("22021")), "InvalidData"],
      [new SqlErrors.UnknownError(reported("22P02")), "InvalidData"],
      [new SqlErrors.ConstraintError(reported("23502")), "InvalidData"],
      [
        new SqlErrors.UniqueViolation({
          ...reported("23505", { table: "ledger", constraint: "ledger_pkey" }),
          constraint: "ledger_pkey"
        }),
        "InvalidData"
      ],
      // A unique violation on the dedup key: a concurrent commit recorded it; a retry is a duplicate.
      [
        new SqlErrors.UniqueViolation({
          ...reported("23505", { table: "jetworker_dedup", constraint: "jetworker_dedup_pkey" }),
          constraint: "jetworker_dedup_pkey"
        }),
        "Conflict"
      ],
      // Classes outside the table stay Unavailable.
      [new SqlErrors.AuthenticationError(reported("28P01")), "Unavailable"],
      [new SqlErrors.UnknownError(reported("25P02")), "Unavailable"],
      [new SqlErrors.UnknownError(reported("XX000")), "Unavailable"],
      // Without a SQLSTATE (the client's own errors) the reason's tag decides.
      [new SqlErrors.ConnectionError({ cause: new Error("ECONNRESET") }), "Unavailable"],
      [new SqlErrors.UnknownError({ cause: new Error("COMMIT rolled back an aborted transaction") }), "Unavailable"]
    ]
    for (const [reason, expected] of cases) {
      const code = sqlState(sqlError(reason)) ?? "none"
      const error = classify(sqlError(reason), dedupTable)
      assert.strictEqual(error.reason, expected, `${reason._tag} ${code}`)
      assert.strictEqual(error.isRetryable, retryable.includes(expected), `${reason._tag} ${code}`)
      if (code !== "none") assert.include(error.message, `SQLSTATE ${code}`)
    }
  })

  it("a unique violation on a same-named table of another schema is not the dedup key", () => {
    const reason = new SqlErrors.UniqueViolation({
      ...reported("23505", { schema: "other", table: "jetworker_dedup" }),
      constraint: "jetworker_dedup_pkey"
    })
    assert.strictEqual(classify(sqlError(reason), "\"mine\".\"jetworker_dedup\"").reason, "InvalidData")
    const own = new SqlErrors.UniqueViolation({
      ...reported("23505", { schema: "mine", table: "jetworker_dedup" }),
      constraint: "jetworker_dedup_pkey"
    })
    assert.strictEqual(classify(sqlError(own), "\"mine\".\"jetworker_dedup\"").reason, "Conflict")
  })

  it("a code's entry wins over its class's, and the table holds only classes and codes", () => {
    assert.strictEqual(reasonForSqlState("57014"), "Conflict")
    assert.strictEqual(reasonForSqlState("57P03"), "Unavailable")
    assert.strictEqual(reasonForSqlState("55P03"), "Conflict")
    assert.strictEqual(reasonForSqlState("55006"), "Unavailable")
    // A mistyped key would silently match nothing.
    for (const [key] of sqlStateReasons) assert.match(key, /^[0-9A-Z]{2}([0-9A-Z]{3})?$/, key)
    assert.strictEqual(new Set(sqlStateReasons.map(([key]) => key)).size, sqlStateReasons.length)
  })
})

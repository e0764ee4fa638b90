/**
 * `PgPipelinedClient`: a commit's BEGIN leaves with its dedup row (one round trip less), the row
 * never commits on its own when that BEGIN fails, an interrupted statement ends its session instead
 * of being waited for, and the rest behaves as `@effect/sql-pg`'s client. The store's own tests
 * (`PgIdempotencyStore.test.ts`) run on both clients; each session here counts its writes, and can
 * spoil the text of its first `BEGIN`, through the client's `stream` option.
 */
import { assert, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { IdempotencyStore, type Key } from "@jetworker/core/IdempotencyStore"
import { Cause, Config, Context, Deferred, Effect, Exit, Fiber, Layer, Option, Redacted, Stream } from "effect"
import { SqlClient } from "effect/sql"
import { isSqlError, type SqlError } from "effect/sql/SqlError"
import { randomUUID } from "node:crypto"
import net from "node:net"
import * as SpanLog from "../../testing/src/SpanLog.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import { sqlState } from "../src/internal/errors.ts"
import { TransactionConnection } from "../src/internal/pipelinedSession.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import * as PgPipelinedClient from "../src/PgPipelinedClient.ts"
import { backendPid, database, dedupRows, ledgerRows, Observer, pollUntil, record } from "./support.ts"

/** Writes to PostgreSQL through the sessions of one client, and whether to spoil the next `BEGIN`'s text. */
interface Wire {
  writes: number
  spoilBegin: boolean
}

const beginText = Buffer.from("BEGIN DEFERRABLE\0")
const spoiledText = Buffer.from("BEGXN DEFERRABLE\0")

/** A `stream` for a client's settings: a socket to the test database that counts (and may spoil) writes. */
const wiredStream = (url: Redacted.Redacted, wire: Wire) => () => {
  const { hostname, port } = new URL(Redacted.value(url))
  const socket = net.connect({ host: hostname, port: port === "" ? 5432 : Number(port), noDelay: true })
  const write = socket.write.bind(socket) as (chunk: Uint8Array) => boolean
  socket.write = ((chunk: Uint8Array) => {
    wire.writes++
    const bytes = Buffer.from(chunk)
    const at = wire.spoilBegin ? bytes.indexOf(beginText) : -1
    if (at >= 0) {
      wire.spoilBegin = false
      spoiledText.copy(bytes, at)
      return write(bytes)
    }
    return write(chunk)
  }) as typeof socket.write
  return socket
}

type Client = "PgPipelinedClient" | "PgClient"

/** The store on a client of its own over the test schema, its sessions wired to `wire`. */
const storeOn = (client: Client, wire: Wire, maxConnections = 4, startupParameters: Record<string, string> = {}, sendWindow?: number) =>
  TestDatabase.TestSchema.use((test) => {
    const settings = {
      url: test.url,
      maxConnections,
      applicationName: "jetworker-test-pipelined",
      startupParameters: { ...startupParameters, search_path: test.name },
      stream: wiredStream(test.url, wire)
    }
    const sql = client === "PgClient" ? PgClient.layer(settings) : PgPipelinedClient.layer({ ...settings, sendWindow })
    return Layer.build(PgIdempotencyStore.layer().pipe(Layer.provideMerge(sql)))
  })

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

const commitRecord = (key: Key) => IdempotencyStore.use((store) => store.commit(key, record(key.id)))

/** Writes while `effect` runs, after one commit to warm the session (connection, prepared statements). */
const writesOf = <A, E, R>(wire: Wire, effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const before = wire.writes
    yield* effect
    return wire.writes - before
  })

/**
 * Commits `key` on the store of `context` with the effect `effectOf(sleeping)`, which runs
 * `sleeping` (a 60 s sleep), and interrupts the commit while the sleep runs: the interruption
 * returns at once, the sleep's backend is ended, nothing is committed, and the pool serves the next
 * commit.
 */
const interruptedWhileSleeping = (
  context: Context.Context<IdempotencyStore | SqlClient.SqlClient>,
  key: Key,
  effectOf: (sleeping: string) => Effect.Effect<unknown, SqlError, SqlClient.SqlClient>
) =>
  Effect.gen(function*() {
    const sleeping = `/* ${key.id} */ SELECT pg_sleep(60)`
    const fiber = yield* Effect.forkChild(Effect.provideContext(IdempotencyStore.use((store) => store.commit(key, effectOf(sleeping))), context))
    const pid = yield* pollUntil(
      "the commit's sleep running",
      Observer.use((sql) =>
        Effect.map(
          sql<{ readonly pid: number }>`SELECT pid FROM pg_stat_activity WHERE query = ${sleeping} AND state = 'active'`,
          (rows) => Option.fromNullishOr(rows[0]?.pid)
        )
      )
    )
    yield* Effect.timeout(Fiber.interrupt(fiber), "5 seconds")
    yield* pollUntil(
      "the backend ended",
      Observer.use((sql) =>
        Effect.map(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ${pid}`, (rows) =>
          rows[0]?.n === 0 ? Option.some(true) : Option.none())
      )
    )
    assert.strictEqual(yield* dedupRows(key), 0)
    const next = freshKey()
    yield* Effect.provideContext(commitRecord(next), context)
    assert.strictEqual(yield* dedupRows(next), 1)
  })

layer(database(), { excludeTestServices: true })("PgPipelinedClient", (it) => {
  it.effect("a commit sends its BEGIN with the dedup row: three writes to PostgreSQL where PgClient needs four", () =>
    Effect.gen(function*() {
      for (const [client, expected] of [["PgPipelinedClient", 3], ["PgClient", 4]] as const) {
        const wire: Wire = { writes: 0, spoilBegin: false }
        const context = yield* storeOn(client, wire, 1)
        yield* Effect.provideContext(commitRecord(freshKey()), context)
        const key = freshKey()
        const writes = yield* Effect.provideContext(writesOf(wire, commitRecord(key)), context)
        assert.strictEqual(writes, expected, client)
        assert.strictEqual(yield* dedupRows(key), 1)
        assert.strictEqual(yield* ledgerRows(key.id), 1)
        // A duplicate: the dedup row finds its key, nothing else is sent but COMMIT.
        const duplicate = yield* Effect.provideContext(writesOf(wire, commitRecord(key)), context)
        assert.strictEqual(duplicate, expected - 1, `${client}, duplicate`)
        assert.strictEqual(yield* ledgerRows(key.id), 1)
      }
    }))

  it.effect("with a tracing backend a commit still sends its BEGIN with the dedup row, and the row has its span in the transaction's", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1)
      yield* Effect.provideContext(commitRecord(freshKey()), context)
      const log = yield* SpanLog.make
      const key = freshKey()
      const writes = yield* Effect.provideContext(writesOf(wire, commitRecord(key)), context).pipe(Effect.withTracer(log.tracer))
      assert.strictEqual(writes, 3)
      assert.strictEqual(yield* dedupRows(key), 1)
      assert.strictEqual(yield* ledgerRows(key.id), 1)
      const [transaction] = yield* log.named("sql.transaction")
      const spans = yield* log.all
      const row = spans.find((span) => String(span.attributes.get("db.query.text")).includes("ON CONFLICT (scope, id) DO NOTHING"))
      // The handler's statement, a Statement of the client: the row's span is named and marked as it is.
      const effect = spans.find((span) => String(span.attributes.get("db.query.text")).includes("INSERT INTO ledger"))
      assert.isDefined(transaction)
      assert.isDefined(row)
      assert.isDefined(effect)
      assert.strictEqual(row!.name, effect!.name)
      assert.strictEqual(row!.kind, effect!.kind)
      assert.strictEqual(row!.attributes.get("db.system.name"), "postgresql")
      assert.strictEqual(row!.attributes.get("db.namespace"), effect!.attributes.get("db.namespace"))
      assert.strictEqual(Option.getOrUndefined(row!.parent)?.spanId, transaction!.spanId)
      assert.strictEqual(row!.status._tag, "Ended")
    }))

  it.effect("a transaction that sends no statement sends no BEGIN and no COMMIT", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1)
      const sql = Context.get(context, SqlClient.SqlClient)
      yield* sql`SELECT 1`
      assert.strictEqual(yield* writesOf(wire, sql.withTransaction(Effect.succeed(1))), 0)
      // One statement: its BEGIN is waited for first (no guard), then COMMIT.
      assert.strictEqual(yield* writesOf(wire, sql.withTransaction(sql`SELECT 1`)), 3)
    }))

  it.effect("a BEGIN that fails in the pipelined round commits nothing: the dedup row's guard fails its statement (without the guard the row would commit alone)", () =>
    Effect.gen(function*() {
      // Spoiled on a fresh session, whose first BEGIN is sent with its text.
      const wire: Wire = { writes: 0, spoilBegin: true }
      const context = yield* storeOn("PgPipelinedClient", wire, 1)
      const key = freshKey()
      const exit = yield* Effect.exit(Effect.provideContext(commitRecord(key), context))
      assert.isTrue(Exit.isFailure(exit))
      assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "BEGXN")
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
      // The session goes on: the next commit applies.
      const next = freshKey()
      yield* Effect.provideContext(commitRecord(next), context)
      assert.strictEqual(yield* dedupRows(next), 1)

      // The same round with an unguarded row, on another fresh session: the row commits on its own.
      const unguarded: Wire = { writes: 0, spoilBegin: true }
      const bare = yield* storeOn("PgPipelinedClient", unguarded, 1)
      const sql = Context.get(bare, SqlClient.SqlClient)
      const lost = freshKey()
      const bareExit = yield* Effect.exit(sql.withTransaction(Effect.withFiber((fiber) => {
        const connection = Context.getUnsafe(fiber.context, sql.transactionService)[0]
        assert.instanceOf(connection, TransactionConnection)
        const unguarded = `INSERT INTO jetworker_dedup (scope, id) VALUES ($1, $2)`
        return (connection as TransactionConnection).executeFirst(unguarded, unguarded, [lost.scope, lost.id], false)
      })))
      assert.isTrue(Exit.isFailure(bareExit))
      assert.strictEqual(yield* dedupRows(lost), 1)
    }))

  it.effect("on a session whose default_transaction_deferrable is on (the guard fails everywhere) a commit starts its transaction again without pipelining, commits once, and the client stops pipelining", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1, { default_transaction_deferrable: "on" })
      const first = freshKey()
      yield* Effect.provideContext(commitRecord(first), context)
      assert.strictEqual(yield* dedupRows(first), 1)
      assert.strictEqual(yield* ledgerRows(first.id), 1)
      const key = freshKey()
      assert.strictEqual(yield* Effect.provideContext(writesOf(wire, commitRecord(key)), context), 4)
      assert.strictEqual(yield* dedupRows(key), 1)
      assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))

  it.effect("an interrupted statement ends its session at once: nothing is committed, and the pool opens another", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1)
      const key = freshKey()
      yield* interruptedWhileSleeping(context, key, (sleeping) =>
        Effect.andThen(record(key.id), SqlClient.SqlClient.use((sql) => sql.unsafe(sleeping))))
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("a transaction begun with a BeginTransaction of its own is rolled back on failure, and its session returns clean", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1)
      const sql = Context.get(context, SqlClient.SqlClient)
      const failed = randomUUID()
      const exit = yield* Effect.exit(
        sql.withTransaction(Effect.andThen(sql`INSERT INTO ledger (note) VALUES (${failed})`, Effect.fail("rejected"))).pipe(
          Effect.provideService(SqlClient.BeginTransaction, "BEGIN ISOLATION LEVEL SERIALIZABLE")
        )
      )
      assert.isTrue(Exit.isFailure(exit))
      // The one session again, outside any transaction: what it writes is committed at once.
      const after = randomUUID()
      yield* sql`INSERT INTO ledger (note) VALUES (${after})`
      assert.strictEqual(yield* ledgerRows(after), 1)
      assert.strictEqual(yield* ledgerRows(failed), 0)
    }))

  it.effect("layerConfig reads its settings from a Config, and fails with the ConfigError when one is missing", () =>
    Effect.gen(function*() {
      const test = yield* TestDatabase.TestSchema
      const context = yield* Layer.build(PgPipelinedClient.layerConfig(Config.all({
        url: Config.succeed(test.url),
        maxConnections: Config.succeed(1),
        startupParameters: Config.succeed({ search_path: test.name })
      })))
      const sql = Context.get(context, SqlClient.SqlClient)
      const [row] = yield* sql<{ readonly schema: string }>`SELECT current_schema() AS schema`
      assert.strictEqual(row?.schema, test.name)
      const missing = yield* Effect.flip(Layer.build(PgPipelinedClient.layerConfig(Config.all({
        url: Config.Redacted("JETWORKER_TEST_UNSET_DATABASE_URL")
      }))))
      assert.include(String(missing), "JETWORKER_TEST_UNSET_DATABASE_URL")
    }))

  it.effect("the rest is as on PgClient: savepoints, afterCommit, a stream inside a transaction, statements of several fibers, reserve, listen and notify", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 3)
      const sql = Context.get(context, SqlClient.SqlClient)
      const pg = Context.get(context, PgClient.PgClient)
      const note = randomUUID()
      let afterCommit = 0
      const inner = yield* sql.withTransaction(Effect.gen(function*() {
        yield* sql`INSERT INTO ledger (note) VALUES (${note})`
        yield* sql.afterCommit(Effect.sync(() => afterCommit++))
        // A savepoint that fails takes its own row only.
        const failed = yield* Effect.exit(sql.withTransaction(
          Effect.andThen(sql`INSERT INTO ledger (note) VALUES (${note})`, Effect.fail("inner"))
        ))
        assert.isTrue(Exit.isFailure(failed))
        assert.strictEqual(afterCommit, 0)
        // The transaction's own row, through a stream on its session.
        return yield* Stream.runCollect(sql`SELECT note FROM ledger WHERE note = ${note}`.stream)
      }))
      assert.strictEqual(inner.length, 1)
      assert.strictEqual(afterCommit, 1)
      assert.strictEqual(yield* ledgerRows(note), 1)

      // Statements racing for the held BEGIN: all of them in the transaction, rolled back together.
      const raced = randomUUID()
      const racedExit = yield* Effect.exit(sql.withTransaction(Effect.andThen(
        Effect.all(Array.from({ length: 3 }, () => sql`INSERT INTO ledger (note) VALUES (${raced})`), { concurrency: "unbounded" }),
        Effect.fail("then the transaction fails")
      )))
      assert.isTrue(Exit.isFailure(racedExit))
      assert.strictEqual(yield* ledgerRows(raced), 0)
      // And a commit whose effect writes from several fibers at once.
      const key = freshKey()
      yield* Effect.provideContext(
        IdempotencyStore.use((store) =>
          store.commit(key, Effect.all(Array.from({ length: 3 }, () => record(key.id)), { concurrency: "unbounded" }))),
        context
      )
      assert.strictEqual(yield* ledgerRows(key.id), 3)

      const reserved = yield* Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.executeRaw("SELECT 41 + 1 AS n", [])))
      assert.strictEqual((reserved as { readonly rows: ReadonlyArray<{ readonly n: number }> }).rows[0]?.n, 42)

      const channel = `jw_${randomUUID().replaceAll("-", "")}`
      const heard = yield* Effect.scoped(Effect.gen(function*() {
        const queue = yield* pg.listen(channel)
        yield* pg.notify(channel, "hello")
        return yield* Effect.timeout(Stream.runHead(Stream.fromQueue(queue)), "5 seconds")
      }))
      assert.strictEqual(Option.getOrUndefined(heard)?.payload, "hello")
      const [json] = yield* sql<{ readonly value: { readonly a: number } }>`SELECT ${pg.json({ a: 1 })}::jsonb AS value`
      assert.deepStrictEqual(json?.value, { a: 1 })
    }))
})

/** A statement that fails with 23502 (not_null_violation), the `ledger` table's `note` being NOT NULL. */
const badRecord = SqlClient.SqlClient.use((sql) => PgPipelinedClient.send(sql`INSERT INTO ledger (note) VALUES (NULL)`))
const sendRecord = (note: string) => SqlClient.SqlClient.use((sql) => PgPipelinedClient.send(sql`INSERT INTO ledger (note) VALUES (${note})`))

/** The SQLSTATE of a commit's failure, or what it failed with when not a `SqlError`. */
const failureOf = <A, E>(exit: Exit.Exit<A, E>): string => {
  if (Exit.isSuccess(exit)) return "succeeded"
  const error = Option.getOrUndefined(Cause.findErrorOption(exit.cause))
  return isSqlError(error) ? `SqlError ${sqlState(error)}` : String(error)
}

layer(database(), { excludeTestServices: true })("PgPipelinedClient.send", (it) => {
  it.effect("a commit whose effect sends its writes costs two writes to PostgreSQL however many it sends: BEGIN with the dedup row, then the writes with COMMIT (on PgClient send waits for each)", () =>
    Effect.gen(function*() {
      for (const [client, expected] of [["PgPipelinedClient", 2], ["PgClient", 6]] as const) {
        const wire: Wire = { writes: 0, spoilBegin: false }
        const context = yield* storeOn(client, wire, 1)
        const sends = (key: Key) =>
          IdempotencyStore.use((store) => store.commit(key, Effect.all([1, 2, 3].map((n) => sendRecord(`${key.id}-${n}`)))))
        yield* Effect.provideContext(sends(freshKey()), context)
        const key = freshKey()
        assert.strictEqual(yield* Effect.provideContext(writesOf(wire, sends(key)), context), expected, client)
        assert.strictEqual(yield* dedupRows(key), 1)
        for (const n of [1, 2, 3]) assert.strictEqual(yield* ledgerRows(`${key.id}-${n}`), 1, `${client}: row ${n}`)
        // With a tracing backend too: each sent statement has its span.
        const log = yield* SpanLog.make
        const traced = freshKey()
        const tracedWrites = yield* Effect.provideContext(writesOf(wire, sends(traced)), context).pipe(Effect.withTracer(log.tracer))
        assert.strictEqual(tracedWrites, expected, `${client}, traced`)
        const spans = yield* log.all
        assert.lengthOf(spans.filter((span) => String(span.attributes.get("db.query.text")).includes("INSERT INTO ledger")), 3)
      }
    }))

  it.effect("a sent statement that fails fails the commit with its own SqlError, as the effect's error (as on PgClient, where send waits), and nothing commits: not the dedup row, not the writes sent before or after it", () =>
    Effect.gen(function*() {
      for (const client of ["PgPipelinedClient", "PgClient"] as const) {
        const context = yield* storeOn(client, { writes: 0, spoilBegin: false }, 1)
        const key = freshKey()
        const exit = yield* Effect.exit(Effect.provideContext(
          IdempotencyStore.use((store) =>
            store.commit(key, Effect.all([sendRecord(`${key.id}-before`), badRecord, sendRecord(`${key.id}-after`)]))),
          context
        ))
        // Not the store's IdempotencyError: the effect's own failure, for the consumer's classify.
        assert.strictEqual(failureOf(exit), "SqlError 23502", client)
        assert.strictEqual(yield* dedupRows(key), 0, client)
        assert.strictEqual(yield* ledgerRows(`${key.id}-before`), 0, client)
        assert.strictEqual(yield* ledgerRows(`${key.id}-after`), 0, client)
        // The session is clean: the next commit commits.
        const next = freshKey()
        yield* Effect.provideContext(commitRecord(next), context)
        assert.strictEqual(yield* ledgerRows(next.id), 1, client)
      }
    }))

  it.effect("a statement waited for after a sent one that failed fails with the sent one's error, not with 25P02 (the transaction is aborted)", () =>
    Effect.gen(function*() {
      for (const client of ["PgPipelinedClient", "PgClient"] as const) {
        const context = yield* storeOn(client, { writes: 0, spoilBegin: false }, 1)
        const key = freshKey()
        let after = "not reached"
        const exit = yield* Effect.exit(Effect.provideContext(
          IdempotencyStore.use((store) =>
            store.commit(
              key,
              Effect.andThen(badRecord, Effect.tapError(record(`${key.id}-after`), (error) => Effect.sync(() => (after = `SqlError ${sqlState(error)}`))))
            )),
          context
        ))
        assert.strictEqual(failureOf(exit), "SqlError 23502", client)
        // On PgClient send waits, so the statement after it never runs.
        assert.strictEqual(after, client === "PgClient" ? "not reached" : "SqlError 23502", client)
        assert.strictEqual(yield* dedupRows(key), 0, client)
      }
    }))

  it.effect("a handler that fails after sending rolls back what it sent and keeps its session; one interrupted with a sent statement on the wire ends its session at once", () =>
    Effect.gen(function*() {
      const context = yield* storeOn("PgPipelinedClient", { writes: 0, spoilBegin: false }, 1)
      const pidBefore = yield* Effect.provideContext(backendPid, context)
      const failed = freshKey()
      const exit = yield* Effect.exit(Effect.provideContext(
        IdempotencyStore.use((store) =>
          store.commit(
            failed,
            // The failure comes while what was sent still runs: the ROLLBACK waits for it.
            Effect.andThen(
              Effect.all([SqlClient.SqlClient.use((sql) => PgPipelinedClient.send(sql`SELECT pg_sleep(0.2)`)), sendRecord(failed.id)]),
              Effect.fail("business rule")
            )
          )),
        context
      ))
      assert.strictEqual(failureOf(exit), "business rule")
      assert.strictEqual(yield* ledgerRows(failed.id), 0)
      assert.strictEqual(yield* dedupRows(failed), 0)
      assert.strictEqual(yield* Effect.provideContext(backendPid, context), pidBefore, "the session was kept")

      // Interrupted while its handler waits elsewhere, the statement it sent still running: without
      // ending the session, its ROLLBACK would wait for the sleep.
      yield* interruptedWhileSleeping(context, freshKey(), (sleeping) =>
        Effect.andThen(SqlClient.SqlClient.use((sql) => PgPipelinedClient.send(sql.unsafe(sleeping))), Effect.never))
    }))

  it.effect("with sendWindow statements unanswered, the next send waits for them first (a round trip), and fails there when one of them failed; a sendWindow that is not a positive integer is refused", () =>
    Effect.gen(function*() {
      const wire: Wire = { writes: 0, spoilBegin: false }
      const context = yield* storeOn("PgPipelinedClient", wire, 1, {}, 2)
      const sends = (key: Key) =>
        IdempotencyStore.use((store) => store.commit(key, Effect.all([1, 2, 3, 4, 5].map((n) => sendRecord(`${key.id}-${n}`)))))
      yield* Effect.provideContext(sends(freshKey()), context)
      const key = freshKey()
      // BEGIN with the row; sends 1 and 2; 3 and 4; 5 with COMMIT.
      assert.strictEqual(yield* Effect.provideContext(writesOf(wire, sends(key)), context), 4)
      for (const n of [1, 2, 3, 4, 5]) assert.strictEqual(yield* ledgerRows(`${key.id}-${n}`), 1, `row ${n}`)

      const failed = freshKey()
      let reached = false
      const exit = yield* Effect.exit(Effect.provideContext(
        IdempotencyStore.use((store) =>
          store.commit(
            failed,
            Effect.all([badRecord, sendRecord(`${failed.id}-1`), sendRecord(`${failed.id}-2`), Effect.sync(() => (reached = true))])
          )),
        context
      ))
      assert.strictEqual(failureOf(exit), "SqlError 23502")
      assert.isFalse(reached, "the third send waited, and failed with the first")
      assert.strictEqual(yield* dedupRows(failed), 0)

      for (const sendWindow of [0, 1.5, Number.NaN]) {
        const refused = yield* Effect.flip(storeOn("PgPipelinedClient", wire, 1, {}, sendWindow))
        assert.include(String(refused), `sendWindow must be a positive integer, got ${sendWindow}`)
      }
    }))

  it.effect("send waits where it cannot save a round trip: outside a transaction it commits at once, and in a savepoint its failure fails the savepoint only; from a fiber that outlived its transaction it dies", () =>
    Effect.gen(function*() {
      const context = yield* storeOn("PgPipelinedClient", { writes: 0, spoilBegin: false }, 1)
      const sql = Context.get(context, SqlClient.SqlClient)
      const alone = randomUUID()
      yield* Effect.provideContext(sendRecord(alone), context)
      assert.strictEqual(yield* ledgerRows(alone), 1)

      // From a fiber that outlives its transaction: refused, rather than sent into a closed scope
      // where it would never run.
      const late = randomUUID()
      const gate = yield* Deferred.make<void>()
      const outlived = yield* Effect.provideContext(
        sql.withTransaction(Effect.andThen(record(randomUUID()), Effect.forkDetach(Effect.andThen(Deferred.await(gate), sendRecord(late))))),
        context
      )
      yield* Deferred.succeed(gate, undefined)
      const lateExit = yield* Fiber.await(outlived)
      assert.isTrue(Exit.hasDies(lateExit), "the late send died")
      assert.include(String(Cause.squash(Exit.isFailure(lateExit) ? lateExit.cause : Cause.empty)), "the transaction has already ended")
      assert.strictEqual(yield* ledgerRows(late), 0)

      const [a, b] = [randomUUID(), randomUUID()]
      const inner = yield* Effect.provideContext(
        sql.withTransaction(Effect.gen(function*() {
          yield* record(a)
          const savepoint = yield* Effect.exit(sql.withTransaction(badRecord))
          yield* record(b)
          return savepoint
        })),
        context
      )
      assert.strictEqual(failureOf(inner), "SqlError 23502")
      assert.strictEqual(yield* ledgerRows(a), 1)
      assert.strictEqual(yield* ledgerRows(b), 1)
    }))

  it.effect("a statement or a stream from a fiber that outlived its transaction dies, rather than running in the next transaction on the session", () =>
    Effect.gen(function*() {
      // One session, so that the next transaction gets the one the first gave back.
      const context = yield* storeOn("PgPipelinedClient", { writes: 0, spoilBegin: false }, 1)
      const sql = Context.get(context, SqlClient.SqlClient)
      const [first, late, next] = [randomUUID(), randomUUID(), randomUUID()]
      const gate = yield* Deferred.make<void>()
      const [outlived, streamed] = yield* Effect.provideContext(
        sql.withTransaction(Effect.andThen(
          record(first),
          Effect.all([
            Effect.forkDetach(Effect.andThen(Deferred.await(gate), record(late))),
            Effect.forkDetach(Effect.andThen(Deferred.await(gate), Stream.runCollect(sql`SELECT 1 AS n`.stream)))
          ])
        )),
        context
      )
      // The next transaction, on the same session: the late statement runs while it is open, and
      // it rolls back.
      const nextExit = yield* Effect.exit(Effect.provideContext(
        sql.withTransaction(Effect.gen(function*() {
          yield* record(next)
          yield* Deferred.succeed(gate, undefined)
          const lateExit = yield* Fiber.await(outlived).pipe(Effect.timeout("10 seconds"))
          yield* Fiber.await(streamed).pipe(Effect.timeout("10 seconds"))
          return yield* Effect.fail(lateExit)
        })),
        context
      ))
      const lateExit = Exit.isFailure(nextExit) ? Option.getOrUndefined(Cause.findErrorOption(nextExit.cause)) : undefined
      assert.isTrue(lateExit !== undefined && Exit.isExit(lateExit) && Exit.hasDies(lateExit), `the late statement died: ${String(lateExit)}`)
      assert.include(String(Cause.squash((lateExit as Exit.Failure<unknown, unknown>).cause)), "the transaction has already ended")
      assert.deepStrictEqual([yield* ledgerRows(first), yield* ledgerRows(late), yield* ledgerRows(next)], [1, 0, 0])
      const streamExit = yield* Fiber.await(streamed)
      assert.isTrue(Exit.hasDies(streamExit), "a stream from the late fiber died too")
      assert.include(String(Cause.squash(Exit.isFailure(streamExit) ? streamExit.cause : Cause.empty)), "the transaction has already ended")
      // The session is still good.
      yield* Effect.provideContext(sql.withTransaction(record(next)), context)
      assert.strictEqual(yield* ledgerRows(next), 1)
    }))
})

/**
 * The stores when the link to PostgreSQL is reset at the socket level (a `FaultProxy` cut: the
 * client sees Node's ECONNRESET, not a SQLSTATE), mid-transaction: the store must end with a typed
 * failure (the effect's own error when it failed, else `IdempotencyError` `Unavailable` naming the
 * lost connection), never a defect wrapping its internals, and record nothing. The terminated
 * backend of `PgIdempotencyStoreLostConnection.test.ts` reports SQLSTATE 57P01 instead; a reset
 * socket reports none.
 */
import { assert, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { AttemptStoreError } from "@jetworker/core/AttemptStore"
import { IdempotencyError, type Key } from "@jetworker/core/IdempotencyStore"
import * as Outbox from "@jetworker/core/Outbox"
import { Cause, Data, Effect, Exit, Layer, Option, Redacted, Result } from "effect"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { randomUUID } from "node:crypto"
import * as FaultProxy from "../../testing/src/FaultProxy.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as PgAttemptStore from "../src/PgAttemptStore.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import * as PgOutbox from "../src/PgOutbox.ts"
import * as PgPipelinedClient from "../src/PgPipelinedClient.ts"
import * as PgTransaction from "../src/PgTransaction.ts"
import { type ClientKind, clientKinds, database, dedupRows, ledgerRows, record } from "./support.ts"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

/** A one-connection client on the test schema whose connections go through `proxy`. */
const clientVia = (client: ClientKind, proxy: FaultProxy.FaultProxy, schema: TestDatabase.TestSchema["Service"]) => {
  const url = new URL(Redacted.value(schema.url))
  url.hostname = proxy.address.host
  url.port = String(proxy.address.port)
  const settings = {
    url: Redacted.make(url.toString()),
    startupParameters: { search_path: schema.name },
    applicationName: "jetworker-test-via-proxy",
    connectTimeout: "2 seconds",
    maxConnections: 1
  } as const
  return client === "PgClient" ? PgClient.layer(settings) : PgPipelinedClient.layer(settings)
}

/**
 * Runs `body` with a `SqlClient` whose link to PostgreSQL goes through a fresh `FaultProxy`
 * (restored afterwards); the `Observer` of the tests stays on a direct link.
 */
const viaProxyOn = (client: ClientKind) => <A, E, R>(body: (proxy: FaultProxy.FaultProxy) => Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const schema = yield* TestDatabase.TestSchema
    const url = new URL(Redacted.value(schema.url))
    const proxy = yield* FaultProxy.make({ target: { host: url.hostname, port: Number(url.port || 5432) } })
    return yield* body(proxy).pipe(Effect.provide(clientVia(client, proxy, schema)), Effect.ensuring(proxy.restore))
  })

/** The exit of `effect`, failing the test when it takes longer than 10 seconds. */
const exitWithin = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.exit(effect).pipe(Effect.timeout("10 seconds"))

/** The exit's defects (none when it ended with typed failures or interruptions alone). */
const defects = (exit: Exit.Exit<unknown, unknown>): ReadonlyArray<unknown> =>
  Exit.isSuccess(exit) ? [] : exit.cause.reasons.filter(Cause.isDieReason).map((reason) => reason.defect)

/** The exit's typed failure; fails the test when there is none. */
const failureOf = (exit: Exit.Exit<unknown, unknown>): unknown => {
  const error = Exit.isFailure(exit) ? Cause.findErrorOption(exit.cause) : Option.none()
  assert.isTrue(Option.isSome(error), String(exit))
  return (error as Option.Some<unknown>).value
}

/** Asserts `error` is `IdempotencyError` `Unavailable` naming the lost connection, not a SQLSTATE it is not. */
const assertConnectionLost = (error: unknown): IdempotencyError => {
  assert.instanceOf(error, IdempotencyError)
  const failure = error as IdempotencyError
  assert.strictEqual(failure.reason, "Unavailable", failure.message)
  assert.include(failure.message, "the connection to PostgreSQL was lost")
  assert.notInclude(failure.message, "SQLSTATE E")
  return failure
}

for (const client of clientKinds) {
layer(database(), { excludeTestServices: true })(`PgIdempotencyStore on ${client} when the link to PostgreSQL is reset`, (it) => {
  const viaProxy = viaProxyOn(client)
  it.effect("BE-JOB-002: commit whose effect ran and whose link is reset before COMMIT is answered fails with IdempotencyError Unavailable, not a defect", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* exitWithin(store.commit(key, Effect.andThen(record(key.id), proxy.cut)))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = assertConnectionLost(failureOf(exit))
      assert.include(failure.message, "ECONNRESET")
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("BE-JOB-002: commit whose effect runs a statement after the link was reset ends with that statement's SqlError, not a defect (the soak's repro)", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          const sql = yield* SqlClient.SqlClient
          return yield* exitWithin(store.commit(key, Effect.gen(function*() {
            yield* sql`SELECT 1`
            yield* proxy.cut
            yield* sql`SELECT 2`
          })))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      assert.strictEqual((failureOf(exit) as { readonly _tag: string })._tag, "SqlError")
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("BE-JOB-002: commit whose effect fails after the link was reset ends with the effect's own error, not a defect", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const boom = new Boom({ message: "transfer rejected" })
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* exitWithin(store.commit(key, Effect.gen(function*() {
            yield* record(key.id)
            yield* proxy.cut
            return yield* boom
          })))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      assert.deepStrictEqual(exit, Exit.fail(boom))
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("BE-JOB-002: commitBatch whose element succeeds while the link is reset fails as a whole with IdempotencyError Unavailable naming the lost connection", () =>
    Effect.gen(function*() {
      const first = freshKey()
      const second = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* exitWithin(store.commitBatch([
            { key: first, effect: Effect.as(record(first.id), "first") },
            { key: second, effect: Effect.as(Effect.andThen(record(second.id), proxy.cut), "second") }
          ]))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = assertConnectionLost(failureOf(exit))
      assert.include(failure.message, "ECONNRESET")
      for (const key of [first, second]) {
        assert.strictEqual(yield* dedupRows(key), 0)
        assert.strictEqual(yield* ledgerRows(key.id), 0)
      }
    }))

  it.effect("BE-JOB-002: commitBatch whose element fails after the link was reset fails as a whole with IdempotencyError Unavailable naming the element's error", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* exitWithin(store.commitBatch([{
            key,
            effect: Effect.gen(function*() {
              yield* proxy.cut
              return yield* new Boom({ message: "transfer rejected" })
            })
          }]))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = failureOf(exit) as IdempotencyError
      assert.instanceOf(failure, IdempotencyError)
      assert.strictEqual(failure.reason, "Unavailable", failure.message)
      assert.include(failure.message, "transfer rejected")
      assert.include(failure.message, key.id)
      assert.notInclude(failure.message, "SQLSTATE E")
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("BE-JOB-002: a handler's own transaction around commitBatch (rows locked first), whose link is reset in an element, ends with the batch's typed failure under PgTransaction.withTransaction; effect/sql's withTransaction adds its failed rollback as a SqlError defect", () =>
    Effect.gen(function*() {
      const run = (transaction: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | SqlError, R | SqlClient.SqlClient>) => {
        const key = freshKey()
        return viaProxy((proxy) =>
          Effect.gen(function*() {
            const store = yield* PgIdempotencyStore.make()
            const sql = yield* SqlClient.SqlClient
            return yield* exitWithin(transaction(Effect.andThen(
              sql`SELECT 1`,
              store.commitBatch([{ key, effect: Effect.andThen(record(key.id), proxy.cut) }])
            )))
          })
        ).pipe(Effect.map((exit) => ({ exit, key })))
      }
      const plain = yield* run((effect) => SqlClient.SqlClient.use((sql) => sql.withTransaction(effect)))
      assert.isNotEmpty(defects(plain.exit), `effect/sql's rollback on the lost connection: ${String(plain.exit)}`)
      const typed = yield* run(PgTransaction.withTransaction)
      assert.deepStrictEqual(defects(typed.exit), [], String(typed.exit))
      const failure = assertConnectionLost(failureOf(typed.exit))
      assert.include(failure.message, "ECONNRESET")
      assert.strictEqual(yield* dedupRows(typed.key), 0)
      assert.strictEqual(yield* ledgerRows(typed.key.id), 0)
    }))

  it.effect("BE-JOB-002: PgTransaction.withTransaction whose effect runs a statement after the link was reset ends with that statement's SqlError alone, or the effect's own error; its own defect stays one", () =>
    Effect.gen(function*() {
      /** The exit of a transaction that runs a statement, has its link reset, and then ends with `end`. */
      const afterCut = <E>(end: Effect.Effect<unknown, E, SqlClient.SqlClient>) =>
        viaProxy((proxy) =>
          exitWithin(PgTransaction.withTransaction(SqlClient.SqlClient.use((sql) =>
            Effect.andThen(sql`SELECT 1`, Effect.andThen(proxy.cut, end))
          )))
        )
      const lostStatement = yield* afterCut(SqlClient.SqlClient.use((sql) => sql`SELECT 2`))
      assert.deepStrictEqual(defects(lostStatement), [], String(lostStatement))
      assert.strictEqual((failureOf(lostStatement) as { readonly _tag: string })._tag, "SqlError")
      const boom = new Boom({ message: "transfer rejected" })
      assert.deepStrictEqual(yield* afterCut(Effect.fail(boom)), Exit.fail(boom))
      const bug = new Error("a bug")
      const died = yield* afterCut(Effect.die(bug))
      assert.include(defects(died), bug, String(died))
    }))

  it.effect("BE-JOB-002: commitAll whose effect ran and whose link is reset before COMMIT is answered fails with IdempotencyError Unavailable, not a defect", () =>
    Effect.gen(function*() {
      const keys = [freshKey(), freshKey()]
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* exitWithin(store.commitAll(keys, () => Effect.andThen(record(keys[0]!.id), proxy.cut)))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      assertConnectionLost(failureOf(exit))
      for (const key of keys) assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("BE-JOB-002: commitStatement over a reset link fails with IdempotencyError Unavailable naming the lost connection", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          // The pool's one connection is open, then reset under it.
          yield* sql`SELECT 1`
          yield* proxy.cut
          return yield* exitWithin(
            PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`)
          )
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = failureOf(exit) as IdempotencyError
      assert.instanceOf(failure, IdempotencyError)
      assert.strictEqual(failure.reason, "Unavailable", failure.message)
      assert.notInclude(failure.message, "SQLSTATE E")
      assert.match(failure.message, /(the connection to PostgreSQL was lost|could not connect to PostgreSQL) \(E[A-Z]+/)
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("a batch through the proxy still commits when the link holds", () =>
    Effect.gen(function*() {
      const keys = [freshKey(), freshKey()]
      const results = yield* viaProxy(() =>
        Effect.gen(function*() {
          const store = yield* PgIdempotencyStore.make()
          return yield* store.commitBatch(keys.map((key) => ({ key, effect: Effect.as(record(key.id), key.id) })))
        })
      )
      assert.deepStrictEqual(results, keys.map((key) => Result.succeed(key.id)))
      for (const key of keys) assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))

  it.effect("INT-NATS-007: an outbox relay round whose link is reset while it publishes fails with a typed OutboxError naming the lost connection, not a defect, and marks nothing sent", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const id = randomUUID()
      yield* sql.withTransaction(Outbox.record({ subject: "reset.relay", id, payload: new TextEncoder().encode("{}") })).pipe(
        Effect.provide(PgOutbox.layer())
      )
      const exit = yield* viaProxy((proxy) =>
        // A publish that "succeeds" while the database link is cut (an outage in the middle of a round).
        exitWithin(PgOutbox.relayRound().pipe(Effect.provide(Layer.succeed(Outbox.OutboxPublisher, { publish: () => proxy.cut }))))
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = failureOf(exit) as Outbox.OutboxError
      assert.strictEqual(failure._tag, "OutboxError", String(exit))
      assert.match(failure.message, /the connection to PostgreSQL was lost \(E[A-Z]+/)
      const [row] = yield* sql<{ readonly sent: boolean }>`SELECT sent_at IS NOT NULL AS sent FROM jetworker_outbox WHERE id = ${id}`
      assert.isFalse(row?.sent, "not marked sent")
    }))

  it.effect("BE-JOB-003: the attempt store over a reset link fails with a typed AttemptStoreError naming the lost connection", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const exit = yield* viaProxy((proxy) =>
        Effect.gen(function*() {
          const store = yield* PgAttemptStore.make()
          const sql = yield* SqlClient.SqlClient
          yield* sql`SELECT 1`
          yield* proxy.cut
          return yield* exitWithin(store.recordFailure(key))
        })
      )
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const failure = failureOf(exit) as AttemptStoreError
      assert.instanceOf(failure, AttemptStoreError)
      assert.match(failure.message, /(the connection to PostgreSQL was lost|could not connect to PostgreSQL) \(E[A-Z]+/)
    }))
})
}

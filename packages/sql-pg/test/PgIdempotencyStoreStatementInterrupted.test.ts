/**
 * `commitStatement` interrupted after its statement committed (a handler timeout landing while the
 * reply is on its way): the delivery must still hear `Committed`, as with `commit`, or the engine
 * counts an applied event as a failed attempt (and dead-letters it on the last one). The reply is
 * held back on cue by a `FaultProxy` between the client and PostgreSQL.
 */
import { assert, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { CurrentDelivery } from "@jetworker/core/CurrentDelivery"
import type { Key } from "@jetworker/core/IdempotencyStore"
import { Cause, Deferred, Effect, Exit, Fiber, Option, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as FaultProxy from "../../testing/src/FaultProxy.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { awaitLockWaiters, backendPid, database, dedupRows, ledgerRows, pollUntil } from "./support.ts"

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

/** A delivery of `key` whose reports land in `heard`. */
const deliveryOf = (key: Key, heard: Array<string>) => ({
  consumer: key.scope,
  eventId: key.id,
  attempt: 1,
  attempts: 3,
  subject: "ledger.transfer",
  sequence: 1,
  deliveryCount: 1,
  expiresAt: undefined,
  leaseDeadline: () => undefined,
  report: (report: "Committed" | "AlreadyCommitted") => {
    heard.push(report)
  }
})

/** A one-connection client on the test schema whose connections go through `proxy`. */
const clientVia = (proxy: FaultProxy.FaultProxy, schema: TestDatabase.TestSchema["Service"]) => {
  const url = new URL(Redacted.value(schema.url))
  url.hostname = proxy.address.host
  url.port = String(proxy.address.port)
  return PgClient.layer({
    url: Redacted.make(url.toString()),
    startupParameters: { search_path: schema.name },
    applicationName: "jetworker-test-via-proxy",
    connectTimeout: "2 seconds",
    maxConnections: 1
  })
}

layer(database(), { excludeTestServices: true })("PgIdempotencyStore.commitStatement interrupted", (it) => {
  it.effect("BE-JOB-002: commitStatement interrupted after its statement committed still reports Committed to the delivery", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const url = new URL(Redacted.value(schema.url))
      const proxy = yield* FaultProxy.make({ target: { host: url.hostname, port: Number(url.port || 5432) } })
      const key = freshKey()
      const heard: Array<string> = []
      yield* Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // The pool's one connection is open before the replies are held back.
        yield* sql`SELECT 1`
        yield* proxy.pauseToClient
        const fiber = yield* Effect.forkChild(
          PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`).pipe(
            Effect.provideService(CurrentDelivery, deliveryOf(key, heard))
          )
        )
        // The statement committed on the server; its reply waits in the proxy.
        yield* pollUntil("the dedup row committed", Effect.map(dedupRows(key), (n) => n === 1 ? Option.some(n) : Option.none()))
        assert.deepStrictEqual(heard, [])
        // The interruption waits for the driver to drain the statement, so it ends once replies flow again.
        const interrupting = yield* Effect.forkChild(Fiber.interrupt(fiber))
        yield* proxy.resume
        yield* Effect.timeout(Fiber.join(interrupting), "15 seconds")
        const exit = yield* Effect.timeout(Fiber.await(fiber), "5 seconds")
        assert.isTrue(Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause), String(exit))
      }).pipe(Effect.provide(clientVia(proxy, schema)), Effect.ensuring(proxy.resume))
      assert.deepStrictEqual(heard, ["Committed"])
      assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))

  it.effect("commitStatement interrupted before its statement committed reports nothing", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const heard: Array<string> = []
      // The statement waits on a row lock held by another transaction, then is interrupted: cancelled, it commits nothing.
      const note = `${key.id}/lock`
      yield* sql`INSERT INTO ledger (note) VALUES (${note})`
      const holding = yield* Deferred.make<number>()
      const locker = yield* Effect.forkChild(sql.withTransaction(Effect.gen(function*() {
        yield* sql`SELECT * FROM ledger WHERE note = ${note} FOR UPDATE`
        yield* Deferred.succeed(holding, yield* backendPid)
        return yield* Effect.never
      })))
      const pid = yield* Effect.timeout(Deferred.await(holding), "5 seconds")
      const fiber = yield* Effect.forkChild(
        PgIdempotencyStore.commitStatement(key, (fresh) => sql`UPDATE ledger SET note = ${key.id} WHERE note = ${note} AND ${fresh}`).pipe(
          Effect.provideService(CurrentDelivery, deliveryOf(key, heard))
        )
      )
      yield* awaitLockWaiters(pid)
      yield* Effect.timeout(Fiber.interrupt(fiber), "10 seconds")
      yield* Effect.timeout(Fiber.interrupt(locker), "10 seconds")
      assert.deepStrictEqual(heard, [])
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))
})

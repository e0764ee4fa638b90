/**
 * The store when the connection of its transaction dies while the user's effect runs (the backend
 * terminated from another pool): `ROLLBACK` / `ROLLBACK TO SAVEPOINT` / `RELEASE SAVEPOINT` then
 * fail, which `@effect/sql` turns into defects. The store must still end with a typed failure,
 * never a defect wrapping its own internals, and record nothing.
 */
import { assert, layer } from "@effect/vitest"
import { IdempotencyError, IdempotencyStore, type Key } from "@jetworker/core/IdempotencyStore"
import { Cause, Data, Deferred, Effect, Exit, Fiber, Layer, Option, Result } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { backendPid, clientKinds, database, dedupRows, ledgerRows, Observer, record } from "./support.ts"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

/**
 * Terminates the backend of the current transaction's connection from the Observer's pool and
 * waits (up to 5 seconds, PostgreSQL's own wait) until it is gone.
 */
const killOwnBackend = Effect.gen(function*() {
  const pid = yield* backendPid
  const observer = yield* Observer
  const [row] = yield* observer<{ readonly gone: boolean }>`SELECT pg_terminate_backend(${pid}::int, 5000) AS gone`
  assert.isTrue(row?.gone, `backend ${pid} did not end`)
})

/** The exit of `effect`, failing the test when it takes longer than 10 seconds. */
const exitWithin = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.exit(effect).pipe(Effect.timeout("10 seconds"))

/** The exit's defects (none when it ended with typed failures or interruptions alone). */
const defects = (exit: Exit.Exit<unknown, unknown>): ReadonlyArray<unknown> =>
  Exit.isSuccess(exit) ? [] : exit.cause.reasons.filter(Cause.isDieReason).map((reason) => reason.defect)

for (const client of clientKinds) {
layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database(client)),
  { excludeTestServices: true }
)(`PgIdempotencyStore on ${client} when the connection dies mid-transaction`, (it) => {
  it.effect("BE-JOB-002: commit whose effect fails after its connection died ends with the effect's own error, not a defect, and records nothing", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const boom = new Boom({ message: "transfer rejected" })
      const exit = yield* exitWithin(store.commit(key, Effect.gen(function*() {
        yield* record(key.id)
        yield* killOwnBackend
        return yield* boom
      })))
      assert.deepStrictEqual(defects(exit), [], String(exit))
      // The rollback failed with the connection, but a dead connection commits nothing: the
      // effect's own failure is the truth, as when the rollback succeeds.
      assert.deepStrictEqual(exit, Exit.fail(boom))
      assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("BE-JOB-002: commit whose effect runs a statement after its connection died ends with that statement's SqlError, not a defect", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const exit = yield* exitWithin(store.commit(key, Effect.andThen(killOwnBackend, record(key.id))))
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const error = Exit.isFailure(exit) ? Cause.findErrorOption(exit.cause) : Option.none()
      assert.isTrue(Option.isSome(error), String(exit))
      assert.strictEqual((error as Option.Some<{ readonly _tag: string }>).value._tag, "SqlError")
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("BE-JOB-002: commitBatch whose element fails after the connection died fails as a whole with IdempotencyError Unavailable naming the element's error", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const first = freshKey()
      const second = freshKey()
      const exit = yield* exitWithin(store.commitBatch<string, Boom, SqlClient.SqlClient | Observer>([
        { key: first, effect: Effect.as(record(first.id), "first").pipe(Effect.orDie) },
        {
          key: second,
          effect: Effect.gen(function*() {
            yield* killOwnBackend
            return yield* new Boom({ message: "transfer rejected" })
          }).pipe(Effect.catchTag("SqlError", Effect.die))
        }
      ]))
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const error = Exit.isFailure(exit) ? Cause.findErrorOption(exit.cause) : Option.none()
      assert.isTrue(Option.isSome(error), String(exit))
      const failure = (error as Option.Some<IdempotencyError>).value
      assert.instanceOf(failure, IdempotencyError)
      assert.strictEqual(failure.reason, "Unavailable", failure.message)
      assert.include(failure.message, "transfer rejected")
      assert.include(failure.message, second.id)
      // The first element's write went with the transaction.
      assert.strictEqual(yield* dedupRows(first), 0)
      assert.strictEqual(yield* ledgerRows(first.id), 0)
      assert.strictEqual(yield* dedupRows(second), 0)
    }))

  it.effect("BE-JOB-002: commitBatch whose element succeeds after the connection died fails as a whole with IdempotencyError Unavailable", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const exit = yield* exitWithin(store.commitBatch([{ key, effect: Effect.orDie(killOwnBackend) }]))
      assert.deepStrictEqual(defects(exit), [], String(exit))
      const error = Exit.isFailure(exit) ? Cause.findErrorOption(exit.cause) : Option.none()
      assert.isTrue(Option.isSome(error), String(exit))
      const failure = (error as Option.Some<IdempotencyError>).value
      assert.instanceOf(failure, IdempotencyError)
      assert.strictEqual(failure.reason, "Unavailable", failure.message)
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("BE-JOB-002: commitAll whose effect fails after its connection died ends with the effect's own error, not a defect", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const keys = [freshKey(), freshKey()]
      const boom = new Boom({ message: "batch rejected" })
      const exit = yield* exitWithin(store.commitAll(keys, () =>
        Effect.gen(function*() {
          yield* record(keys[0]!.id)
          yield* killOwnBackend
          return yield* boom
        })))
      assert.deepStrictEqual(defects(exit), [], String(exit))
      assert.deepStrictEqual(exit, Exit.fail(boom))
      for (const key of keys) assert.strictEqual(yield* dedupRows(key), 0)
      assert.strictEqual(yield* ledgerRows(keys[0]!.id), 0)
    }))

  it.effect("an interrupted commit whose connection died stays interrupted: the interruption is never turned into a typed failure", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const key = freshKey()
      const killed = yield* Deferred.make<void>()
      const fiber = yield* Effect.forkChild(store.commit(key, Effect.gen(function*() {
        yield* killOwnBackend
        yield* Deferred.succeed(killed, undefined)
        return yield* Effect.never
      })))
      yield* Effect.timeout(Deferred.await(killed), "10 seconds")
      const exit = yield* Effect.timeout(Fiber.interrupt(fiber).pipe(Effect.andThen(Fiber.await(fiber))), "10 seconds")
      assert.isTrue(Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause), String(exit))
      assert.isTrue(Exit.isFailure(exit) && Option.isNone(Cause.findErrorOption(exit.cause)), String(exit))
      assert.strictEqual(yield* dedupRows(key), 0)
    }))

  it.effect("a batch whose elements all succeed on a live connection still commits them all", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const keys = [freshKey(), freshKey()]
      const results = yield* store.commitBatch(keys.map((key) => ({ key, effect: Effect.as(record(key.id), key.id) })))
      assert.deepStrictEqual(results, keys.map((key) => Result.succeed(key.id)))
      for (const key of keys) assert.strictEqual(yield* ledgerRows(key.id), 1)
    }))
})
}

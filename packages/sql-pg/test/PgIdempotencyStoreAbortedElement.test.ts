/**
 * `commitBatch` when an element's effect swallows a failed SQL statement: PostgreSQL has then
 * aborted the whole transaction (every later statement fails with 25P02 until it ends), so the
 * element's `RELEASE SAVEPOINT` fails. The batch must end with a typed failure, not a defect.
 */
import { assert, layer } from "@effect/vitest"
import { IdempotencyError, IdempotencyStore, type Key } from "@jetworker/core/IdempotencyStore"
import { Cause, Data, Effect, Exit, Layer, Option, Result } from "effect"
import { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { database, dedupRows, ledgerRows, record } from "./support.ts"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database()),
  { excludeTestServices: true }
)("PgIdempotencyStore.commitBatch with an element that swallows a SQL error", (it) => {
  it.effect("BE-JOB-002: the batch fails as a whole with a typed IdempotencyError naming the element, records nothing, and the next batch commits", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      const [before, swallowing, after] = [freshKey(), freshKey(), freshKey()]
      const exit = yield* Effect.exit(store.commitBatch<string, Boom, SqlClient.SqlClient>([
        { key: before, effect: Effect.as(record(before.id), "before").pipe(Effect.orDie) },
        {
          key: swallowing,
          effect: Effect.andThen(
            record(swallowing.id).pipe(Effect.orDie),
            SqlClient.SqlClient.use((sql) => sql`SELECT * FROM no_such_table`).pipe(Effect.ignore, Effect.as("swallowed"))
          )
        },
        { key: after, effect: Effect.as(record(after.id), "after").pipe(Effect.orDie) }
      ])).pipe(Effect.timeout("10 seconds"))
      assert.isTrue(Exit.isFailure(exit), String(exit))
      const cause = (exit as Exit.Failure<unknown, unknown>).cause
      assert.isFalse(Cause.hasDies(cause), String(exit))
      assert.isFalse(Cause.hasInterrupts(cause), String(exit))
      const error = Cause.findErrorOption(cause)
      assert.isTrue(Option.isSome(error) && error.value instanceof IdempotencyError, String(exit))
      const failure = (error as Option.Some<IdempotencyError>).value
      // Retryable like `commit`'s aborted COMMIT: what the swallowed statement failed with is unknown here.
      assert.strictEqual(failure.reason, "Unavailable", failure.message)
      assert.include(failure.message, swallowing.id)
      assert.include(failure.message, "25P02")
      assert.match(failure.message, /recovered from a failed SQL statement/)
      for (const key of [before, swallowing, after]) {
        assert.strictEqual(yield* dedupRows(key), 0)
        assert.strictEqual(yield* ledgerRows(key.id), 0)
      }
      // Nothing is left aborted or locked: the same keys commit in the next batch.
      const results = yield* store.commitBatch([before, after].map((key) => ({ key, effect: Effect.as(record(key.id), key.id) })))
      assert.deepStrictEqual(results, [Result.succeed(before.id), Result.succeed(after.id)])
      assert.strictEqual(yield* ledgerRows(before.id), 1)
    }))

  it.effect("an element that swallows a SQL error and then fails with its own error is that element's failure alone", () =>
    Effect.gen(function*() {
      // ROLLBACK TO SAVEPOINT ends the aborted state: the others commit (the existing behaviour, kept).
      const store = yield* IdempotencyStore
      const [good, bad] = [freshKey(), freshKey()]
      const boom = new Boom({ message: "gave up" })
      const results = yield* store.commitBatch<string, Boom, SqlClient.SqlClient>([
        { key: good, effect: Effect.as(record(good.id), "good").pipe(Effect.orDie) },
        {
          key: bad,
          effect: SqlClient.SqlClient.use((sql) => sql`SELECT * FROM no_such_table`).pipe(Effect.ignore, Effect.andThen(Effect.fail(boom)))
        }
      ])
      assert.deepStrictEqual(results, [Result.succeed("good"), Result.fail(boom)])
      assert.strictEqual(yield* dedupRows(good), 1)
      assert.strictEqual(yield* dedupRows(bad), 0)
    }))
})

/**
 * `PgTransaction.withTransaction`: on a live connection it is `sql.withTransaction` (commits what
 * succeeded, rolls back what failed with the failure unchanged, keeps the effect's defects). What
 * it changes, a rollback that failed on a lost connection, is tested through a `FaultProxy` in
 * `ConnectionReset.test.ts`.
 */
import { assert, layer } from "@effect/vitest"
import { Data, Effect, Exit } from "effect"
import { randomUUID } from "node:crypto"
import * as PgTransaction from "../src/PgTransaction.ts"
import { database, ledgerRows, record } from "./support.ts"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

const boom = new Boom({ message: "transfer rejected" })

layer(database(), { excludeTestServices: true })("PgTransaction.withTransaction on a live connection", (it) => {
  it.effect("commits what succeeds, rolls back what fails with its own failure, and keeps an effect's defect as a defect", () =>
    Effect.gen(function*() {
      const committed = randomUUID()
      assert.strictEqual(yield* PgTransaction.withTransaction(Effect.as(record(committed), 7)), 7)
      assert.strictEqual(yield* ledgerRows(committed), 1)

      const failed = randomUUID()
      const failure = yield* Effect.exit(PgTransaction.withTransaction(Effect.andThen(record(failed), Effect.fail(boom))))
      assert.deepStrictEqual(failure, Exit.fail(boom))
      assert.strictEqual(yield* ledgerRows(failed), 0)

      const died = randomUUID()
      const defect = new Error("a bug")
      const dead = yield* Effect.exit(PgTransaction.withTransaction(Effect.andThen(record(died), Effect.die(defect))))
      assert.deepStrictEqual(dead, Exit.die(defect))
      assert.strictEqual(yield* ledgerRows(died), 0)
    }))
})

/**
 * A newcomer who forgets the migrations: a consumer whose idempotency store, attempt store and
 * outbox live on a PostgreSQL schema without jetworker's tables (the real database, an in-memory
 * broker). Before the stores checked their tables, the layers built and every message was
 * dead-lettered at once (the dedup insert failed with SQLSTATE 42P01, `Misconfigured`, permanent).
 * Now building the stores fails with `Migrations.MissingTable`, which names the table, the
 * schema and the fix, so the consumer never starts and nothing is dead-lettered.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { Migrations, PgAttemptStore, PgIdempotencyStore, PgOutbox } from "@jetworker/sql-pg"
import { InMemoryBroker, TestDatabase } from "@jetworker/testing"
import { DateTime, Deferred, Effect, Exit, Fiber, Layer, Option, Schema } from "effect"

const Event = Schema.Struct({ id: Schema.String })

describe("a consumer on a schema without the migrations", () => {
  it.effect("its stores refuse to build (MissingTable naming the table, the schema and jetworker migrate); no message is dead-lettered", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "greeting-1" }))
      const settled = yield* Deferred.make<Outcome.Outcome>()
      const consumer = Consumer.make({
        name: "unmigrated",
        source: broker.source,
        schema: Event,
        metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(0) }),
        handle: (event) => IdempotencyStore.commit(event.id, Effect.void),
        classify: { IdempotencyError: "isRetryable" },
        retry: Retry.exponential({ attempts: 3, base: "10 millis", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.asVoid(Deferred.succeed(settled, outcome))
      })
      // The first outcome, or none within 20 seconds.
      const program = Effect.gen(function*() {
        const running = yield* Effect.forkChild(Consumer.run(consumer))
        const outcome = yield* Deferred.await(settled).pipe(Effect.timeoutOption("20 seconds"))
        yield* Fiber.interrupt(running)
        return outcome
      })
      const stores = Layer.mergeAll(PgIdempotencyStore.layer(), PgAttemptStore.layer(), PgOutbox.layer())
      const exit = yield* Effect.exit(Effect.provide(program, stores))
      assert.deepStrictEqual(
        broker.deadLetters().map((letter) => letter.reason),
        [],
        `dead-lettered because the tables are missing: ${JSON.stringify(Exit.isSuccess(exit) ? Option.getOrUndefined(exit.value) : undefined)}`
      )
      assert.isTrue(Exit.isFailure(exit), "the stores refused to build")
      const error = Exit.isFailure(exit) ? exit.cause.reasons.find((reason) => reason._tag === "Fail")?.error : undefined
      assert.instanceOf(error, Migrations.MissingTable)
      const missing = error as Migrations.MissingTable
      assert.include(["jetworker_dedup", "jetworker_attempts", "jetworker_outbox"], missing.table)
      assert.strictEqual(missing.schema, schema.name)
      assert.include(missing.message, `does not exist in schema "${schema.name}"`)
      assert.include(missing.message, "jetworker migrate")
    }).pipe(Effect.provide(TestDatabase.layer())), 60_000)
})

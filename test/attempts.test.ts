/**
 * The attempts budget counts the handler's failures, not the broker's deliveries (BE-JOB-003):
 * releases (shutdowns that cut a handler, interruptions) do not use attempts up, and a failing
 * message is dead-lettered after exactly the policy's attempts however often the worker restarts.
 * The ledger worker runs as a child process with its PostgreSQL attempt store, against the real
 * NATS and PostgreSQL.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter } from "@jetworker/nats"
import { Migrations, PgAttemptStore } from "@jetworker/sql-pg"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

/** A budget that cuts a handler still running 1.5 s after the signal. */
const cutting = {
  SHUTDOWN_BUDGET: "4 seconds",
  SHUTDOWN_READINESS_GRACE: "200 millis",
  SHUTDOWN_CLOSE: "1300 millis",
  SHUTDOWN_TELEMETRY: "500 millis",
  SHUTDOWN_RESERVE: "500 millis"
}

/**
 * Makes every insert of transfer `id` fail with a serialization failure (SQLSTATE 40001, a
 * transient error), counting the failures in a sequence (which a rollback does not undo).
 */
const makeFailing = Effect.fnUntraced(function*(id: string) {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS test_failing (transfer_id text PRIMARY KEY)`
  yield* sql.unsafe(`CREATE SEQUENCE IF NOT EXISTS test_failures`)
  yield* sql.unsafe(`
    CREATE OR REPLACE FUNCTION test_fail() RETURNS trigger AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM test_failing WHERE transfer_id = NEW.id) THEN
        PERFORM nextval('test_failures');
        RAISE EXCEPTION 'injected transient failure for %', NEW.id USING ERRCODE = '40001';
      END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql`)
  yield* sql.unsafe(`DROP TRIGGER IF EXISTS test_fail ON transfers`)
  yield* sql.unsafe(`CREATE TRIGGER test_fail BEFORE INSERT ON transfers FOR EACH ROW EXECUTE FUNCTION test_fail()`)
  yield* sql`INSERT INTO test_failing (transfer_id) VALUES (${id}) ON CONFLICT DO NOTHING`
})

/** How many injected failures have happened so far. */
const failures = SqlClient.SqlClient.use((sql) =>
  sql<{ readonly n: string }>`SELECT CASE WHEN is_called THEN last_value ELSE 0 END::text AS n FROM test_failures`.pipe(
    Effect.map((rows) => Number(rows[0]?.n ?? 0))
  )
)

describe("attempts budget", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "180 seconds" })((it) => {
    it.effect("BE-JOB-003: transient error budget: a message released by several shutdowns in a row still commits; releases use no attempts", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(10), attempts: 2 })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("released")
        const id = `${p}.t1`
        yield* W.makeSlow(id, 60_000)
        const env = { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...cutting }
        yield* stream.publish("eur", transfer(id, a, b, 1_00), id)
        // Three shutdowns in a row each cut the handler: three deliveries, more than the 2 attempts.
        for (let round = 1; round <= 3; round++) {
          const worker = yield* W.start(env)
          yield* W.waitReceived(worker, id, "20 seconds")
          yield* worker.child.kill("SIGTERM")
          yield* worker.child.waitForExit("15 seconds")
          const tags = (yield* W.outcomes(worker)).filter((o) => o.eventId === id).map((o) => o.tag)
          assert.deepStrictEqual(tags, ["Released"], `round ${round}`)
        }
        yield* W.clearSlow
        const last = yield* W.start(env)
        yield* Eventually.holds(
          "the transfer commits",
          Effect.map(W.outcomes(last), (all) => all.some((o) => o.eventId === id && o.tag !== "Released")),
          "30 seconds"
        )
        const final = (yield* W.outcomes(last)).filter((o) => o.eventId === id).map((o) => o.tag)
        yield* last.child.kill("SIGTERM")
        yield* last.child.waitForExit("15 seconds")
        assert.deepStrictEqual(final, ["Committed"])
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [])
      }))

    it.effect("BE-JOB-003: transient error budget: a failing message is dead-lettered after exactly the policy's attempts, across worker restarts", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({
          ackWait: Duration.seconds(10),
          attempts: 3,
          retryBase: Duration.millis(100),
          inProcessRetries: 0
        })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("failing")
        const id = `${p}.t1`
        yield* makeFailing(id)
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        yield* stream.publish("eur", transfer(id, a, b, 1_00), id)
        // A new worker process for every failed attempt (or so: a worker may fail it again before
        // it is stopped). The dead-letter stream, not a worker's output, says when it is over:
        // a worker stopped right after writing the dead letter may not have printed its outcome.
        const deadLettered = Effect.map(DeadLetter.list(stream.deadLetterStream), (letters) => letters.length > 0).pipe(
          Effect.orElseSucceed(() => false)
        )
        let dead = false
        for (let worker = 1; worker <= 6 && !dead; worker++) {
          const child = yield* W.start(env)
          const before = yield* failures
          yield* Eventually.holds(
            "one more failure or the dead letter",
            Effect.flatMap(deadLettered, (done) => done ? Effect.succeed(true) : Effect.map(failures, (n) => n > before)),
            "30 seconds"
          )
          yield* child.child.kill("SIGTERM")
          yield* child.child.waitForExit("15 seconds")
          dead = yield* deadLettered
        }
        assert.isTrue(dead, "dead-lettered")
        assert.strictEqual(yield* failures, 3, "the handler failed exactly the policy's 3 attempts")
        const letters = yield* DeadLetter.list(stream.deadLetterStream)
        assert.deepStrictEqual(letters.map((l) => [l.eventId, l.reason]), [[id, "AttemptsExhausted"]])
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [])
      }))
  })
})

describe("attempt store settings", () => {
  layer(Layer.effectDiscard(Migrations.run).pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })((it) => {
    it.effect("BE-JOB-003: purge refuses a negative or infinite olderThan, never deleting a count recorded just now", () =>
      Effect.gen(function*() {
        const store = yield* PgAttemptStore.make()
        const key = { scope: "orders", id: "evt-purge-negative" }
        yield* store.recordFailure(key)
        yield* store.recordFailure(key)
        for (const olderThan of ["-1 hour", "Infinity"] as const) {
          const outcome = yield* Effect.result(PgAttemptStore.purge({ olderThan, limit: 1000 }))
          assert.isTrue(outcome._tag === "Failure", `purge({ olderThan: ${JSON.stringify(olderThan)} }) ran: ${JSON.stringify(outcome)}`)
          if (outcome._tag === "Failure") assert.include(outcome.failure.message, "olderThan must be a finite duration of at least 0")
          assert.strictEqual((yield* store.read(key)).failures, 2, `purge({ olderThan: ${JSON.stringify(olderThan)} }) deleted a live count`)
        }
      }))

    it.effect("an invalid attempts table name is reported as the attempts table's, not the idempotency table's", () =>
      Effect.gen(function*() {
        const made = yield* Effect.flip(PgAttemptStore.make({ table: "Attempts-Table" }))
        const purged = yield* Effect.flip(PgAttemptStore.purge({ table: "Attempts-Table", olderThan: "1 hour", limit: 10 }))
        for (const error of [made, purged]) {
          assert.include(error.message, `invalid attempts table name "Attempts-Table"`)
          assert.notInclude(error.message, "idempotency")
        }
      }))
  })
})

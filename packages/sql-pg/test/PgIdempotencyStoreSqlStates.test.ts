/**
 * SQLSTATEs that fail the same way on every attempt must not be classified `Unavailable`
 * (retryable): a data or program error becomes `InvalidData` (dead-lettered at once), an
 * unsupported feature `Misconfigured`. Checked against the real PostgreSQL for the errors a
 * commit meets (a trigger's `RAISE EXCEPTION`, a scalar subquery of many rows, an index row too
 * big, a view's check option, a function without `RETURN`, an unsupported `FOR UPDATE`), and
 * `commitStatement`'s wording of a statement's own error.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { IdempotencyError, IdempotencyStore, type Key } from "@jetworker/core/IdempotencyStore"
import { Effect, Layer } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { randomBytes, randomUUID } from "node:crypto"
import { reasonForSqlState } from "../src/internal/errors.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { database, dedupRows, ledgerRows } from "./support.ts"

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database()),
  { excludeTestServices: true }
)("PgIdempotencyStore deterministic SQLSTATEs", (it) => {
  /** Runs `statement` through commitStatement; its failure, which must be an IdempotencyError. */
  const statementError = (key: Key, statement: (sql: SqlClient.SqlClient, fresh: Statement.Fragment) => Statement.Fragment) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, (fresh) => statement(sql, fresh)))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual(yield* dedupRows(key), 0)
      return error
    })

  it.effect("BE-JOB-003: a trigger's RAISE EXCEPTION (P0001) is InvalidData, not a retryable outage", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(`CREATE TABLE guarded (note text NOT NULL)`)
      yield* sql.unsafe(`CREATE FUNCTION jw_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refused: %', NEW.note; END $$`)
      yield* sql.unsafe(`CREATE TRIGGER guarded_refuse BEFORE INSERT ON guarded FOR EACH ROW EXECUTE FUNCTION jw_refuse()`)
      const key = freshKey()
      const error = yield* statementError(key, (sql, fresh) => sql`INSERT INTO guarded (note) SELECT ${key.id} WHERE ${fresh}`)
      assert.strictEqual(error.reason, "InvalidData", error.message)
      assert.include(error.message, "P0001")
      // The same through commit: a deferred constraint trigger raising at COMMIT is the store's own failure.
      yield* sql.unsafe(`CREATE TABLE guarded_late (note text NOT NULL)`)
      yield* sql.unsafe(`CREATE CONSTRAINT TRIGGER guarded_late_refuse AFTER INSERT ON guarded_late
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION jw_refuse()`)
      const store = yield* IdempotencyStore
      const late = freshKey()
      const commitError = yield* Effect.flip(store.commit(late, sql`INSERT INTO guarded_late (note) VALUES (${late.id})`))
      assert.instanceOf(commitError, IdempotencyError)
      assert.strictEqual((commitError as IdempotencyError).reason, "InvalidData", commitError.message)
      assert.strictEqual(yield* dedupRows(late), 0)
    }))

  it.effect("BE-JOB-003: a scalar subquery returning many rows (21000) is InvalidData", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const error = yield* statementError(
        key,
        (sql, fresh) =>
          sql`INSERT INTO ledger (note) SELECT (SELECT n FROM (VALUES ('a'), ('b')) AS v(n)) WHERE ${fresh}`
      )
      assert.strictEqual(error.reason, "InvalidData", error.message)
      assert.include(error.message, "21000")
    }))

  it.effect("BE-JOB-003: an id too big for the dedup table's index (54000) is InvalidData", () =>
    Effect.gen(function*() {
      const store = yield* IdempotencyStore
      // Random, so incompressible: far over the 2704 bytes a btree row may hold.
      const key: Key = { scope: "ledger-applier", id: randomBytes(12_000).toString("base64") }
      const error = yield* Effect.flip(store.commit(key, Effect.void))
      assert.instanceOf(error, IdempotencyError)
      assert.strictEqual((error as IdempotencyError).reason, "InvalidData", error.message)
      assert.include(error.message, "54000")
      assert.isFalse((error as IdempotencyError).isRetryable)
    }))

  it.effect("BE-JOB-003: a view's WITH CHECK OPTION violated (44000) and a function ended without RETURN (2F005) are InvalidData", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(`CREATE VIEW ok_notes AS SELECT * FROM ledger WHERE note LIKE 'ok%' WITH CHECK OPTION`)
      yield* sql.unsafe(`CREATE FUNCTION jw_no_return(t text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN END $$`)
      const checked = freshKey()
      const checkError = yield* statementError(checked, (sql, fresh) => sql`INSERT INTO ok_notes (note) SELECT ${checked.id} WHERE ${fresh}`)
      assert.strictEqual(checkError.reason, "InvalidData", checkError.message)
      assert.include(checkError.message, "44000")
      const unreturned = freshKey()
      const routineError = yield* statementError(
        unreturned,
        (sql, fresh) => sql`INSERT INTO ledger (note) SELECT jw_no_return(${unreturned.id}) WHERE ${fresh}`
      )
      assert.strictEqual(routineError.reason, "InvalidData", routineError.message)
      assert.include(routineError.message, "2F005")
    }))

  it.effect("BE-JOB-003: a feature PostgreSQL does not support (0A000) is Misconfigured, worded as the statement's own error", () =>
    Effect.gen(function*() {
      const key = freshKey()
      const error = yield* statementError(
        key,
        (sql, fresh) => sql`UPDATE ledger SET note = ${key.id} WHERE id = (SELECT max(id) FROM ledger FOR UPDATE) AND ${fresh}`
      )
      assert.strictEqual(error.reason, "Misconfigured", error.message)
      assert.include(error.message, "0A000")
      assert.notMatch(error.message, /migrations/)
    }))

  it.effect("commitStatement words an error of the statement itself as the statement's, not as a missing dedup table, even inside a transaction", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const own = (fresh: Statement.Fragment) => sql`INSERT INTO no_such_business_table (note) SELECT ${key.id} WHERE ${fresh}`
      const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, own))
      assert.strictEqual(error.reason, "Misconfigured", error.message)
      assert.include(error.message, "42P01")
      assert.match(error.message, /commitStatement: PostgreSQL refused the statement/)
      assert.notMatch(error.message, /migrations/)
      // Inside a transaction (aborted by the failure) the same.
      const inside = yield* Effect.flip(sql.withTransaction(PgIdempotencyStore.commitStatement(key, own)))
      assert.instanceOf(inside, IdempotencyError)
      assert.notMatch(inside.message, /migrations/, inside.message)
      // The dedup table's own problem still says to run the migrations.
      const missing = yield* Effect.flip(
        PgIdempotencyStore.commitStatement(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}`, {
          table: "missing_dedup"
        })
      )
      assert.strictEqual(missing.reason, "Misconfigured")
      assert.match(missing.message, /missing_dedup.*run the jetworker migrations/s)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))
})

describe("PgIdempotencyStore SQLSTATE classes", () => {
  it("BE-JOB-003: data and program errors are InvalidData, unsupported features and configuration Misconfigured", () => {
    const expected: ReadonlyArray<readonly [string, IdempotencyError["reason"]]> = [
      ["P0001", "InvalidData"], // RAISE EXCEPTION
      ["P0004", "InvalidData"], // ASSERT failed
      ["21000", "InvalidData"], // cardinality violation
      ["54000", "InvalidData"], // program limit exceeded (index row too big)
      ["54001", "InvalidData"], // statement too complex
      ["44000", "InvalidData"], // WITH CHECK OPTION violation
      ["27000", "InvalidData"], // triggered data change violation
      ["2F005", "InvalidData"], // function ended without RETURN
      ["09000", "InvalidData"], // triggered action exception
      ["20000", "InvalidData"], // CASE not found
      ["38001", "InvalidData"], // external routine: containing SQL not permitted
      ["39004", "InvalidData"], // external routine invocation: null value not allowed
      ["22012", "InvalidData"], // division by zero
      ["0A000", "Misconfigured"], // feature not supported
      ["3D000", "Misconfigured"], // invalid catalog name (no such database)
      ["F0000", "Misconfigured"], // configuration file error
      ["42P01", "Misconfigured"],
      // Unchanged: a connection lost, resources short, a system error, a rollback asked of the transaction.
      ["08006", "Unavailable"],
      ["57P01", "Unavailable"],
      ["53100", "Unavailable"],
      ["58030", "Unavailable"],
      ["25P02", "Unavailable"],
      ["25006", "Unavailable"], // read-only transaction: a standby, until failover ends
      ["40001", "Conflict"],
      ["40P01", "Conflict"],
      ["55P03", "Conflict"],
      ["57014", "Conflict"]
    ]
    for (const [code, reason] of expected) assert.strictEqual(reasonForSqlState(code), reason, code)
  })
})

/**
 * `commitStatement`'s check of the statement it embeds in `WITH jetworker_fresh AS (...),
 * jetworker_effect AS (<statement>) SELECT ...`: it must see the statement as PostgreSQL does.
 * PostgreSQL nests block comments, so a SELECT after a nested comment that merely mentions INSERT
 * is a SELECT (which PostgreSQL would skip, recording the key alone); a `)` too many closes the
 * WITH query, and what follows it runs as a WITH query of its own, unguarded, on every delivery; a
 * guard inside a comment or quoted text guards nothing.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { IdempotencyStore, isAlreadyCommitted, type Key } from "@jetworker/core/IdempotencyStore"
import { Effect, Layer } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { randomUUID } from "node:crypto"
import { problem } from "../src/internal/statementGuard.ts"
import * as PgIdempotencyStore from "../src/PgIdempotencyStore.ts"
import { database, dedupRows, ledgerRows, record } from "./support.ts"

const freshKey = (): Key => ({ scope: "ledger-applier", id: randomUUID() })

layer(
  Layer.provideMerge(PgIdempotencyStore.layer(), database()),
  { excludeTestServices: true }
)("PgIdempotencyStore.commitStatement's statement check", (it) => {
  /** Asserts commitStatement refuses `statement` (Misconfigured, message matching `about`) and records nothing. */
  const refuses = (key: Key, statement: (fresh: Statement.Fragment) => Statement.Fragment, about: RegExp) =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, statement))
      assert.strictEqual(error.reason, "Misconfigured", error.message)
      assert.match(error.message, about)
      assert.strictEqual(yield* dedupRows(key), 0)
    })

  it.effect("BE-JOB-002: a SELECT behind nested comments is not taken for an INSERT", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(
        `CREATE OR REPLACE FUNCTION jw_guard_note(n text) RETURNS void LANGUAGE sql AS $$ INSERT INTO ledger (note) VALUES (n) $$`
      )
      const key = freshKey()
      yield* refuses(key, (fresh) => sql`/* /* */ insert */ SELECT jw_guard_note(${key.id}) WHERE ${fresh}`, /INSERT, UPDATE or DELETE/)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("BE-JOB-002: a statement whose parentheses close the WITH query is refused, so nothing runs unguarded on a duplicate", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const store = yield* IdempotencyStore
      const key = freshKey()
      const victim = `${key.id}/victim`
      yield* record(victim)
      // The key is committed: a redelivery's statement must do nothing at all.
      yield* store.commit(key, Effect.void)
      const error = yield* Effect.flip(PgIdempotencyStore.commitStatement(key, (fresh) =>
        sql`INSERT INTO ledger (note) SELECT ${key.id} WHERE ${fresh}), jetworker_evil AS (DELETE FROM ledger WHERE note = ${victim}`))
      assert.strictEqual(error.reason, "Misconfigured", error.message)
      assert.match(error.message, /parenthes/)
      assert.strictEqual(yield* ledgerRows(victim), 1, "the unguarded DELETE ran")
      // An opening parenthesis too many, or a comment or quote left open, is refused the same way.
      const other = freshKey()
      yield* refuses(other, (fresh) => sql`INSERT INTO ledger (note) SELECT (${other.id} WHERE ${fresh}`, /parenthes/)
      yield* refuses(other, (fresh) => sql`INSERT INTO ledger (note) SELECT ${other.id} WHERE ${fresh} /* open`, /comment or quoted/)
      yield* refuses(other, (fresh) => sql`INSERT INTO ledger (note) SELECT ${other.id} WHERE ${fresh} AND note = 'open`, /comment or quoted/)
    }))

  it.effect("BE-JOB-002: a guard inside a comment or a string guards nothing and is refused", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      yield* refuses(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} /* ${fresh} */`, /fresh/)
      yield* refuses(key, (fresh) => sql`INSERT INTO ledger (note) SELECT ${key.id} -- ${fresh}`, /fresh/)
      yield* refuses(key, (fresh) => sql`INSERT INTO ledger (note) SELECT $$${fresh}$$`, /fresh/)
      assert.strictEqual(yield* ledgerRows(key.id), 0)
    }))

  it.effect("parentheses and comment marks inside quotes, identifiers, dollar quotes and comments are text, and nested comments are skipped whole", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const key = freshKey()
      const note = `${key.id}:'))')'`
      const statement = (fresh: Statement.Fragment) =>
        sql`/* outer /* inner ) */ still ( outer */
  -- a ( comment
  INSERT INTO "ledger" (note) SELECT ${key.id} || ':' || E'\\')' || $x$)$x$ || $$'$$ || ')' || '''' AS "odd)name" WHERE ${fresh} -- trailing )`
      assert.isUndefined(yield* PgIdempotencyStore.commitStatement(key, statement))
      assert.strictEqual(yield* ledgerRows(note), 1)
      assert.isTrue(isAlreadyCommitted(yield* PgIdempotencyStore.commitStatement(key, statement)))
      assert.strictEqual(yield* ledgerRows(note), 1)
    }))
})

describe("StatementGuard.problem", () => {
  const guard: Statement.Segment = { _tag: "Literal", value: "EXISTS (SELECT 1 FROM jetworker_fresh)" }
  const literal = (value: string): Statement.Segment => ({ _tag: "Literal", value })
  const parameter: Statement.Segment = { _tag: "Parameter", value: 1 }
  /** The problem of `before <guard> after`. */
  const check = (before: string, after = "") => problem([literal(before), guard, literal(after)], guard)

  it("accepts the statements PostgreSQL reads as one data-modifying statement with its guard in code", () => {
    for (
      const [before, after] of [
        ["INSERT INTO t (a) SELECT 1 WHERE ", ""],
        ["\n  -- a comment ( \n  /* once */ update t SET a = 1 WHERE ", ""],
        ["/* a /* b ) */ c ( */ Delete FROM t WHERE ", " -- trailing ("],
        ["INSERT INTO t (a) SELECT E'\\')' || 'it''s (' || U&'(' || $a$ ) $ $a$ || $$($$ WHERE ", ""],
        ["INSERT INTO \"t\"\"(\" (a$b) SELECT a$b FROM u WHERE ", " AND a$b$ = 1"],
        // `WHERE'...'`: the E ends a keyword, so this is a standard string, where a backslash is text.
        ["INSERT INTO t (a) SELECT 1 FROM u WHERE'\\' = a AND ", ""],
        ["insert\tINTO t VALUES ((SELECT 1 WHERE ", "))"]
      ] as const
    ) {
      assert.isUndefined(check(before, after), `${before}<guard>${after}`)
    }
    // A parameter, then the guard: both opaque tokens.
    assert.isUndefined(problem([literal("INSERT INTO t (a) SELECT "), parameter, literal(" WHERE "), guard], guard))
  })

  it("refuses what is not one guarded INSERT, UPDATE or DELETE as PostgreSQL reads it", () => {
    const cases: ReadonlyArray<readonly [string, string, ReturnType<typeof problem>]> = [
      ["SELECT f() WHERE ", "", "NotDataModifying"],
      ["WITH x AS (SELECT 1) INSERT INTO t SELECT 1 WHERE ", "", "NotDataModifying"],
      ["/* /* */ insert */ SELECT f() WHERE ", "", "NotDataModifying"],
      ["inserted_rows WHERE ", "", "NotDataModifying"],
      ["\"insert\" WHERE ", "", "NotDataModifying"],
      ["INSERT INTO t SELECT 1 WHERE ", "), evil AS (DELETE FROM t", "Unbalanced"],
      ["INSERT INTO t SELECT (1 WHERE ", "", "Unbalanced"],
      ["INSERT INTO t SELECT 1 WHERE ", " /* /* */", "Unterminated"],
      ["INSERT INTO t SELECT 1 WHERE ", " AND a = E'\\'", "Unterminated"],
      ["INSERT INTO t SELECT $q$ WHERE ", "", "GuardUnused"],
      ["INSERT INTO t SELECT 1 -- ", "", "GuardUnused"],
      ["INSERT INTO t SELECT 1 /* ", " */", "GuardUnused"],
      ["INSERT INTO t SELECT '", "'", "GuardUnused"]
    ]
    for (const [before, after, expected] of cases) assert.strictEqual(check(before, after), expected, `${before}<guard>${after}`)
    assert.strictEqual(problem([literal("INSERT INTO t SELECT 1")], guard), "GuardUnused")
    assert.strictEqual(problem([parameter, literal(" INSERT INTO t SELECT 1 WHERE "), guard], guard), "NotDataModifying")
  })
})

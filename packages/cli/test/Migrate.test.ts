/**
 * `jetworker migrate` as an operator runs it: a child process against the real PostgreSQL, its
 * exit code and output.
 */
import { assert, describe, it } from "@effect/vitest"
import { Migrations } from "@jetworker/sql-pg"
import { TestDatabase } from "@jetworker/testing"
import { Effect, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"

// Every test gets its own empty schema: migrations are about the state before and after them.
const Fresh = TestDatabase.layer({ maxConnections: 6 })

/** The tables of the test schema and the recorded migrations. */
const inventory = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const tables = yield* sql<{ readonly name: string }>`SELECT table_name AS name FROM information_schema.tables
    WHERE table_schema = current_schema() ORDER BY table_name`
  const recorded = yield* sql<{ readonly id: number; readonly name: string }>`SELECT migration_id AS id, name
    FROM jetworker_migrations ORDER BY migration_id`
  return { tables: tables.map((row) => row.name), recorded: recorded.map((row) => [row.id, row.name] as const) }
})

const expected = {
  tables: ["jetworker_attempts", "jetworker_dedup", "jetworker_migrations", "jetworker_outbox"],
  recorded: [[1, "jetworker_dedup"], [2, "jetworker_attempts"], [3, "jetworker_outbox"], [4, "jetworker_outbox_unique_id"], [5, "jetworker_attempts_dead_letter"]] as ReadonlyArray<readonly [number, string]>
}

interface Run {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

const jetworkerBin = fileURLToPath(new URL("../src/bin/jetworker.ts", import.meta.url))

/** Runs the migrate command with `DATABASE_URL` (bounded: killed after 20 seconds). */
const runBin = (databaseUrl: string, args: ReadonlyArray<string> = []): Effect.Effect<Run> =>
  Effect.callback<Run>((resume) => {
    const child = execFile(
      process.execPath,
      [jetworkerBin, "migrate", ...args],
      { env: { ...process.env, DATABASE_URL: databaseUrl }, timeout: 20_000 },
      (error, stdout, stderr) =>
        resume(Effect.succeed({
          code: error === null ? 0 : typeof error.code === "number" ? error.code : -1,
          stdout,
          stderr
        }))
    )
    return Effect.sync(() => child.kill())
  })

describe("jetworker migrate", () => {
  it.live("applies the migrations to DATABASE_URL, prints what it applied and exits 0; a second run is up to date", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      // The URL's `options` parameter puts the command's session in the test schema.
      const url = `${Redacted.value(schema.url)}?options=${encodeURIComponent(`-csearch_path=${schema.name}`)}`
      // The first line names the database (see MigrateTarget.test.ts).
      const where = `jetworker migrations: database "test" on 127.0.0.1:5432, schema "${schema.name}"\n`
      const first = yield* runBin(url)
      assert.deepStrictEqual(first, { code: 0, stdout: where + "jetworker migrations: applied 1_jetworker_dedup\njetworker migrations: applied 2_jetworker_attempts\njetworker migrations: applied 3_jetworker_outbox\njetworker migrations: applied 4_jetworker_outbox_unique_id\njetworker migrations: applied 5_jetworker_attempts_dead_letter\n", stderr: "" })
      const second = yield* runBin(url)
      assert.deepStrictEqual(second, { code: 0, stdout: `${where}jetworker migrations: up to date\n`, stderr: "" })
      assert.deepStrictEqual(yield* inventory, expected)
    }).pipe(Effect.provide(Fresh)))

  it.live("fails with a readable one-line reason and exit code 1, never printing the URL or its password", () =>
    Effect.gen(function*() {
      const run = yield* runBin("postgres://postgres:s3cret-pw@127.0.0.1:1/test")
      assert.strictEqual(run.code, 1)
      assert.strictEqual(run.stdout, "")
      assert.match(
        run.stderr,
        /^jetworker migrations failed: database error \(ConnectionError\): .*ECONNREFUSED.*\nnext step: check DATABASE_URL .*\n$/
      )
      assert.notInclude(run.stderr, "s3cret-pw")
      assert.notInclude(run.stderr, "postgres://")
    }))

  it.live("a table in the way fails the run as a whole: nothing applied, the PostgreSQL error and a next step printed", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const sql = yield* SqlClient.SqlClient
      // A table of the dedup table's name without its columns: the index on committed_at fails.
      yield* sql`CREATE TABLE jetworker_dedup (key text PRIMARY KEY)`
      const run = yield* runBin(`${Redacted.value(schema.url)}?options=${encodeURIComponent(`-csearch_path=${schema.name}`)}`)
      assert.strictEqual(run.code, 1, run.stderr)
      const [reason, next, rest] = run.stderr.split("\n")
      assert.match(reason ?? "", /^jetworker migrations failed: Migration "1_jetworker_dedup" failed: .*committed_at.*does not exist/)
      assert.match(next ?? "", /^next step: nothing was applied; fix the cause above and run again/)
      assert.strictEqual(rest, "")
      const recorded = yield* sql<{ readonly id: number }>`SELECT migration_id AS id FROM jetworker_migrations`
      assert.deepStrictEqual(recorded, [])
      const tables = yield* sql<{ readonly name: string }>`SELECT table_name AS name FROM information_schema.tables
        WHERE table_schema = current_schema() ORDER BY table_name`
      assert.deepStrictEqual(tables.map((t) => t.name), ["jetworker_dedup", "jetworker_migrations"])
    }).pipe(Effect.provide(Fresh)))

  it.live("a user who may not create tables is told to run it as one who may", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const sql = yield* SqlClient.SqlClient
      // A login role of this test's own (roles are cluster-wide), without CREATE on the schema.
      const role = `${schema.name}_reader`
      yield* sql.unsafe(`CREATE ROLE "${role}" LOGIN`)
      yield* Effect.addFinalizer(() => Effect.ignore(sql.unsafe(`DROP ROLE IF EXISTS "${role}"`)))
      yield* sql.unsafe(`GRANT USAGE ON SCHEMA "${schema.name}" TO "${role}"`)
      yield* Effect.addFinalizer(() => Effect.ignore(sql.unsafe(`REVOKE ALL ON SCHEMA "${schema.name}" FROM "${role}"`)))
      const url = new URL(Redacted.value(schema.url))
      url.username = role
      url.password = ""
      url.searchParams.set("options", `-csearch_path=${schema.name}`)
      const run = yield* runBin(url.toString())
      assert.strictEqual(run.code, 1, run.stderr)
      assert.match(run.stderr, /^jetworker migrations failed: database error \(AuthorizationError\): .*permission denied/)
      assert.include(run.stderr, "\nnext step: run this command as a user that may create tables in the schema")
    }).pipe(Effect.scoped, Effect.provide(Fresh)))

  it.live("prints the SQL with --sql, without connecting", () =>
    Effect.gen(function*() {
      const run = yield* runBin("postgres://postgres@127.0.0.1:1/test", ["--sql"])
      assert.deepStrictEqual(run, { code: 0, stdout: `${Migrations.script}\n`, stderr: "" })
    }))

  it.live("rejects unknown arguments with usage and exit code 2", () =>
    Effect.gen(function*() {
      const run = yield* runBin("postgres://postgres@127.0.0.1:1/test", ["--force"])
      assert.strictEqual(run.code, 2)
      assert.include(run.stderr, "--force")
    }))
})

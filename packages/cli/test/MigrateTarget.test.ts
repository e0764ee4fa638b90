/**
 * `jetworker migrate` names the database it migrated (host, port, database, schema; never the
 * password), and its --help says which one it takes when DATABASE_URL is not set.
 *
 * Before: with DATABASE_URL unset it silently migrated the default
 * `postgres://postgres@127.0.0.1:5432/test` and printed "up to date" without naming the database;
 * --help said only "DATABASE_URL".
 */
import { assert, describe, it } from "@effect/vitest"
import * as Migrate from "@jetworker/cli/Migrate"
import { TestDatabase } from "@jetworker/testing"
import { Effect, Redacted } from "effect"
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"

const bin = fileURLToPath(new URL("../src/bin/jetworker.ts", import.meta.url))

/** Runs `jetworker migrate ...args` with `DATABASE_URL` (bounded: killed after 20 seconds). */
const runBin = (databaseUrl: string, args: ReadonlyArray<string> = []) =>
  Effect.callback<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      process.execPath,
      [bin, "migrate", ...args],
      { env: { ...process.env, DATABASE_URL: databaseUrl }, timeout: 20_000 },
      (error, stdout, stderr) =>
        resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout, stderr }))
    )
    return Effect.sync(() => child.kill())
  })

describe("jetworker migrate names its database", () => {
  it.live("prints the host, port, database and schema it migrated, before what it applied, and never the URL", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const url = new URL(Redacted.value(schema.url))
      url.searchParams.set("options", `-csearch_path=${schema.name}`)
      const first = yield* runBin(url.toString())
      assert.strictEqual(first.code, 0, first.stderr)
      const where = `jetworker migrations: database "${url.pathname.slice(1)}" on ${url.hostname}:${url.port || "5432"}, schema "${schema.name}"`
      const lines = first.stdout.split("\n")
      assert.strictEqual(lines[0], where)
      assert.strictEqual(lines[1], "jetworker migrations: applied 1_jetworker_dedup")
      const second = yield* runBin(url.toString())
      assert.strictEqual(second.stdout, `${where}\njetworker migrations: up to date\n`)
      assert.notInclude(first.stdout + second.stdout, "postgres://")
      if (url.password !== "") assert.notInclude(first.stdout + second.stdout, url.password)
    }).pipe(Effect.provide(TestDatabase.layer({ maxConnections: 2 }))))

  it("says when the database is the default because DATABASE_URL is not set", () => {
    assert.strictEqual(
      Migrate.describeTarget({ host: "127.0.0.1", port: "5432", database: "test", schema: "public", fromDefault: true }),
      `jetworker migrations: database "test" on 127.0.0.1:5432, schema "public" ` +
        `(DATABASE_URL is not set: the default, ${Migrate.defaultUrl})`
    )
  })

  it.live("--help states the default database", () =>
    Effect.gen(function*() {
      const help = yield* runBin("postgres://postgres@127.0.0.1:1/test", ["--help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, "DATABASE_URL")
      assert.include(help.stdout, "default postgres://postgres@127.0.0.1:5432/test")
    }))
})

/**
 * The README's "Your first consumer" program, run as a newcomer runs it (a child process against
 * the real NATS and PostgreSQL, in a schema of its own): it ships each order once, dead-letters
 * the unknown SKU, takes the republished order as a duplicate, says when it has drained the
 * backlog, and exits 0 on SIGTERM.
 */
import { assert, describe, layer } from "@effect/vitest"
import { ChildWorker, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { fileURLToPath } from "node:url"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"

const program = fileURLToPath(new URL("../examples/first-consumer/src/main.ts", import.meta.url))

describe("your first consumer", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("the README's first consumer ships each order once, dead-letters the unknown SKU, and exits 0 on SIGTERM", () =>
      Effect.gen(function*() {
        const schema = yield* TestDatabase.TestSchema
        const child = yield* ChildWorker.spawn({
          script: program,
          env: { NATS_URL: natsUrl, DATABASE_URL: databaseUrl, DATABASE_SCHEMA: schema.name, HEALTH_PORT: "0", HEALTH_HOST: "127.0.0.1" }
        })
        const deadLettered = yield* child.waitForLine((line) => line.includes("PermanentError: UnknownSku: unknown SKU unicorn"), "30 seconds")
        const run = /\(order-([a-z0-9]+)-2\)/.exec(deadLettered)?.[1]
        assert.isDefined(run, deadLettered)
        yield* child.waitForLine(
          (line) => line.includes("consumer order-shipping drained its backlog (4 settled: 2 Committed, 1 Duplicate, 1 DeadLettered)"),
          "30 seconds"
        )
        yield* child.kill("SIGTERM")
        const exit = yield* child.waitForExit("20 seconds")
        assert.deepStrictEqual(exit, { code: 0, signal: null })
        const sql = yield* SqlClient.SqlClient
        const shipped = yield* sql<{ readonly order_id: string; readonly sku: string; readonly quantity: number }>`
          SELECT order_id, sku, quantity FROM shipments WHERE order_id LIKE ${`${run}-%`} ORDER BY order_id`
        // Order 0 was published twice: shipped once. Order 2's SKU is unknown: not shipped.
        assert.deepStrictEqual(shipped.map((row) => [row.order_id, row.sku, row.quantity]), [[`${run}-0`, "book", 2], [`${run}-1`, "lamp", 1]])
        const lines = yield* child.lines
        assert.isTrue(lines.some((line) => line.includes(`"message":"shutdown.completed","result":"success"`)))
      }))

    it.effect("with a database it cannot reach, the first consumer waits for it until STARTUP_TIMEOUT, then stops with a line that says what to check", () =>
      Effect.gen(function*() {
        const child = yield* ChildWorker.spawn({
          script: program,
          env: {
            NATS_URL: natsUrl,
            DATABASE_URL: "postgres://postgres@127.0.0.1:1/test",
            HEALTH_PORT: "0",
            HEALTH_HOST: "127.0.0.1",
            STARTUP_TIMEOUT: "2 seconds"
          }
        })
        const waiting = yield* child.waitForLine((line) => line.includes(`"message":"startup.waiting"`), "30 seconds")
        const tried = JSON.parse(waiting) as { readonly dependency?: string; readonly error?: string }
        assert.strictEqual(tried.dependency, "postgres")
        // The driver's reason, which names the address, in the line itself.
        assert.include(tried.error ?? "", "ECONNREFUSED 127.0.0.1:1", waiting)
        const failed = yield* child.waitForLine((line) => line.includes(`"message":"worker.failed"`), "30 seconds")
        const entry = JSON.parse(failed) as { readonly nextStep?: string }
        assert.include(entry.nextStep ?? "", "check DATABASE_URL", failed)
        const exit = yield* child.waitForExit("30 seconds")
        assert.notStrictEqual(exit.code, 0)
      }))
  })
})

/**
 * Programs of this repository started on a database and schema nobody migrated, as a newcomer's
 * first run is: the PostgreSQL stores' layers check their tables as they are built
 * (`Migrations.MissingTable`), so the migrations must run beneath those layers, not later in the
 * program. The reference worker (`LedgerWorker.WorkerLive`, jetworker's and the ledger's
 * migrations) and the getting-started guide's program (`test/fixtures/packed-app/src/main.ts`, run
 * here from source; `test/packages.test.ts` runs it from the tarballs) each start and commit a
 * message. Each test has a fresh schema of its own.
 */
import { assert, describe, it } from "@effect/vitest"
import { DeadLetter, MaxDeliveries, NatsConnection } from "@jetworker/nats"
import { ChildWorker, TestDatabase, TestStream } from "@jetworker/testing"
import { Duration, Effect, Layer, Redacted } from "effect"
import { fileURLToPath } from "node:url"
import { settingsFor, transfer, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseUrl, NatsLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const packedApp = fileURLToPath(new URL("./fixtures/packed-app/src/main.ts", import.meta.url))

/** NATS, and a client on a fresh schema without any table. */
const Fresh = Layer.merge(NatsLive, TestDatabase.layer())

describe("a program started on a schema without the migrations", () => {
  it.live("the reference worker runs both sets of migrations beneath its stores, becomes ready and applies a transfer", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const stream = yield* TestStream.make({ ackWait: "2 seconds" })
      const settings = settingsFor(stream, { ackWait: Duration.seconds(2) })
      const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
      // Ready, or stopped at start-up (MissingTable when the stores are built before the migrations).
      const first = yield* worker.waitForLog("worker.ready", "30 seconds").pipe(
        Effect.raceFirst(worker.waitForLog("worker.failed", "30 seconds"))
      )
      assert.strictEqual(first.message, "worker.ready", JSON.stringify(first))
      // The ledger's tables exist now (its accounts are opened here), and so do jetworker's.
      const { p, a, b } = yield* twoAccounts("fresh-schema")
      const id = `${p}.t1`
      yield* stream.publish("eur", transfer(id, a, b, 10_00), id)
      const line = yield* worker.child.waitForLine((l) => l.startsWith("outcome ") && l.includes(JSON.stringify(id)), "20 seconds")
      assert.include(line, `"tag":"Committed"`)
      yield* worker.child.kill("SIGTERM")
      assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
    }).pipe(Effect.provide(Fresh), Effect.scoped), 90_000)

  it.live("the getting-started guide's program (from source) migrates beneath its store, commits its greeting and exits 0", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const stream = `FRESH_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
      const { manager } = yield* NatsConnection.NatsConnection
      // The program declares its stream; its consumer ("greeter") adds its dead-letter and capture streams.
      yield* Effect.addFinalizer(() =>
        Effect.forEach(
          [stream, DeadLetter.destination(stream, "greeter").stream, MaxDeliveries.captureStream(stream, "greeter")],
          (name) => Effect.promise(() => manager.streams.delete(name).catch(() => false)),
          { discard: true }
        )
      )
      const child = yield* ChildWorker.spawn({
        script: packedApp,
        env: {
          NATS_URL: natsUrl,
          DATABASE_URL: `${Redacted.value(schema.url)}?options=${encodeURIComponent(`-csearch_path=${schema.name}`)}`,
          APP_STREAM: stream,
          HEALTH_PORT: "0",
          HEALTH_HOST: "127.0.0.1"
        }
      })
      const exit = yield* child.waitForExit("60 seconds")
      const output = (yield* child.lines).join("\n")
      assert.deepStrictEqual(exit, { code: 0, signal: null }, output)
      assert.include(output, `"message":"greeting Committed: from the tarballs"`)
    }).pipe(Effect.provide(Fresh), Effect.scoped), 90_000)
})

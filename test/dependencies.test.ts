/**
 * A dependency lost while the worker runs, as an operator sees it: the ledger worker as a child
 * process reaches PostgreSQL through a TCP proxy on loopback; cutting it takes readiness down and
 * writes one `dependency.down` warning with the reason, and restoring it brings readiness back
 * with one `dependency.up` line.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseProxy, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("dependencies", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("PostgreSQL lost and back: readiness follows it, and the log says so once each way, with the reason", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { proxy, url } = yield* databaseProxy
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, url, natsUrl), HEALTH_HOST: "127.0.0.1" })
        yield* W.waitReady(worker)
        yield* proxy.cut
        const unready = yield* Eventually.poll("readiness 503", worker.get("/healthz/ready"), (r) => r.status === 503, {
          timeout: "20 seconds",
          interval: "100 millis"
        })
        assert.include(unready.body, `"name":"postgres","kind":"dependency","up":false`)
        yield* Eventually.holds(
          "a dependency.down warning",
          Effect.map(worker.logs, (lines) => lines.some((l) => l.event === "dependency.down" && l.level === "WARN" && l.dependency === "postgres")),
          "5 seconds"
        )
        yield* proxy.restore
        yield* W.waitReady(worker, "20 seconds")
        yield* Eventually.holds(
          "a dependency.up line",
          Effect.map(worker.logs, (lines) => lines.some((l) => l.event === "dependency.up" && l.dependency === "postgres")),
          "5 seconds"
        )
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const lines = yield* worker.logs
        const downs = lines.filter((l) => l.event === "dependency.down")
        assert.strictEqual(downs.length, 1, `one line for the change, not one per failed check: ${JSON.stringify(downs)}`)
        assert.isString(downs[0]!.reason)
        assert.notStrictEqual(downs[0]!.reason, "")
      }), 90_000)
  })
})

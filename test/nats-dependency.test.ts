/**
 * NATS lost and back, as an operator who keeps only errors (`LOG_LEVEL=Error`) sees it: readiness
 * going down and coming back are lifecycle events, so the log says so once each way, with the
 * reason, in the same `dependency.down` / `dependency.up` lines PostgreSQL's readiness writes.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("the NATS dependency", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("NATS lost and back at LOG_LEVEL=Error: readiness follows it, and one dependency.down line (with the reason) and one dependency.up line say so", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const target = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, `nats://${proxy.address.host}:${proxy.address.port}`),
          LOG_LEVEL: "Error"
        })
        yield* W.waitReady(worker)
        yield* proxy.cut
        const unready = yield* Eventually.poll("readiness 503", worker.get("/healthz/ready"), (r) => r.status === 503, {
          timeout: "20 seconds",
          interval: "100 millis"
        })
        assert.include(unready.body, `"name":"nats","kind":"dependency","up":false`)
        const down = yield* Eventually.poll(
          "a dependency.down line for nats",
          Effect.map(worker.logs, (lines) => lines.find((l) => l.event === "dependency.down" && l.dependency === "nats")),
          (line) => line !== undefined,
          { timeout: "5 seconds", interval: "50 millis" }
        )
        assert.strictEqual(down!.level, "WARN")
        assert.isString(down!.reason)
        assert.include(String(down!.reason), "disconnected")
        yield* proxy.restore
        yield* W.waitReady(worker, "20 seconds")
        yield* Eventually.holds(
          "a dependency.up line for nats",
          Effect.map(worker.logs, (lines) => lines.some((l) => l.event === "dependency.up" && l.dependency === "nats")),
          "5 seconds"
        )
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const lines = yield* worker.logs
        const changes = lines.filter((l) => l.dependency === "nats").map((l) => String(l.event))
        // One line per change, not one per failed reconnect, and none for the drain at shutdown.
        assert.deepStrictEqual(changes, ["dependency.down", "dependency.up"], JSON.stringify(lines.filter((l) => l.dependency === "nats")))
        // LOG_LEVEL=Error still filters the client's own warnings.
        assert.isFalse(lines.some((l) => typeof l.event === "string" && l.event.startsWith("nats.")), "no nats.* warning at LOG_LEVEL=Error")
      }), 90_000)
  })
})

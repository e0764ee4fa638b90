/**
 * BE-SHUT-004/007: a resource whose close hangs (the ledger worker's PostgreSQL pool, its link
 * silent: TCP open, no reply) is cut at its part of the close share and named by its
 * own `shutdown.stage` line, and the resource closed after it (NATS) still closes in time. The
 * outbox relay, whose stop rolls back its round over the same link, is a resource of its own too.
 *
 * Failed before: resources closed one after another, each bounded by the whole close share, so the
 * hung relay took it all: the log had `close:resources=timeout` and no `close:postgres` or
 * `close:nats` line (the hung one not named, NATS never drained).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("closing the resources when one of them hangs", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-SHUT-004: PostgreSQL silent at the stop: the relay and the pool are cut and named, NATS still closes; exit 3 inside the budget", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const target = new URL(databaseUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 5432) } })
        const viaProxy = new URL(databaseUrl)
        viaProxy.hostname = "127.0.0.1"
        viaProxy.port = String(proxy.port)
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, viaProxy.toString(), natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        // The database's replies are withheld; wait until a statement went out after that (the
        // relay polls every 200 ms), so that the relay's round is waiting on it at the stop.
        const before = (yield* proxy.stats).bytesToTarget
        yield* proxy.pauseToClient
        yield* Eventually.holds("a statement sent into the silence", Effect.map(proxy.stats, (s) => s.bytesToTarget > before), "10 seconds")
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        const logs = yield* worker.logs
        const stages = logs.filter((l) => l.message === "shutdown.stage").map((l) =>
          `${String(l.stage)}:${String(l.target)}=${String(l.result)}(${String(l.durationMs)}ms)`
        )
        const detail = `exit ${JSON.stringify(exit)} after ${took} ms; stages: ${stages.join(", ")}`
        const close = (target: string) => logs.filter((l) => l.message === "shutdown.stage" && l.stage === "close" && l.target === target)
        // The outbox relay (its round's rollback waits on the database) and the pool, closed first,
        // are each cut at their part of what is left of the close share; NATS, last, still closes.
        for (const hung of ["outbox-relay", "postgres"]) {
          assert.strictEqual(close(hung).length, 1, `${hung}: ${detail}`)
          assert.strictEqual(close(hung)[0]!.result, "timeout", `${hung}: ${detail}`)
        }
        assert.strictEqual(close("nats").length, 1, detail)
        assert.strictEqual(close("nats")[0]!.result, "completed", detail)
        assert.strictEqual(close("resources")[0]?.result, "completed", detail)
        const order = stages.filter((s) => s.startsWith("close:")).map((s) => s.slice("close:".length, s.indexOf("=")))
        assert.deepStrictEqual(order.slice(0, 4), ["outbox-relay", "postgres", "nats", "resources"], detail)
        // The shutdown overran (a resource was abandoned): result timeout, exit 3, inside the budget.
        assert.deepStrictEqual(exit, { code: 3, signal: null }, detail)
        assert.strictEqual(W.withMessage(logs, "shutdown.completed")[0]?.result, "timeout", detail)
        assert.isBelow(took, 6_000 + 1_000, detail)
      }).pipe(Effect.scoped))
  })
})

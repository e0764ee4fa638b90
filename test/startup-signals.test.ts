/**
 * A stop signal while the worker is still starting (BE-SHUT-001, BE-SHUT-007): the ledger worker
 * as a child process waits for a dependency that is not up (a loopback port with nothing behind
 * it); SIGTERM ends that wait at once, and the worker exits 0 with `shutdown.completed` saying
 * `success`: nothing was running, and nothing may hang until the budget runs out.
 */
import { assert, describe, layer } from "@effect/vitest"
import { FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

/** A loopback port with nothing behind it (a proxy's, closed again). */
const deadPort = Effect.scoped(Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } }), (proxy) => proxy.port))

const stopWhileWaiting = (dependency: "nats" | "postgres") =>
  Effect.gen(function*() {
    const { settings } = yield* ledgerStream()
    const schema = yield* TestDatabase.TestSchema
    const port = yield* deadPort
    const env = dependency === "nats"
      ? workerEnv(settings, schema.name, databaseUrl, `nats://127.0.0.1:${port}`)
      : workerEnv(settings, schema.name, `postgres://postgres@127.0.0.1:${port}/test`, natsUrl)
    const worker = yield* W.start({ ...env, ...W.quickBudget, STARTUP_TIMEOUT: "30 seconds" })
    yield* worker.waitForLog("startup.waiting", "10 seconds", (line) => line.dependency === dependency)
    const signalledAt = yield* Clock.currentTimeMillis
    yield* worker.child.kill("SIGTERM")
    const exit = yield* worker.child.waitForExit("15 seconds")
    const took = (yield* Clock.currentTimeMillis) - signalledAt
    const logs = yield* worker.logs
    const stages = logs.filter((l) => l.message === "shutdown.stage").map((l) => `${l.stage}:${l.target}=${l.result}(${l.durationMs}ms)`)
    const completed = W.withMessage(logs, "shutdown.completed")
    // A hung wait used up the 5 s of the budget's shares before the close (and exited 3); the
    // bound leaves room for a loaded machine's process exit.
    assert.isBelow(took, 3_000, `exited ${took} ms after SIGTERM with ${JSON.stringify(exit)}; stages: ${stages.join(", ")}`)
    assert.deepStrictEqual(exit, { code: 0, signal: null }, `completed: ${JSON.stringify(completed)}`)
    assert.strictEqual(completed.length, 1)
    assert.strictEqual(completed[0]?.result, "success")
  })

describe("stop signals during start-up (BE-SHUT-001, BE-SHUT-007)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-SHUT-007: SIGTERM while start-up waits for NATS ends the wait at once: exit 0, shutdown.completed success, no stage timed out", () =>
      stopWhileWaiting("nats"))

    it.effect("BE-SHUT-007: SIGTERM while start-up waits for PostgreSQL ends the wait at once: exit 0, shutdown.completed success", () =>
      stopWhileWaiting("postgres"))
  })
})

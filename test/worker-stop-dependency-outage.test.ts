/**
 * A stop signal while a dependency is down and nothing runs (the ledger worker as a child process,
 * real NATS and PostgreSQL behind a fault proxy). Nothing is in flight, so the shutdown procedure
 * has nothing to wait for: it ends at once with exit 0 and result `success` (BE-SHUT-002: intake
 * stops at the signal; BE-SHUT-007: the exit code and `shutdown.completed` say how it ended).
 *
 * Failed before: with the NATS link reset and reconnects refused, the JetStream intake's close
 * sent its round trips (two flushes and a consumer info) over the dead connection and waited out
 * `settleTimeout` (5 s) for each: with a 6 s budget the `intake` stage overran its share (exit 3,
 * result `timeout`, nothing in flight); with the default 25 s budget stopping took ~6 s. Now the
 * intake sends nothing over a link that is down.
 *
 * Found sound and kept: a PostgreSQL link reset while running; a NATS or PostgreSQL link
 * black-holed (TCP accepted, nothing answered) while start-up waits for it, with one signal or
 * two (covered for a refused connection by startup-signals.test.ts).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

interface Stopped {
  readonly exit: { readonly code: number | null }
  readonly took: number
  readonly logs: ReadonlyArray<W.LogLine>
  readonly detail: string
}

/** A worker whose `dependency` is reached through a fault proxy, with `env` on top. */
const startBehindProxy = (dependency: "nats" | "postgres", env: Record<string, string>) =>
  Effect.gen(function*() {
    const { settings } = yield* ledgerStream()
    const schema = yield* TestDatabase.TestSchema
    const target = new URL(dependency === "nats" ? natsUrl : databaseUrl)
    const proxy = yield* FaultProxy.make({
      target: { host: target.hostname, port: Number(target.port || (dependency === "nats" ? 4222 : 5432)) }
    })
    const viaProxy = new URL(databaseUrl)
    viaProxy.hostname = "127.0.0.1"
    viaProxy.port = String(proxy.port)
    const urls = dependency === "nats"
      ? workerEnv(settings, schema.name, databaseUrl, `nats://127.0.0.1:${proxy.port}`)
      : workerEnv(settings, schema.name, viaProxy.toString(), natsUrl)
    return { proxy, start: W.start({ ...urls, ...W.quickBudget, ...env }) }
  })

/** Sends `signals`, waits for the exit, and gathers what the procedure logged. */
const stop = (worker: W.Worker, signals: ReadonlyArray<"SIGTERM" | "SIGINT">) =>
  Effect.gen(function*() {
    const signalledAt = yield* Clock.currentTimeMillis
    for (const signal of signals) yield* worker.child.kill(signal)
    const exit = yield* worker.child.waitForExit("15 seconds")
    const took = (yield* Clock.currentTimeMillis) - signalledAt
    const logs = yield* worker.logs
    const stages = logs.filter((l) => l.message === "shutdown.stage").map((l) =>
      `${String(l.stage)}:${String(l.target)}=${String(l.result)}(${String(l.durationMs)}ms)`
    )
    const completed = W.withMessage(logs, "shutdown.completed")
    const detail = `exit ${JSON.stringify(exit)} after ${took} ms; stages: ${stages.join(", ")}; completed: ${JSON.stringify(completed)}`
    assert.strictEqual(W.withMessage(logs, "shutdown.started").length, 1, detail)
    assert.strictEqual(completed.length, 1, detail)
    return { exit, took, logs, detail } satisfies Stopped
  })

/** Running and ready, then `fault` on the link to `dependency` until readiness is down, then SIGTERM. */
const stopDuringOutage = (dependency: "nats" | "postgres", env: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const { proxy, start } = yield* startBehindProxy(dependency, env)
    const worker = yield* start
    yield* W.waitReady(worker)
    yield* proxy.cut
    yield* Eventually.poll("readiness down", worker.get("/healthz/ready"), (r) => r.status === 503, {
      timeout: "30 seconds",
      interval: "100 millis"
    })
    return yield* stop(worker, ["SIGTERM"])
  })

/** Nothing runs and nothing is buffered: the intake stops at once and the procedure succeeds. */
const promptStop = ({ detail, exit, logs, took }: Stopped) => {
  const intake = logs.filter((l) => l.message === "shutdown.stage" && l.stage === "intake" && l.target === "worker")
  assert.strictEqual(intake.length, 1, detail)
  assert.strictEqual(intake[0]!.result, "completed", detail)
  assert.isBelow(Number(intake[0]!.durationMs), 1_000, `the intake stops at once: ${detail}`)
  assert.strictEqual(exit.code, 0, detail)
  assert.strictEqual(W.withMessage(logs, "shutdown.completed")[0]?.result, "success", detail)
  assert.isBelow(took, 3_000, detail)
}

/** Start-up under way with the link to `dependency` open but silent, then `signals`. */
const stopWhileStartupBlackHoled = (dependency: "nats" | "postgres", signals: ReadonlyArray<"SIGTERM" | "SIGINT">) =>
  Effect.gen(function*() {
    const { proxy, start } = yield* startBehindProxy(dependency, { STARTUP_TIMEOUT: "60 seconds" })
    yield* proxy.pause
    const worker = yield* start
    yield* Eventually.holds("a connection is open through the black hole", Effect.map(proxy.connections, (n) => n > 0))
    assert.strictEqual((yield* worker.get("/healthz/ready")).status, 503)
    const { detail, exit, logs, took } = yield* stop(worker, signals)
    // Nothing runs yet: nothing to drain, so nothing may hang until the budget's shares run out.
    assert.deepStrictEqual(exit, { code: 0, signal: null }, detail)
    assert.strictEqual(W.withMessage(logs, "shutdown.completed")[0]?.result, "success", detail)
    assert.isBelow(took, 3_000, detail)
  })

describe("a stop signal while a dependency is down and nothing runs", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-SHUT-002, BE-SHUT-007: NATS link reset, reconnects refused (6 s budget): the intake stops at once; exit 0, result success", () =>
      Effect.map(stopDuringOutage("nats"), promptStop).pipe(Effect.scoped))

    it.effect("BE-SHUT-002, BE-SHUT-007: NATS link reset, reconnects refused (default 25 s budget): the intake stops at once; exit 0 within 3 s", () =>
      Effect.map(stopDuringOutage("nats", { SHUTDOWN_BUDGET: "25 seconds" }), promptStop).pipe(Effect.scoped))

    it.effect("BE-SHUT-007: PostgreSQL link reset, reconnects refused: exit 0, result success", () =>
      Effect.gen(function*() {
        const { detail, exit, logs, took } = yield* stopDuringOutage("postgres")
        assert.strictEqual(exit.code, 0, detail)
        assert.strictEqual(W.withMessage(logs, "shutdown.completed")[0]?.result, "success", detail)
        assert.isBelow(took, 7_000, `within the budget and a margin for the exit: ${detail}`)
      }).pipe(Effect.scoped))

    it.effect("BE-SHUT-007: SIGTERM then SIGINT while start-up waits on a black-holed NATS: one procedure, exit 0, result success, promptly", () =>
      stopWhileStartupBlackHoled("nats", ["SIGTERM", "SIGINT"]).pipe(Effect.scoped))

    it.effect("BE-SHUT-007: SIGTERM while start-up waits on a black-holed PostgreSQL: exit 0, result success, promptly", () =>
      stopWhileStartupBlackHoled("postgres", ["SIGTERM"]).pipe(Effect.scoped))
  })
})

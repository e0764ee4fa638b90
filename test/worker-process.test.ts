/**
 * The worker process around the engine (`Worker.runMain`), as a child process against the real
 * NATS and PostgreSQL: the result and schema of the shutdown events (BE-SHUT-007), start-up that
 * waits for its dependencies, liveness under a blocked event loop, and `/metrics` in the
 * Prometheus text format.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { ChildWorker, Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { type AddressInfo, createServer } from "node:net"
import { ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { parsePrometheusText } from "./support/prometheus.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"
import { fileURLToPath } from "node:url"

/**
 * The events of a worker that stopped on a failure without a signal: one `shutdown.started`
 * (reason failure) and one `shutdown.completed` (result failure, at ERROR); returns its
 * `worker.failed` line (exactly one).
 */
const failedShutdown = (logs: ReadonlyArray<W.LogLine>) => {
  const started = W.withMessage(logs, "shutdown.started")
  const completed = W.withMessage(logs, "shutdown.completed")
  assert.strictEqual(started.length, 1)
  assert.deepInclude(started[0]!, { reason: "failure", signal: null })
  assert.strictEqual(completed.length, 1)
  assert.deepInclude(completed[0]!, { result: "failure", level: "ERROR" })
  const failed = W.withMessage(logs, "worker.failed")
  assert.strictEqual(failed.length, 1)
  return failed
}

/** A loopback port nothing listens on now. */
const freePort = Effect.callback<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** The names LOG_LEVEL never filters (see the README's logging section). */
const isLifecycleEvent = (line: W.LogLine) =>
  /^(worker|startup|shutdown|health)\./.test(line.message) || line.message === "telemetry.unavailable" ||
  /^dependency\./.test(String(line.event))

const selfInterrupting = fileURLToPath(new URL("./fixtures/self-interrupting-worker.ts", import.meta.url))
const failingClose = fileURLToPath(new URL("./fixtures/failing-close-worker.ts", import.meta.url))

const startedKeys = ["timestamp", "level", "message", "signal", "reason", "budgetMs"]
const completedKeys = ["timestamp", "level", "message", "result", "durationMs", "budgetMs", "signal"]

describe("worker process", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("BE-SHUT-007: successful shutdown: exit code 0, exactly one started and one completed event, with their fixed schema and the real duration", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        yield* worker.child.kill("SIGINT")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const logs = yield* worker.logs
        const started = W.withMessage(logs, "shutdown.started")
        const completed = W.withMessage(logs, "shutdown.completed")
        assert.strictEqual(started.length, 1)
        assert.strictEqual(completed.length, 1)
        assert.sameMembers(Object.keys(started[0]!), startedKeys)
        assert.sameMembers(Object.keys(completed[0]!), completedKeys)
        assert.deepInclude(started[0]!, { level: "INFO", signal: "SIGINT", reason: "signal", budgetMs: 6_000 })
        assert.deepInclude(completed[0]!, { level: "INFO", result: "success", budgetMs: 6_000, signal: "SIGINT" })
        // The real duration: what the two events' own timestamps say, within the clock's grain.
        const durationMs = completed[0]!.durationMs as number
        const between = Date.parse(completed[0]!.timestamp as string) - Date.parse(started[0]!.timestamp as string)
        assert.isAtLeast(durationMs, 200, "at least the readiness grace")
        assert.isAtMost(Math.abs(durationMs - between), 20)
        // No per-request, trace or span ids anywhere in the two events.
        for (const event of [...started, ...completed]) {
          for (const key of Object.keys(event)) assert.notMatch(key, /request|trace|span|fiber/i)
        }
      }))

    it.effect("BE-SHUT-007: failed shutdown: a source that fails for good (consumer deleted) starts the procedure with result failure and a non-zero exit", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.consumers.delete(stream.stream, stream.consumer))
        assert.deepStrictEqual(yield* worker.child.waitForExit("20 seconds"), { code: 1, signal: null })
        const logs = yield* worker.logs
        const failed = failedShutdown(logs)
        assert.match(String(failed[0]!.cause), /ConsumerDeleted|consumer deleted/i)
      }))

    it.effect("BE-SHUT-007: a program that ends interrupted with no stop signal ends with result failure and exit code 1, the two agreeing", () =>
      Effect.gen(function*() {
        const child = yield* ChildWorker.spawn({ script: selfInterrupting, env: { ...W.quickBudget, HEALTH_PORT: "off" } })
        assert.deepStrictEqual(yield* child.waitForExit("15 seconds"), { code: 1, signal: null })
        const logs = W.jsonLines(yield* child.lines)
        const failed = failedShutdown(logs)
        assert.include(String(failed[0]!.nextStep), "no stop signal")
      }))

    it.effect("BE-SHUT-007: a resource that fails to close makes the shutdown a failure (exit code 1), and its close stage line says why", () =>
      Effect.gen(function*() {
        const worker = yield* W.startScript(failingClose, { ...W.quickBudget, HEALTH_PORT: "0" })
        yield* W.waitReady(worker)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 1, signal: null })
        const logs = yield* worker.logs
        const close = logs.filter((l) => l.message === "shutdown.stage" && l.target === "broken-client")
        assert.strictEqual(close.length, 1)
        assert.deepInclude(close[0]!, { level: "ERROR", stage: "close", result: "failed" })
        assert.include(String(close[0]!.error), "socket already destroyed while closing")
        const completed = W.withMessage(logs, "shutdown.completed")
        assert.strictEqual(completed.length, 1)
        assert.deepInclude(completed[0]!, { level: "ERROR", result: "failure", signal: "SIGTERM" })
      }))

    it.effect("BE-SHUT-007: overrun shutdown: a stage past its share ends with result timeout and exit code 3", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("overrun")
        const stuck = `${p}.stuck`
        yield* W.makeSlow(stuck, 30_000)
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        yield* stream.publish("eur", transfer(stuck, a, b, 1_00), stuck)
        yield* W.waitReceived(worker, stuck)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 3, signal: null })
        const logs = yield* worker.logs
        const drain = logs.filter((l) => l.message === "shutdown.stage" && l.stage === "drain")
        assert.deepStrictEqual(drain.map((l) => l.result), ["timeout"])
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "timeout" })
        assert.deepStrictEqual([...(yield* transferCounts([stuck])).values()], [])
      }))

    it.effect("start-up waits for NATS (readiness 503, progress logged) and becomes ready once it is up", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        // A loopback port with nothing behind it yet: take a free one, then let it go.
        const port = yield* Effect.scoped(
          Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } }), (proxy) => proxy.port)
        )
        const target = new URL(natsUrl)
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, `nats://127.0.0.1:${port}`),
          ...W.quickBudget,
          STARTUP_TIMEOUT: "30 seconds"
        })
        yield* worker.waitForLog("startup.waiting", "10 seconds", (l) => l.dependency === "nats")
        const before = yield* worker.get("/healthz/ready")
        assert.strictEqual(before.status, 503)
        assert.strictEqual((JSON.parse(before.body) as { readonly phase: string }).phase, "starting")
        const live = yield* worker.get("/healthz/live")
        assert.strictEqual(live.status, 200, "waiting for a dependency is not being wedged")
        // NATS appears on that port.
        yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) }, listenPort: port })
        yield* W.waitReady(worker, "20 seconds")
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
      }))

    it.effect("start-up waits for PostgreSQL (readiness 503, progress logged) and becomes ready once it is up", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const port = yield* Effect.scoped(
          Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 5432 } }), (proxy) => proxy.port)
        )
        const real = new URL(databaseUrl)
        const down = new URL(databaseUrl)
        down.hostname = "127.0.0.1"
        down.port = String(port)
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, down.toString(), natsUrl),
          ...W.quickBudget,
          STARTUP_TIMEOUT: "30 seconds"
        })
        const waiting = yield* worker.waitForLog("startup.waiting", "10 seconds", (l) => l.dependency === "postgres")
        assert.match(String(waiting.error), /SqlError/)
        assert.strictEqual((yield* worker.get("/healthz/ready")).status, 503)
        yield* FaultProxy.make({ target: { host: real.hostname, port: Number(real.port || 5432) }, listenPort: port })
        yield* W.waitReady(worker, "20 seconds")
        const ready = W.withMessage(yield* worker.logs, "worker.ready")
        assert.strictEqual(ready.length, 1)
        assert.isAbove(Number(ready[0]!.startupMs), 0)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
      }))

    it.effect("start-up that outlives STARTUP_TIMEOUT ends with result failure and exit code 1", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const port = yield* Effect.scoped(
          Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } }), (proxy) => proxy.port)
        )
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, `nats://127.0.0.1:${port}`),
          ...W.quickBudget,
          STARTUP_TIMEOUT: "2 seconds"
        })
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 1, signal: null })
        const logs = yield* worker.logs
        assert.isAbove(W.withMessage(logs, "startup.waiting").length, 0)
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "failure" })
      }))

    it.effect("a health port in use stops start-up with the reason and the next step, exit code 1", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        // Another process's listener on the port the worker is told to use.
        const blocker = createServer()
        yield* Effect.acquireRelease(
          Effect.callback<void>((resume) => {
            blocker.listen(0, "127.0.0.1", () => resume(Effect.void)).on("error", (error) => resume(Effect.die(error)))
          }),
          () =>
            Effect.callback<void>((resume) => {
              blocker.close(() => resume(Effect.void))
            })
        )
        const port = (blocker.address() as AddressInfo).port
        const child = yield* ChildWorker.spawn({
          script: W.fixture,
          env: { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(port) }
        })
        assert.deepStrictEqual(yield* child.waitForExit("15 seconds"), { code: 1, signal: null })
        const failed = W.withMessage(W.jsonLines(yield* child.lines), "worker.startup_failed")
        assert.strictEqual(failed.length, 1)
        assert.include(String(failed[0]!.error), `health server on port ${port}: the port is in use`)
        assert.include(String(failed[0]!.error), "EADDRINUSE")
        assert.include(String(failed[0]!.nextStep), "set HEALTH_PORT to a free port")
      }).pipe(Effect.scoped))

    it.effect("LOG_LEVEL: Debug adds a line per committed message; a level that does not exist stops start-up", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("loglevel")
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        const worker = yield* W.start({ ...env, ...W.quickBudget, LOG_LEVEL: "Debug" })
        yield* W.waitReady(worker)
        yield* stream.publish("eur", transfer(`${p}.ok`, a, b, 1_00), `${p}.ok`)
        const committed = yield* worker.waitForLog(
          `Committed ${settings.consumer}#1 (${p}.ok)`,
          "20 seconds",
          (line) => line.level === "DEBUG"
        )
        assert.deepInclude(committed, { level: "DEBUG" }, "a committed message is logged at debug")
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.waitForExit("15 seconds")

        const invalid = yield* ChildWorker.spawn({ script: W.fixture, env: { ...env, LOG_LEVEL: "Loud" } })
        assert.deepStrictEqual(yield* invalid.waitForExit("15 seconds"), { code: 1, signal: null })
        const failed = W.withMessage(W.jsonLines(yield* invalid.lines), "worker.invalid_settings")
        assert.strictEqual(failed.length, 1)
        assert.include(String(failed[0]!.error), "LOG_LEVEL")
      }))

    it.effect("settings that only look like numbers stop start-up, naming the variable: HEALTH_PORT 1e3 or 0x1F90, LOG_BUFFER_BYTES below 64 KiB", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        for (const [name, value, text] of [
          ["HEALTH_PORT", "1e3", "HEALTH_PORT must be a port"],
          ["HEALTH_PORT", "0x1F90", "HEALTH_PORT must be a port"],
          ["LOG_BUFFER_BYTES", "1024", "LOG_BUFFER_BYTES must be from 65536"]
        ] as const) {
          const invalid = yield* ChildWorker.spawn({ script: W.fixture, env: { ...env, [name]: value } })
          assert.deepStrictEqual(yield* invalid.waitForExit("15 seconds"), { code: 1, signal: null }, `${name}=${value}`)
          const failed = W.withMessage(W.jsonLines(yield* invalid.lines), "worker.invalid_settings")
          assert.strictEqual(failed.length, 1, `${name}=${value}`)
          assert.include(String(failed[0]!.error), text)
        }
      }))

    it.effect("BE-SHUT-007: LOG_LEVEL=Warn or None still writes the lifecycle events (health.listening, worker.ready, the stages, exactly one shutdown.started and one shutdown.completed) and filters every other line", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        for (const level of ["Warn", "None"]) {
          const port = yield* freePort
          const child = yield* ChildWorker.spawn({
            script: W.fixture,
            env: {
              ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
              ...W.quickBudget,
              LOG_LEVEL: level,
              HEALTH_HOST: "127.0.0.1",
              HEALTH_PORT: String(port)
            }
          })
          yield* Eventually.poll(
            `ready with LOG_LEVEL=${level}`,
            Effect.tryPromise(() => fetch(`http://127.0.0.1:${port}/healthz/ready`).then((r) => r.status)).pipe(
              Effect.orElseSucceed(() => 0)
            ),
            (status) => status === 200,
            { timeout: "20 seconds", interval: "50 millis" }
          )
          yield* child.kill("SIGTERM")
          assert.deepStrictEqual(yield* child.waitForExit("15 seconds"), { code: 0, signal: null })
          const logs = W.jsonLines(yield* child.lines)
          const written = JSON.stringify(logs.map((l) => `${l.level} ${l.message}`))
          for (const event of ["health.listening", "worker.ready", "shutdown.started", "shutdown.completed"]) {
            assert.strictEqual(W.withMessage(logs, event).length, 1, `${event} with LOG_LEVEL=${level}; written: ${written}`)
          }
          assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { level: "INFO", result: "success" })
          assert.includeMembers([...W.stages(logs)], ["readiness:probe", "program:program", "grace:probe", "telemetry:logger"])
          // The level still filters the rest: the consumer's INFO start line, for one.
          const others = logs.filter((l) => !isLifecycleEvent(l))
          const allowed = level === "Warn" ? ["WARN", "ERROR", "FATAL"] : []
          assert.deepStrictEqual(others.filter((l) => !allowed.includes(l.level)), [], `LOG_LEVEL=${level}`)
        }
      }).pipe(Effect.scoped))

    it.effect("liveness answers 503 after the event loop was blocked past HEALTH_MAX_EVENT_LOOP_LAG, and 200 again later", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("wedge")
        const wedge = `${p}.wedge`
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...W.quickBudget,
          HEALTH_MAX_EVENT_LOOP_LAG: "500 millis",
          JW_BLOCK_EVENT: wedge,
          JW_BLOCK_MS: "1500"
        })
        yield* W.waitReady(worker)
        assert.strictEqual((yield* worker.get("/healthz/live")).status, 200)
        yield* stream.publish("eur", transfer(wedge, a, b, 1_00), wedge)
        yield* worker.child.waitForLine((l) => l.startsWith("blocking the event loop"), "10 seconds")
        const wedged = yield* worker.get("/healthz/live")
        assert.strictEqual(wedged.status, 503, wedged.body)
        assert.isAbove((JSON.parse(wedged.body) as { readonly eventLoopLagMs: number }).eventLoopLagMs, 500)
        // The lag is remembered for 10 s, then the probe recovers.
        yield* Eventually.poll("liveness back to 200", worker.get("/healthz/live"), (r) => r.status === 200, {
          timeout: "20 seconds",
          interval: "250 millis"
        })
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.waitForExit("15 seconds")
      }))

    it.effect("/metrics parses as Prometheus text, counts outcomes by consumer and outcome, and reports the process's memory and heap bound", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("metrics")
        // A heap bound as docs/performance.md suggests (V8's own on this machine is about 4 GiB).
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...W.quickBudget,
          NODE_OPTIONS: "--max-semi-space-size=4 --max-old-space-size=128"
        })
        yield* W.waitReady(worker)
        yield* stream.publish("eur", transfer(`${p}.ok`, a, b, 1_00), `${p}.ok`)
        yield* stream.publish("eur", "not json", `${p}.bad`)
        yield* Eventually.holds("two outcomes", Effect.map(W.outcomes(worker), (all) => all.length >= 2))
        const response = yield* worker.get("/metrics")
        assert.strictEqual(response.status, 200)
        const samples = parsePrometheusText(response.body)
        const outcome = (tag: string) =>
          samples.find((s) =>
            s.name === "jetworker_outcomes" && s.labels.consumer === settings.consumer && s.labels.outcome === tag
          )?.value
        assert.strictEqual(outcome("Committed"), 1)
        assert.strictEqual(outcome("Rejected"), 1)
        const gauge = (name: string) => samples.find((s) => s.name === name)?.value ?? Number.NaN
        const limit = gauge("nodejs_heap_size_limit_bytes")
        assert.isAbove(limit, 128 * 2 ** 20, "the old space's bound and the young generation's")
        assert.isAtMost(limit, 160 * 2 ** 20, "the bound the worker was started with, not V8's default")
        assert.isAbove(gauge("process_resident_memory_bytes"), 0)
        assert.isAbove(gauge("nodejs_heap_size_used_bytes"), 0)
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.waitForExit("15 seconds")
      }))
  })
})

/**
 * Shutdown tests (BE-SHUT-001..005, 007): the ledger worker runs as a child process under
 * `Worker.runMain` against the real NATS and PostgreSQL; the tests send it real signals, watch
 * its probes over HTTP and its JSON log lines, slow transfers down inside their database
 * transactions, black-hole its dependencies through the loopback fault proxy, and then read the
 * database and the consumer's state on the server.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, Duration, Effect, Fiber } from "effect"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

/** A short budget for tests: grace 500 ms, close 1.5 s, telemetry 500 ms, reserve 500 ms. */
const budget = (total: string) => ({
  SHUTDOWN_BUDGET: total,
  SHUTDOWN_READINESS_GRACE: "500 millis",
  SHUTDOWN_CLOSE: "1500 millis",
  SHUTDOWN_TELEMETRY: "500 millis",
  SHUTDOWN_RESERVE: "500 millis"
})

/** Publishes a transfer of `amount` from `a` to `b` with id `id`; returns its stream sequence. */
const send = (stream: { readonly publish: (s: string, p: string, id: string) => Effect.Effect<number, unknown> }, id: string, a: string, b: string, amount = 1_00) =>
  stream.publish("eur", transfer(id, a, b, amount), id)

/** Counts of each `stage:target` in `logs`. */
const stageCounts = (logs: ReadonlyArray<W.LogLine>) => {
  const counts = new Map<string, number>()
  for (const s of W.stages(logs)) counts.set(s, (counts.get(s) ?? 0) + 1)
  return counts
}

const expectedStages = (consumer: string, resources: ReadonlyArray<string>) => [
  "readiness:probe",
  `intake:${consumer}`,
  `drain:${consumer}`,
  "program:program",
  "grace:probe",
  ...resources.map((r) => `close:${r}`),
  "close:resources",
  "close:health-server",
  "telemetry:logger"
]

/** Asserts that each stage ran exactly once and in order (resources in any order among themselves). */
const assertStagesOnce = (logs: ReadonlyArray<W.LogLine>, consumer: string, resources: ReadonlyArray<string>) => {
  const seen = W.stages(logs)
  const counts = stageCounts(logs)
  for (const [stage, n] of counts) assert.strictEqual(n, 1, `${stage} ran ${n} times: ${seen.join(", ")}`)
  const expected = expectedStages(consumer, resources)
  assert.sameMembers([...seen], expected, seen.join(", "))
  const normalised = seen.map((s) => (resources.some((r) => s === `close:${r}`) ? "close:<resource>" : s))
  const wanted = expected.map((s) => (resources.some((r) => s === `close:${r}`) ? "close:<resource>" : s))
  assert.deepStrictEqual(normalised, wanted, "stage order")
}

/**
 * A worker on a throw-away stream and schema with a shutdown budget of `total`, and one transfer
 * `<prefix>.<name>` in flight: its handler is running, sleeping `millis` inside its transaction.
 * `env` may rewrite the worker's environment (e.g. to route a dependency through a proxy).
 */
const withSlowTransfer = Effect.fnUntraced(function*(options: {
  readonly label: string
  readonly name: string
  readonly millis: number
  readonly ackWait: Duration.Input
  readonly total: string
  readonly env?: ((env: Record<string, string>) => Record<string, string>) | undefined
}) {
  const { stream, settings } = yield* ledgerStream({ ackWait: Duration.fromInputUnsafe(options.ackWait) })
  const schema = yield* TestDatabase.TestSchema
  const { p, a, b } = yield* twoAccounts(options.label)
  const id = `${p}.${options.name}`
  yield* W.makeSlow(id, options.millis)
  const base = { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...budget(options.total) }
  const env = options.env === undefined ? base : options.env(base)
  const worker = yield* W.start(env)
  yield* W.waitReady(worker)
  yield* send(stream, id, a, b)
  yield* W.waitReceived(worker, id)
  return { stream, settings, env, worker, p, a, b, id }
})

describe("shutdown (BE-SHUT)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("BE-SHUT-001: one stop signal starts one procedure; each stage runs exactly once; exit 0 with result success", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("shut1")
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...budget("10 seconds") })
        yield* W.waitReady(worker)
        const ids = [1, 2, 3].map((n) => `${p}.t${n}`)
        for (const id of ids) yield* send(stream, id, a, b)
        yield* Eventually.holds(
          "three commits",
          Effect.map(W.outcomes(worker), (all) => ids.every((id) => all.some((o) => o.eventId === id && o.tag === "Committed")))
        )
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        assert.deepStrictEqual(exit, { code: 0, signal: null })
        const logs = yield* worker.logs
        const started = W.withMessage(logs, "shutdown.started")
        const completed = W.withMessage(logs, "shutdown.completed")
        assert.strictEqual(started.length, 1)
        assert.strictEqual(started[0]!.signal, "SIGTERM")
        assert.strictEqual(completed.length, 1)
        assert.strictEqual(completed[0]!.result, "success")
        assertStagesOnce(logs, settings.consumer, ["outbox-relay", "nats", "postgres"])
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 97_00n, [b]: 3_00n })
      }))

    it.effect("BE-SHUT-001: repeated and concurrent stop signals start no second procedure, close nothing twice and do not extend the wait", () =>
      Effect.gen(function*() {
        const { settings, worker, id: slow } = yield* withSlowTransfer({
          label: "shut2",
          name: "slow",
          millis: 1_500,
          ackWait: "10 seconds",
          total: "10 seconds"
        })
        // Concurrent: three signals back to back; repeated: two more while the procedure runs.
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.kill("SIGINT")
        yield* worker.child.kill("SIGTERM")
        yield* worker.waitForLog("shutdown.stage", "10 seconds", (l) => l.stage === "intake")
        yield* worker.child.kill("SIGINT")
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        assert.deepStrictEqual(exit, { code: 0, signal: null })
        const logs = yield* worker.logs
        assert.strictEqual(W.withMessage(logs, "shutdown.started").length, 1)
        assert.strictEqual(W.withMessage(logs, "shutdown.completed").length, 1)
        // The kernel may merge the burst's second SIGTERM into the first while it is pending, so
        // three or four of the five signals arrive as repeats; each is logged and ignored.
        const ignored = W.withMessage(logs, "shutdown.signal_ignored")
        assert.include([3, 4], ignored.length)
        assert.includeMembers(ignored.map((l) => l.signal), ["SIGINT", "SIGTERM"])
        assertStagesOnce(logs, settings.consumer, ["outbox-relay", "nats", "postgres"])
        // The wait was the slow transfer's, not longer: the procedure ended well inside the budget.
        const completed = W.withMessage(logs, "shutdown.completed")[0]!
        assert.strictEqual(completed.result, "success")
        assert.isBelow(Number(completed.durationMs), 5_000)
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
      }))

    it.effect("BE-SHUT-001: a business failure stays isolated from the process lifecycle: no shutdown, still ready, later work commits", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("shut3")
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...budget("10 seconds") })
        yield* W.waitReady(worker)
        const unknown = `${p}.unknown`
        const broke = `${p}.broke`
        const ok = `${p}.ok`
        yield* send(stream, unknown, a, `${p}.nobody`)
        yield* send(stream, broke, a, b, 1_000_00) // more than a has
        yield* stream.publish("eur", "{ not json", `${p}.garbage`)
        yield* Eventually.holds(
          "the failures settled",
          Effect.map(W.outcomes(worker), (all) =>
            all.filter((o) => o.tag === "DeadLettered" || o.tag === "Rejected").length === 3)
        )
        yield* send(stream, ok, a, b)
        yield* Eventually.holds(
          "the next transfer commits",
          Effect.map(W.outcomes(worker), (all) => all.some((o) => o.eventId === ok && o.tag === "Committed"))
        )
        const ready = yield* worker.get("/healthz/ready")
        assert.strictEqual(ready.status, 200)
        const logs = yield* worker.logs
        assert.strictEqual(W.withMessage(logs, "shutdown.started").length, 0)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
      }))

    it.effect("BE-SHUT-002: readiness turns 503 and intake stops at the signal; a message arriving during shutdown never reaches the stopping worker and commits once after a restart", () =>
      Effect.gen(function*() {
        const { stream, env, worker, p, a, b, id: slow } = yield* withSlowTransfer({
          label: "shut4",
          name: "slow",
          millis: 2_000,
          ackWait: "10 seconds",
          total: "10 seconds"
        })
        const late = `${p}.late`
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const unready = yield* Eventually.poll(
          "readiness 503",
          worker.get("/healthz/ready"),
          (r) => r.status === 503,
          { timeout: "2 seconds", interval: "20 millis" }
        )
        const flippedAfter = (yield* Clock.currentTimeMillis) - signalledAt
        assert.isBelow(flippedAfter, 1_000, "readiness turned 503 at once")
        assert.strictEqual((JSON.parse(unready.body) as { readonly phase: string }).phase, "stopping")
        yield* worker.waitForLog("shutdown.stage", "5 seconds", (l) => l.stage === "intake")
        const lateSeq = yield* send(stream, late, a, b)
        // The slow transfer is still running (the drain waits for it); meanwhile the server holds
        // the late message for nobody: not delivered, not pending an ack.
        const info = yield* stream.info
        assert.isBelow(info.delivered.stream_seq, lateSeq, "the late message was never delivered to the stopping worker")
        assert.strictEqual(info.num_pending, 1)
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const afterExit = yield* stream.info
        assert.isBelow(afterExit.delivered.stream_seq, lateSeq)
        assert.strictEqual(afterExit.num_ack_pending, 0)
        assert.isFalse((yield* W.outcomes(worker)).some((o) => o.eventId === late))
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
        // A new instance takes the late message and commits it once.
        const next = yield* W.start(env)
        yield* Eventually.holds(
          "the late transfer commits after the restart",
          Effect.map(W.outcomes(next), (all) => all.some((o) => o.eventId === late && o.tag === "Committed"))
        )
        yield* next.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* next.child.waitForExit("15 seconds"), { code: 0, signal: null })
        assert.deepStrictEqual(Object.fromEntries(yield* transferCounts([slow, late])), { [slow]: 1, [late]: 1 })
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 98_00n, [b]: 2_00n })
      }))

    it.effect("BE-SHUT-003: long message handling finishes inside the budget: committed, then acked, before the exit", () =>
      Effect.gen(function*() {
        const { stream, worker, id: slow } = yield* withSlowTransfer({
          label: "shut5",
          name: "slow",
          millis: 3_000,
          ackWait: "10 seconds",
          total: "10 seconds"
        })
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const all = yield* W.outcomes(worker)
        assert.deepStrictEqual(all.filter((o) => o.eventId === slow).map((o) => o.tag), ["Committed"])
        const logs = yield* worker.logs
        assert.strictEqual(W.withMessage(logs, "shutdown.completed")[0]!.result, "success")
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
        assert.strictEqual(info.num_pending, 0)
      }))

    it.effect("BE-SHUT-003: budget expiry cancels a handler: no success and no ack before the commit; its transaction rolls back, its message is released unacked, redelivered and committed once", () =>
      Effect.gen(function*() {
        const { env, worker, a, b, id: stuck } = yield* withSlowTransfer({
          label: "shut6",
          name: "stuck",
          millis: 60_000,
          ackWait: "30 seconds",
          total: "5 seconds"
        })
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        assert.deepStrictEqual(exit, { code: 3, signal: null }, "a cut handler makes the result timeout")
        assert.isBelow(took, 5_000 + 1_000, "the budget holds")
        const logs = yield* worker.logs
        const completed = W.withMessage(logs, "shutdown.completed")
        assert.strictEqual(completed.length, 1)
        assert.strictEqual(completed[0]!.result, "timeout")
        const tags = (yield* W.outcomes(worker)).filter((o) => o.eventId === stuck).map((o) => o.tag)
        assert.isFalse(tags.includes("Committed"), `no success for a cut handler: ${tags.join(",")}`)
        assert.deepStrictEqual([...(yield* transferCounts([stuck])).values()], [])
        // Released, not acked: a restarted worker (without the delay) gets it and commits it once.
        yield* W.clearSlow
        const next = yield* W.start(env)
        yield* Eventually.holds(
          "the cut transfer commits after the restart",
          Effect.map(W.outcomes(next), (all) => all.some((o) => o.eventId === stuck && o.tag === "Committed")),
          "30 seconds"
        )
        yield* next.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* next.child.waitForExit("15 seconds"), { code: 0, signal: null })
        assert.deepStrictEqual([...(yield* transferCounts([stuck])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
      }))

    it.effect("BE-SHUT-005: lifecycle events in order while running work uses the database, the broker and an external client; each resource closed once by its owner", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(10) })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("shut7")
        // The external client: a risk service on loopback that answers after 1.5 s.
        const answered: Array<string> = []
        const risk = yield* Effect.acquireRelease(
          Effect.callback<{ readonly port: number; readonly close: () => void }>((resume) => {
            const server = createServer((request: IncomingMessage, response: ServerResponse) => {
              let body = ""
              request.on("data", (chunk: Buffer) => (body += chunk.toString()))
              request.on("end", () => {
                const timer = setTimeout(() => {
                  response.writeHead(200, { "content-type": "application/json" })
                  response.end(JSON.stringify({ allow: true }), () => answered.push((JSON.parse(body) as { readonly id: string }).id))
                }, 1_500)
                timer.unref()
              })
            })
            server.listen(0, "127.0.0.1", () => {
              const address = server.address()
              resume(Effect.succeed({
                port: typeof address === "object" && address !== null ? address.port : 0,
                close: () => server.close()
              }))
            })
          }),
          (server) => Effect.sync(server.close)
        )
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...budget("10 seconds"),
          LEDGER_RISK_URL: `http://127.0.0.1:${risk.port}/check`,
          LEDGER_RISK_TIMEOUT: "5 seconds"
        })
        yield* W.waitReady(worker)
        const ids = [1, 2, 3].map((n) => `${p}.t${n}`)
        for (const id of ids) yield* send(stream, id, a, b)
        for (const id of ids) yield* W.waitReceived(worker, id)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const logs = yield* worker.logs
        assertStagesOnce(logs, settings.consumer, ["outbox-relay", "nats", "postgres", "http-client"])
        const messages = logs.map((l) => l.message)
        const started = messages.indexOf("shutdown.started")
        const completed = messages.indexOf("shutdown.completed")
        assert.isAbove(started, -1)
        assert.strictEqual(completed, messages.length - 1, "shutdown.completed is the last line")
        // Every handler finished its external call, its transaction and its ack before any
        // resource closed: the outcome lines come before the first close stage.
        const lines = yield* worker.child.lines
        const firstClose = lines.findIndex((l) => l.includes("\"shutdown.stage\"") && l.includes("\"close\""))
        const lastOutcome = lines.reduce((at, l, i) => (l.startsWith("outcome ") ? i : at), -1)
        assert.isBelow(lastOutcome, firstClose)
        assert.sameMembers(answered, ids)
        const all = yield* W.outcomes(worker)
        for (const id of ids) assert.deepStrictEqual(all.filter((o) => o.eventId === id).map((o) => o.tag), ["Committed"])
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1])
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
      }))

    it.effect("BE-SHUT-004: a hung operation on a black-holed database: the process exits inside the budget, non-zero, result timeout; nothing is lost", () =>
      Effect.gen(function*() {
        // The cut transaction's settlement hangs on the silent database too, so the message
        // comes back after its ack wait: keep that short.
        const target = new URL(databaseUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 5432) } })
        const viaProxy = new URL(databaseUrl)
        viaProxy.hostname = proxy.address.host
        viaProxy.port = String(proxy.address.port)
        const { env, worker, a, b, id: slow } = yield* withSlowTransfer({
          label: "shut8",
          name: "slow",
          millis: 1_000,
          ackWait: "5 seconds",
          total: "5 seconds",
          env: (env) => ({ ...env, DATABASE_URL: viaProxy.toString() })
        })
        // The transaction is open (sleeping in the trigger); now the database goes silent.
        yield* proxy.pause
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        assert.deepStrictEqual(exit, { code: 3, signal: null })
        assert.isBelow(took, 5_000 + 1_000, `exited ${took} ms after the signal; the budget is 5 s (+1 s margin)`)
        const logs = yield* worker.logs
        const completed = W.withMessage(logs, "shutdown.completed")
        assert.strictEqual(completed.length, 1)
        assert.strictEqual(completed[0]!.result, "timeout")
        assert.isAtMost(Number(completed[0]!.durationMs), 5_000)
        yield* proxy.resume
        // The transfer was not committed (the database never got the COMMIT) and is redelivered.
        yield* W.clearSlow
        const next = yield* W.start({ ...env, DATABASE_URL: databaseUrl })
        yield* Eventually.holds(
          "the transfer commits after the restart",
          Effect.map(W.outcomes(next), (all) => all.some((o) => o.eventId === slow && (o.tag === "Committed" || o.tag === "Duplicate"))),
          "40 seconds"
        )
        yield* next.child.kill("SIGTERM")
        yield* next.child.waitForExit("15 seconds")
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
      }))

    it.effect("BE-SHUT-004: a black-holed broker: the process exits inside the budget, non-zero, result timeout; the committed transfer is not repeated", () =>
      Effect.gen(function*() {
        const target = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
        const { stream, env, worker, a, b, id: slow } = yield* withSlowTransfer({
          label: "shut9",
          name: "slow",
          millis: 1_000,
          ackWait: "5 seconds",
          total: "5 seconds",
          env: (env) => ({ ...env, NATS_URL: `nats://127.0.0.1:${proxy.port}` })
        })
        // The handler is in its transaction; the broker goes silent: its ack can never be confirmed.
        yield* proxy.pause
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        assert.deepStrictEqual(exit, { code: 3, signal: null })
        assert.isBelow(took, 5_000 + 1_000, `exited ${took} ms after the signal; the budget is 5 s (+1 s margin)`)
        const logs = yield* worker.logs
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "timeout" })
        assert.strictEqual(W.withMessage(logs, "shutdown.completed").length, 1)
        // The transfer committed (the database was fine); its ack was lost with the broker.
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
        yield* proxy.resume
        yield* W.clearSlow
        // Whether the ack still reaches the server (bytes the dead worker left in the proxy's
        // socket buffers are forwarded on resume) or the message is redelivered to a new worker,
        // it settles without a second effect.
        const next = yield* W.start({ ...env, NATS_URL: natsUrl })
        yield* Eventually.holds(
          "nothing left pending on the consumer",
          Effect.map(stream.info, (info) => info.num_pending === 0 && info.num_ack_pending === 0),
          "30 seconds"
        )
        const again = (yield* W.outcomes(next)).filter((o) => o.eventId === slow).map((o) => o.tag)
        assert.isTrue(again.every((tag) => tag === "Duplicate"), again.join(","))
        yield* next.child.kill("SIGTERM")
        yield* next.child.waitForExit("15 seconds")
        assert.deepStrictEqual([...(yield* transferCounts([slow])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
      }))

    // Two worker processes, a load and a restart: about 37 s in CI, too close to the default 60 s bound.
    it.effect("BE-SHUT-003: SIGTERM under load: readiness turns 503 at once, the worker exits 0 inside the budget, and after a restart every transfer is applied exactly once", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(10), concurrency: 8 })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("load")
        const env = { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...budget("10 seconds") }
        const worker = yield* W.start(env)
        yield* W.waitReady(worker)
        const ids = Array.from({ length: 2_000 }, (_, i) => `${p}.t${i}`)
        const publishing = yield* Effect.forkChild(
          Effect.forEach(ids, (id) => send(stream, id, a, b, 1), { concurrency: 32, discard: true })
        )
        yield* Eventually.holds(
          "the worker is busy",
          Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.tag === "Committed").length >= 300),
          "60 seconds"
        )
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        yield* Eventually.poll("readiness 503", worker.get("/healthz/ready"), (r) => r.status === 503, {
          timeout: "2 seconds",
          interval: "10 millis"
        })
        assert.isBelow((yield* Clock.currentTimeMillis) - signalledAt, 1_000, "readiness turned 503 at once")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        assert.isBelow((yield* Clock.currentTimeMillis) - signalledAt, 10_000, "inside the budget")
        const logs = yield* worker.logs
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
        yield* Fiber.join(publishing)
        const before = (yield* W.outcomes(worker)).filter((o) => o.tag === "Committed").length
        assert.isBelow(before, ids.length, "the shutdown came while work was left")
        // A new worker finishes the rest; nothing is lost and nothing is applied twice.
        const next = yield* W.start(env)
        yield* Eventually.holds(
          "every transfer applied",
          Effect.map(transferCounts(ids), (counts) => counts.size === ids.length),
          "60 seconds"
        )
        yield* Eventually.holds(
          "nothing left on the consumer",
          Effect.map(stream.info, (info) => info.num_pending === 0 && info.num_ack_pending === 0),
          "30 seconds"
        )
        yield* next.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* next.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const counts = yield* transferCounts(ids)
        assert.isTrue([...counts.values()].every((n) => n === 1))
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n - 2_000n, [b]: 2_000n })
      }), 120_000)
  })
})

/**
 * Telemetry of the worker process (BE-SHUT-006 and the tracing contract): the ledger worker runs
 * as a child process with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an OTLP/HTTP receiver on
 * loopback that answers normally, slowly or never, or at a port where nothing listens. Export
 * delays are set far beyond the test, so everything the receiver gets was flushed by the
 * shutdown procedure.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Publisher } from "@jetworker/nats"
import { Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, type Duration, Effect } from "effect"
import { spawn } from "node:child_process"
import type { Readable } from "node:stream"
import { fileURLToPath } from "node:url"
import { ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import * as OtlpReceiver from "./support/otlpReceiver.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const encoder = new TextEncoder()

/** Buffers that only the shutdown flushes, a short telemetry share and a 6 s budget. */
const telemetryEnv = (endpoint: string) => ({
  OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
  OTEL_SERVICE_NAME: "ledger-under-test",
  OTEL_BSP_SCHEDULE_DELAY: "600000",
  OTEL_BLRP_SCHEDULE_DELAY: "600000",
  OTEL_METRIC_EXPORT_INTERVAL: "600000",
  OTEL_EXPORTER_OTLP_TIMEOUT: "30000",
  SHUTDOWN_BUDGET: "6 seconds",
  SHUTDOWN_READINESS_GRACE: "200 millis",
  SHUTDOWN_CLOSE: "1500 millis",
  SHUTDOWN_TELEMETRY: "1 second",
  SHUTDOWN_RESERVE: "500 millis"
})

const channels = ["traces", "metrics", "logs"] as const

/** The telemetry stage lines: channel -> result. */
const telemetryStages = (logs: ReadonlyArray<W.LogLine>) =>
  Object.fromEntries(
    logs.filter((l) => l.message === "shutdown.stage" && l.stage === "telemetry").map((l) => [String(l.target), l.result])
  )

/** The first line of `stream` from now on that matches `pattern`, within `timeout`. */
const lineOf = (stream: Readable, pattern: RegExp, timeout: Duration.Input) =>
  Effect.callback<RegExpMatchArray>((resume) => {
    let text = ""
    const onData = (chunk: Buffer) => {
      text += chunk.toString("utf8")
      for (const line of text.split("\n")) {
        const match = line.match(pattern)
        if (match !== null) {
          stream.off("data", onData)
          return resume(Effect.succeed(match))
        }
      }
    }
    stream.on("data", onData)
    return Effect.sync(() => stream.off("data", onData))
  }).pipe(Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.die(new Error(`no line matching ${pattern} within ${String(timeout)}`)) }))

const logFlood = fileURLToPath(new URL("./fixtures/log-flood-worker.ts", import.meta.url))

describe("telemetry", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("a span exported over OTLP continues the publisher's trace, with the messaging semantic-convention attributes; metrics and logs are exported too", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("trace")
        const receiver = yield* OtlpReceiver.make({ _tag: "normal" })
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...telemetryEnv(receiver.url) })
        yield* W.waitReady(worker)
        const id = `${p}.traced`
        // The publisher's side: a span of the test process; Publisher injects `traceparent`.
        const parent = yield* Effect.gen(function*() {
          const span = yield* Effect.currentSpan
          yield* Publisher.publish(stream.subject("eur"), encoder.encode(transfer(id, a, b, 1_00)), { msgId: id, stream: stream.stream })
          return span
        }).pipe(Effect.withSpan("test.publisher"))
        yield* Eventually.holds(
          "the transfer commits",
          Effect.map(W.outcomes(worker), (all) => all.some((o) => o.eventId === id && o.tag === "Committed"))
        )
        assert.strictEqual(receiver.requests("/v1/traces"), 0, "nothing exported before the shutdown")
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const spans = yield* receiver.spans
        const process = spans.find((s) => s.name === `process ${stream.stream}/${settings.consumer}`)
        assert.isDefined(process, spans.map((s) => s.name).join(", "))
        assert.strictEqual(process!.traceId, parent.traceId, "the consumer's span continues the publisher's trace")
        assert.notStrictEqual(process!.parentSpanId, undefined)
        assert.notStrictEqual(process!.parentSpanId, parent.spanId, "its parent is the publish span, a child of the test's span")
        assert.strictEqual(process!.kind, 5, "SPAN_KIND_CONSUMER")
        assert.deepInclude(process!.attributes, {
          "messaging.system": "nats",
          "messaging.operation.type": "process",
          "messaging.destination.name": stream.subject("eur"),
          "messaging.consumer.group.name": settings.consumer,
          "messaging.message.id": id,
          "jetworker.outcome": "Committed",
          "jetworker.attempt": 1
        })
        assert.deepStrictEqual([...new Set(yield* receiver.traceServices)], ["ledger-under-test"], "OTEL_SERVICE_NAME")
        const metricNames = yield* receiver.metricNames
        for (const name of ["jetworker.outcomes", "jetworker.handler.duration", "jetworker.settle.latency", "jetworker.consumer.lag"]) {
          assert.include(metricNames, name)
        }
        const logBodies = yield* receiver.logBodies
        assert.isTrue(logBodies.some((body) => body.includes(`consumer ${settings.consumer} started`)), logBodies.slice(0, 5).join(" | "))
        const logs = yield* worker.logs
        assert.deepStrictEqual(telemetryStages(logs), { traces: "completed", metrics: "completed", logs: "completed", logger: "completed" })
      }))

    it.effect("BE-SHUT-006: shutdown with full buffers: every buffered span, metric and log record is flushed inside the telemetry share", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("full")
        const receiver = yield* OtlpReceiver.make({ _tag: "normal" })
        // Buffers (and batches) large enough that nothing leaves before the shutdown.
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv(receiver.url),
          OTEL_BSP_MAX_QUEUE_SIZE: "20000",
          OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "20000",
          OTEL_BLRP_MAX_QUEUE_SIZE: "20000",
          OTEL_BLRP_MAX_EXPORT_BATCH_SIZE: "20000"
        })
        yield* W.waitReady(worker)
        const ids = Array.from({ length: 200 }, (_, i) => `${p}.t${i}`)
        for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds(
          "200 commits",
          Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.tag === "Committed").length === ids.length),
          "60 seconds"
        )
        assert.strictEqual(receiver.requests("/v1/traces") + receiver.requests("/v1/logs") + receiver.requests("/v1/metrics"), 0)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const spans = yield* receiver.spans
        const processed = new Set(
          spans.filter((s) => s.name.startsWith("process ")).map((s) => String(s.attributes["messaging.message.id"]))
        )
        assert.strictEqual(ids.filter((id) => processed.has(id)).length, ids.length)
        assert.include(yield* receiver.metricNames, "jetworker.outcomes")
        assert.isAbove((yield* receiver.logBodies).length, 0)
        const logs = yield* worker.logs
        assert.deepStrictEqual(telemetryStages(logs), { traces: "completed", metrics: "completed", logs: "completed", logger: "completed" })
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
        assert.strictEqual((yield* transferCounts(ids)).size, ids.length)
      }))

    it.effect("BE-SHUT-006: a slow receiver for each channel is cut at the end of the telemetry share: the total budget holds and the result stays success", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("slow")
        const receiver = yield* OtlpReceiver.make({ _tag: "slow", millis: 60_000 })
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...telemetryEnv(receiver.url) })
        yield* W.waitReady(worker)
        yield* stream.publish("eur", transfer(`${p}.t`, a, b, 1), `${p}.t`)
        yield* Eventually.holds("a commit", Effect.map(W.outcomes(worker), (all) => all.some((o) => o.tag === "Committed")))
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        assert.deepStrictEqual(exit, { code: 0, signal: null }, "a slow collector changes no result")
        assert.isBelow(took, 6_000 + 1_000, `exited ${took} ms after the signal; the budget is 6 s`)
        // Each channel did reach the receiver, which never answered in time.
        for (const channel of channels) assert.isAbove(receiver.requests(`/v1/${channel}`), 0, channel)
        const logs = yield* worker.logs
        assert.deepInclude(telemetryStages(logs), { traces: "timeout", metrics: "timeout", logs: "timeout" })
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
      }))

    it.effect("BE-SHUT-007: a telemetry endpoint that is not a URL is logged as telemetry.unavailable; the worker runs and commits without telemetry and a clean shutdown still exits 0", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("refused")
        // Malformed: refused by the settings check (a telemetry layer that throws is tested in
        // packages/node/test/TelemetryUnavailable.test.ts).
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv("http://[bad")
        })
        const ready = yield* Effect.raceFirst(
          W.waitReady(worker, "20 seconds").pipe(Effect.as("ready"), Effect.orElseSucceed(() => "not ready")),
          Effect.map(worker.child.exit, (exit) => `exited ${JSON.stringify(exit)}`)
        )
        const written = (yield* worker.logs).map((l) => `${l.level} ${l.message}`)
        assert.strictEqual(ready, "ready", `the worker wrote: ${JSON.stringify(written)}`)
        const unavailable = W.withMessage(yield* worker.logs, "telemetry.unavailable")
        assert.strictEqual(unavailable.length, 1)
        assert.include(String(unavailable[0]!.error), "http://[bad")
        const id = `${p}.t`
        yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds(
          "the transfer committed",
          Effect.map(W.outcomes(worker), (all) => all.some((o) => o.tag === "Committed" && o.eventId === id))
        )
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const logs = yield* worker.logs
        assert.strictEqual(W.withMessage(logs, "worker.defect").length, 0)
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
        // Nothing half built is flushed: only the stdout logger has a telemetry stage.
        assert.deepStrictEqual(telemetryStages(logs), { logger: "completed" })
      }))

    it.effect("BE-SHUT-006: an unreachable receiver for each channel: the total budget holds, the result stays success, and the failures yield a bounded number of log lines", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("gone")
        // A loopback port with nothing behind it.
        const port = yield* Effect.scoped(
          Effect.map(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 } }), (proxy) => proxy.port)
        )
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv(`http://127.0.0.1:${port}`),
          // Export often, so the failures have time to pile up before the shutdown.
          OTEL_BSP_SCHEDULE_DELAY: "50",
          OTEL_BLRP_SCHEDULE_DELAY: "50",
          OTEL_METRIC_EXPORT_INTERVAL: "100",
          OTEL_EXPORTER_OTLP_TIMEOUT: "1000"
        })
        yield* W.waitReady(worker)
        const ids = Array.from({ length: 20 }, (_, i) => `${p}.t${i}`)
        for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds(
          "20 commits",
          Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.tag === "Committed").length === ids.length)
        )
        yield* worker.waitForLog("telemetry.error", "10 seconds")
        const signalledAt = yield* Clock.currentTimeMillis
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const took = (yield* Clock.currentTimeMillis) - signalledAt
        assert.deepStrictEqual(exit, { code: 0, signal: null })
        assert.isBelow(took, 6_000 + 1_000)
        const logs = yield* worker.logs
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
        const errors = W.withMessage(logs, "telemetry.error")
        assert.isAbove(errors.length, 0)
        assert.isAtMost(errors.length, 11, "at most 10 a minute, plus one line counting the suppressed ones")
      }))
  })

  it.live("BE-SHUT-004: a collector that never answers and a log reader that stopped reading: the process exits inside SHUTDOWN_BUDGET", () =>
    Effect.gen(function*() {
      const receiver = yield* OtlpReceiver.make({ _tag: "silent" })
      // A reserve of 2 s: waits timed from the end of the telemetry share instead of the budget's
      // end would exit up to a whole second late, far beyond the margin below.
      const proc = spawn(process.execPath, [logFlood], {
        env: {
          ...process.env,
          OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
          HEALTH_PORT: "off",
          SHUTDOWN_BUDGET: "4 seconds",
          SHUTDOWN_READINESS_GRACE: "0 millis",
          SHUTDOWN_CLOSE: "500 millis",
          SHUTDOWN_TELEMETRY: "500 millis",
          SHUTDOWN_RESERVE: "2 seconds"
        },
        stdio: ["pipe", "pipe", "pipe"]
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => proc.kill("SIGKILL")))
      const exited = new Promise<{ readonly code: number | null; readonly at: number }>((resolve) =>
        proc.on("exit", (code) => resolve({ code, at: Date.now() }))
      )
      yield* lineOf(proc.stdout, /"message":"worker\.ready"/, "20 seconds")
      // Stop reading stdout, then let the worker log far more than the pipe holds.
      proc.stdout.pause()
      proc.stdin.write("go\n")
      const flooded = yield* lineOf(proc.stderr, /^flooded (\d+)$/, "20 seconds")
      assert.isAbove(Number(flooded[1]), 0, "the worker's stdout must be backed up for this test")
      const signalledAt = Date.now()
      proc.kill("SIGTERM")
      const exit = yield* Effect.promise(() => exited).pipe(Effect.timeout("15 seconds"))
      const took = exit.at - signalledAt
      assert.strictEqual(exit.code, 0, "telemetry and the log pipe change no result")
      // 700 ms for delivering the signal and reaping the process on a loaded machine; waits timed
      // from the end of the telemetry share instead of the budget's end exited a second late.
      assert.isBelow(took, 4_000 + 700, `exited ${took} ms after SIGTERM; SHUTDOWN_BUDGET is 4000 ms`)
    }), 40_000)

  it.live("a log reader that stops reading: the process holds at most LOG_BUFFER_BYTES of log lines, drops the rest, and says how many once the reader is back", () =>
    Effect.gen(function*() {
      const proc = spawn(process.execPath, [logFlood], {
        env: { ...process.env, HEALTH_PORT: "off", LOG_BUFFER_BYTES: "65536", FLOOD_LINES: "2000", SHUTDOWN_READINESS_GRACE: "0 millis" },
        stdio: ["pipe", "pipe", "pipe"]
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => proc.kill("SIGKILL")))
      let out = ""
      proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString("utf8")
      })
      const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)))
      yield* Eventually.holds("worker.ready", Effect.sync(() => out.includes(`"message":"worker.ready"`)), "20 seconds")
      // Stop reading stdout, then let the worker log about 2 MB.
      proc.stdout.pause()
      proc.stdin.write("go\n")
      const flooded = yield* lineOf(proc.stderr, /^flooded (\d+)$/, "20 seconds")
      // The bound, and at most the one line that crossed it.
      assert.isAbove(Number(flooded[1]), 0, "the worker's stdout must be backed up for this test")
      assert.isAtMost(Number(flooded[1]), 65_536 + 2_048, `bytes held for stdout: ${flooded[1]}`)
      proc.stdout.resume()
      proc.kill("SIGTERM")
      const code = yield* Effect.promise(() => exited).pipe(Effect.timeout("15 seconds"))
      assert.strictEqual(code, 0)
      const lines = out.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line) as Record<string, unknown>)
      const dropped = lines.filter((line) => line.message === "log.dropped")
      assert.isAbove(dropped.length, 0, "the count, written once there was room")
      assert.isTrue(dropped.every((line) => line.level === "WARN"))
      const fillers = lines.filter((line) => line.message === "filler").length
      const counted = dropped.reduce((sum, line) => sum + Number(line.dropped), 0)
      assert.isAbove(counted, 0)
      assert.strictEqual(fillers + counted, 2000, "every line written or counted")
      // The lifecycle events are never dropped.
      for (const event of ["shutdown.started", "shutdown.completed"]) {
        assert.lengthOf(lines.filter((line) => line.message === event), 1, event)
      }
    }), 40_000)
})

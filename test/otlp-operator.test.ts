/**
 * The telemetry a worker process exports, as an operator relying on it sees it: the ledger worker
 * runs as a child process with its OTLP endpoint pointing at a receiver on loopback that records
 * every request (path, headers, body) and answers with the status the test chooses.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Publisher } from "@jetworker/nats"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http"
import type { Socket } from "node:net"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { appliedCopies, ledgerStream, transfer, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const encoder = new TextEncoder()

/** One request the receiver got. */
interface Received {
  readonly path: string
  readonly headers: IncomingHttpHeaders
  readonly body: unknown
}

/** How the receiver answers a request to `path`: a status, a body and extra headers. */
type Answer = (path: string) => { readonly status: number; readonly body: string; readonly headers?: Record<string, string> }

/** A loopback OTLP/HTTP (JSON) receiver recording every request; closed with the scope. */
const receiver = (answer: Answer) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly received: Array<Received>; readonly close: () => void }>((resume) => {
      const received: Array<Received> = []
      const sockets = new Set<Socket>()
      const server = createServer((request: IncomingMessage, response: ServerResponse) => {
        const chunks: Array<Buffer> = []
        request.on("data", (chunk: Buffer) => chunks.push(chunk))
        request.on("end", () => {
          const path = (request.url ?? "").split("?")[0]!
          let body: unknown
          try {
            body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
          } catch {
            body = undefined
          }
          received.push({ path, headers: request.headers, body })
          const a = answer(path)
          response.writeHead(a.status, { "content-type": "application/json", ...a.headers })
          response.end(a.body)
        })
      })
      server.on("connection", (socket: Socket) => {
        sockets.add(socket)
        socket.on("close", () => sockets.delete(socket))
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        resume(Effect.succeed({
          url: `http://127.0.0.1:${port}`,
          received,
          close: () => {
            for (const socket of sockets) socket.destroy()
            server.close()
          }
        }))
      })
    }),
    (r) => Effect.sync(r.close)
  )

type AnyValue = { readonly stringValue?: string; readonly intValue?: string | number; readonly boolValue?: boolean; readonly doubleValue?: number }
type KeyValue = { readonly key: string; readonly value?: AnyValue }
const value = (v: AnyValue | undefined) =>
  v === undefined ? undefined : v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : v.boolValue ?? v.doubleValue)
const attributes = (list: ReadonlyArray<KeyValue> | undefined) => Object.fromEntries((list ?? []).map((a) => [a.key, value(a.value)]))

interface Span {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId: string | undefined
  readonly name: string
  readonly kind: number
  readonly attributes: Readonly<Record<string, unknown>>
}

const spansOf = (received: ReadonlyArray<Received>): ReadonlyArray<Span> =>
  received.filter((r) => r.path === "/v1/traces").flatMap((r) =>
    ((r.body as { resourceSpans?: Array<{ scopeSpans?: Array<{ spans?: Array<Record<string, unknown>> }> }> }).resourceSpans ?? [])
      .flatMap((rs) => rs.scopeSpans ?? [])
      .flatMap((s) => s.spans ?? [])
      .map((span): Span => ({
        traceId: String(span.traceId),
        spanId: String(span.spanId),
        parentSpanId: span.parentSpanId === undefined || span.parentSpanId === "" ? undefined : String(span.parentSpanId),
        name: String(span.name),
        kind: Number(span.kind),
        attributes: attributes(span.attributes as ReadonlyArray<KeyValue>)
      }))
  )

/** An exported metric: its name, unit, description, the data kind and the attribute sets of its points. */
interface ExportedMetric {
  readonly name: string
  readonly unit: string
  readonly description: string
  readonly kind: string
  readonly points: ReadonlyArray<Readonly<Record<string, unknown>>>
}

const metricsOf = (received: ReadonlyArray<Received>): ReadonlyArray<ExportedMetric> =>
  received.filter((r) => r.path === "/v1/metrics").flatMap((r) =>
    ((r.body as { resourceMetrics?: Array<{ scopeMetrics?: Array<{ metrics?: Array<Record<string, unknown>> }> }> })
      .resourceMetrics ?? [])
      .flatMap((rm) => rm.scopeMetrics ?? [])
      .flatMap((s) => s.metrics ?? [])
      .map((m): ExportedMetric => {
        const kind = ["sum", "gauge", "histogram", "exponentialHistogram", "summary"].find((k) => k in m) ?? "unknown"
        const data = m[kind] as { dataPoints?: Array<{ attributes?: Array<KeyValue> }> } | undefined
        return {
          name: String(m.name),
          unit: String(m.unit ?? ""),
          description: String(m.description ?? ""),
          kind,
          points: (data?.dataPoints ?? []).map((p) => attributes(p.attributes))
        }
      })
  )

/** Exports only at shutdown; a 6 s budget. */
const telemetryEnv = (endpoint: string) => ({
  OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
  OTEL_SERVICE_NAME: "ledger-operator-test",
  OTEL_BSP_SCHEDULE_DELAY: "600000",
  OTEL_BLRP_SCHEDULE_DELAY: "600000",
  OTEL_METRIC_EXPORT_INTERVAL: "600000",
  SHUTDOWN_BUDGET: "6 seconds",
  SHUTDOWN_READINESS_GRACE: "200 millis",
  SHUTDOWN_CLOSE: "1500 millis",
  SHUTDOWN_TELEMETRY: "1 second",
  SHUTDOWN_RESERVE: "500 millis"
})

describe("OTLP export of a worker, as an operator sees it", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("the trace goes on through the outbox: the relay's send span is a child of the delivery's process span, in the publisher's trace", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("otlp-outbox")
        const r = yield* receiver(() => ({ status: 200, body: "{}" }))
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...telemetryEnv(r.url) })
        yield* W.waitReady(worker)
        const id = `${p}.traced`
        const parent = yield* Effect.gen(function*() {
          const span = yield* Effect.currentSpan
          yield* Publisher.publish(stream.subject("eur"), encoder.encode(transfer(id, a, b, 1_00)), { msgId: id, stream: stream.stream })
          return span
        }).pipe(Effect.withSpan("test.publisher"))
        yield* Eventually.holds(
          "the transfer commits",
          Effect.map(W.outcomes(worker), (all) => all.some((o) => o.eventId === id && o.tag === "Committed"))
        )
        // The relay publishes the applied event after the commit.
        yield* Eventually.holds(
          "the relay published the applied event",
          Effect.map(appliedCopies(settings, p), (copies) => copies.size > 0)
        )
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const spans = spansOf(r.received)
        const process = spans.find((s) => s.name === `process ${stream.stream}/${settings.consumer}`)
        assert.isDefined(process)
        assert.strictEqual(process!.traceId, parent.traceId)
        const send = spans.find((s) =>
          s.name === `send ${settings.appliedStream}` &&
          s.attributes["messaging.destination.name"] === LedgerWorker.appliedSubject(settings, id)
        )
        assert.isDefined(send, spans.map((s) => s.name).join(", "))
        assert.strictEqual(send!.traceId, parent.traceId, "the relay's publish continues the publisher's trace")
        // Its parent is the transaction that recorded the event, inside the delivery's span.
        const ancestors: Array<string> = []
        for (let at = send!.parentSpanId; at !== undefined && ancestors.length < 10;) {
          ancestors.push(at)
          at = spans.find((s) => s.spanId === at)?.parentSpanId
        }
        assert.include(ancestors, process!.spanId, "the send span descends from the delivery that recorded the event")
        // The metrics carry the units and attributes Telemetry documents.
        const metrics = metricsOf(r.received)
        const first = (name: string) => {
          const metric = metrics.find((m) => m.name === name)
          assert.isDefined(metric, `${name} among ${[...new Set(metrics.map((m) => m.name))].join(", ")}`)
          return metric!
        }
        for (const [name, unit, kind, keys] of [
          ["jetworker.outcomes", "{delivery}", "sum", ["consumer", "outcome"]],
          ["jetworker.handler.duration", "ms", "histogram", ["consumer"]],
          ["jetworker.settle.latency", "ms", "histogram", ["command", "consumer"]],
          ["jetworker.in_flight", "{delivery}", "gauge", ["consumer"]],
          ["jetworker.producer.clock_skew", "ms", "gauge", ["consumer"]],
          ["jetworker.consumer.lag", "{message}", "gauge", ["consumer", "stream"]],
          ["jetworker.consumer.ack_pending", "{message}", "gauge", ["consumer", "stream"]]
        ] as const) {
          const metric = first(name)
          assert.deepStrictEqual({ name, unit: metric.unit, kind: metric.kind }, { name, unit, kind })
          assert.deepStrictEqual(Object.keys(metric.points[0] ?? {}).sort(), [...keys], name)
          assert.strictEqual(metric.points[0]!.consumer, settings.consumer, name)
        }
        assert.deepInclude(
          first("jetworker.outcomes").points,
          { consumer: settings.consumer, outcome: "Committed" }
        )
      }))

    it.effect("an API key in OTEL_EXPORTER_OTLP_HEADERS reaches the collector and never the process's output, even when the collector quotes it back in an error", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("otlp-key")
        const key = "sk-live-9f8e7d6c5b4a"
        const r = yield* receiver(() => ({ status: 401, body: JSON.stringify({ code: 16, message: `invalid api key ${key}` }) }))
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv(r.url),
          OTEL_EXPORTER_OTLP_HEADERS: `x-api-key=${key},x-tenant=acme`,
          OTEL_BSP_SCHEDULE_DELAY: "50",
          OTEL_BLRP_SCHEDULE_DELAY: "50",
          OTEL_METRIC_EXPORT_INTERVAL: "100",
          OTEL_EXPORTER_OTLP_TIMEOUT: "1000"
        })
        yield* W.waitReady(worker)
        const id = `${p}.t`
        yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds("a commit", Effect.map(W.outcomes(worker), (all) => all.some((o) => o.tag === "Committed")))
        yield* worker.waitForLog("telemetry.error", "10 seconds")
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        for (const path of ["/v1/traces", "/v1/metrics", "/v1/logs"]) {
          const sent = r.received.filter((x) => x.path === path)
          assert.isAbove(sent.length, 0, path)
          assert.isTrue(sent.every((x) => x.headers["x-api-key"] === key && x.headers["x-tenant"] === "acme"), path)
        }
        const out = [...(yield* worker.child.lines), ...(yield* worker.child.stderr)]
        const errors = W.withMessage(yield* worker.logs, "telemetry.error")
        console.log(errors.slice(0, 3))
        assert.isAbove(errors.length, 0)
        assert.deepStrictEqual(out.filter((line) => line.includes(key)), [], "no line quotes the key")
      }))

    it.effect("a collector answering 429 (Retry-After), 503 and 500: handling goes on, the error lines stay bounded, and the shutdown keeps its budget", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("otlp-status")
        const r = yield* receiver((path) =>
          path === "/v1/traces"
            ? { status: 429, body: "{}", headers: { "retry-after": "1" } }
            : path === "/v1/logs"
            ? { status: 503, body: "{}" }
            : { status: 500, body: JSON.stringify({ message: "internal error" }) }
        )
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv(r.url),
          OTEL_BSP_SCHEDULE_DELAY: "50",
          OTEL_BLRP_SCHEDULE_DELAY: "50",
          OTEL_METRIC_EXPORT_INTERVAL: "100",
          OTEL_EXPORTER_OTLP_TIMEOUT: "3000",
          OTEL_BSP_MAX_QUEUE_SIZE: "64",
          OTEL_BLRP_MAX_QUEUE_SIZE: "64"
        })
        yield* W.waitReady(worker)
        const ids = Array.from({ length: 40 }, (_, i) => `${p}.t${i}`)
        for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds(
          "40 commits",
          Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.tag === "Committed").length === ids.length),
          "30 seconds"
        )
        yield* worker.waitForLog("telemetry.error", "10 seconds")
        const signalledAt = Date.now()
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const took = Date.now() - signalledAt
        assert.isBelow(took, 6_000 + 1_000, `exited ${took} ms after the signal; the budget is 6 s`)
        const logs = yield* worker.logs
        assert.deepInclude(W.withMessage(logs, "shutdown.completed")[0]!, { result: "success" })
        const errors = W.withMessage(logs, "telemetry.error")
        assert.isAbove(errors.length, 0)
        assert.isAtMost(errors.length, 11, "at most 10 a minute, plus one line counting the suppressed ones")
        for (const path of ["/v1/traces", "/v1/metrics", "/v1/logs"]) assert.isAbove(r.received.filter((x) => x.path === path).length, 0, path)
      }))

    it.effect("telemetry settings that cannot be honoured are one readable telemetry.unavailable line at start-up, naming each variable and quoting no header value; the worker runs on", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("otlp-config")
        const key = "sk-live-0a1b2c3d4e5f"
        const r = yield* receiver(() => ({ status: 200, body: "{}" }))
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
          ...telemetryEnv(r.url),
          OTEL_EXPORTER_OTLP_HEADERS: `x-api-key${key}`,
          OTEL_BSP_MAX_QUEUE_SIZE: "0",
          OTEL_EXPORTER_OTLP_PROTOCOL: "grpc"
        })
        yield* W.waitReady(worker)
        const unavailable = W.withMessage(yield* worker.logs, "telemetry.unavailable")
        assert.strictEqual(unavailable.length, 1)
        const error = String(unavailable[0]!.error)
        for (const variable of ["OTEL_EXPORTER_OTLP_HEADERS entry 1", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_EXPORTER_OTLP_PROTOCOL"]) {
          assert.include(error, variable)
        }
        const id = `${p}.t`
        yield* stream.publish("eur", transfer(id, a, b, 1), id)
        yield* Eventually.holds("the transfer committed", Effect.map(W.outcomes(worker), (all) => all.some((o) => o.eventId === id)))
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const out = [...(yield* worker.child.lines), ...(yield* worker.child.stderr)]
        assert.deepStrictEqual(out.filter((line) => line.includes(key)), [], "no line quotes the key")
        assert.strictEqual(r.received.length, 0, "nothing exported with settings that were refused")
      }))
  })
})

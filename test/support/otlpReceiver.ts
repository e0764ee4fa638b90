/**
 * An OTLP/HTTP (JSON) receiver on loopback for telemetry tests: it records every request body
 * by path (`/v1/traces`, `/v1/metrics`, `/v1/logs`) and answers 200 at once (`normal`), after a
 * delay (`slow`), or never (`silent`: it reads the request and keeps the connection open). It
 * reads decoded spans, metric names and log bodies out of what it received. Closing the scope
 * closes it and every connection.
 */
import { Effect } from "effect"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { Socket } from "node:net"

/** How the receiver answers. */
export type Mode = { readonly _tag: "normal" } | { readonly _tag: "slow"; readonly millis: number } | { readonly _tag: "silent" }

/** One OTLP attribute value, as the JSON encoding writes it. */
type AnyValue = { readonly stringValue?: string; readonly intValue?: string | number; readonly boolValue?: boolean; readonly doubleValue?: number }

/** A span as received. */
export interface Span {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId: string | undefined
  readonly name: string
  readonly kind: number
  readonly attributes: Readonly<Record<string, string | number | boolean | undefined>>
}

export interface Receiver {
  readonly url: string
  readonly requests: (path: string) => number
  readonly spans: Effect.Effect<ReadonlyArray<Span>>
  readonly metricNames: Effect.Effect<ReadonlyArray<string>>
  readonly logBodies: Effect.Effect<ReadonlyArray<string>>
  /** The `service.name` of every resource that sent spans. */
  readonly traceServices: Effect.Effect<ReadonlyArray<string>>
}

const value = (v: AnyValue | undefined) =>
  v === undefined ? undefined : v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : v.boolValue ?? v.doubleValue)

/** Starts a receiver in `mode`. */
export const make = (mode: Mode) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly receiver: Receiver; readonly close: () => void }>((resume) => {
      const bodies = new Map<string, Array<unknown>>()
      const sockets = new Set<Socket>()
      const server = createServer((request: IncomingMessage, response: ServerResponse) => {
        const chunks: Array<Buffer> = []
        request.on("data", (chunk: Buffer) => chunks.push(chunk))
        request.on("end", () => {
          const path = (request.url ?? "").split("?")[0]!
          try {
            const list = bodies.get(path) ?? []
            list.push(JSON.parse(Buffer.concat(chunks).toString("utf8")))
            bodies.set(path, list)
          } catch {
            // not JSON: counted as nothing
          }
          const answer = () => {
            response.writeHead(200, { "content-type": "application/json" })
            response.end("{}")
          }
          if (mode._tag === "normal") answer()
          else if (mode._tag === "slow") setTimeout(answer, mode.millis).unref()
        })
      })
      server.on("connection", (socket: Socket) => {
        sockets.add(socket)
        socket.on("close", () => sockets.delete(socket))
      })
      const all = (path: string) => bodies.get(path) ?? []
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        const receiver: Receiver = {
          url: `http://127.0.0.1:${port}`,
          requests: (path) => all(path).length,
          spans: Effect.sync(() =>
            all("/v1/traces").flatMap((body) =>
              ((body as { resourceSpans?: Array<{ scopeSpans?: Array<{ spans?: Array<Record<string, unknown>> }> }> }).resourceSpans ?? [])
                .flatMap((r) => r.scopeSpans ?? [])
                .flatMap((s) => s.spans ?? [])
                .map((span): Span => ({
                  traceId: String(span.traceId),
                  spanId: String(span.spanId),
                  parentSpanId: span.parentSpanId === undefined || span.parentSpanId === "" ? undefined : String(span.parentSpanId),
                  name: String(span.name),
                  kind: Number(span.kind),
                  attributes: Object.fromEntries(
                    ((span.attributes ?? []) as Array<{ key: string; value?: AnyValue }>).map((a) => [a.key, value(a.value)])
                  )
                }))
            )
          ),
          traceServices: Effect.sync(() =>
            all("/v1/traces").flatMap((body) =>
              ((body as { resourceSpans?: Array<{ resource?: { attributes?: Array<{ key: string; value?: AnyValue }> } }> })
                .resourceSpans ?? []).map((r) =>
                  String(value((r.resource?.attributes ?? []).find((a) => a.key === "service.name")?.value) ?? "")
                )
            )
          ),
          metricNames: Effect.sync(() =>
            all("/v1/metrics").flatMap((body) =>
              ((body as { resourceMetrics?: Array<{ scopeMetrics?: Array<{ metrics?: Array<{ name: string }> }> }> }).resourceMetrics ?? [])
                .flatMap((r) => r.scopeMetrics ?? [])
                .flatMap((s) => s.metrics ?? [])
                .map((m) => m.name)
            )
          ),
          logBodies: Effect.sync(() =>
            all("/v1/logs").flatMap((body) =>
              ((body as { resourceLogs?: Array<{ scopeLogs?: Array<{ logRecords?: Array<{ body?: AnyValue }> }> }> }).resourceLogs ?? [])
                .flatMap((r) => r.scopeLogs ?? [])
                .flatMap((s) => s.logRecords ?? [])
                .map((l) => String(value(l.body) ?? ""))
            )
          )
        }
        resume(Effect.succeed({
          receiver,
          close: () => {
            for (const socket of sockets) socket.destroy()
            server.close()
          }
        }))
      })
    }),
    (r) => Effect.sync(r.close)
  ).pipe(Effect.map((r) => r.receiver))

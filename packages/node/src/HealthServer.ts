/**
 * The worker's probes and metrics over HTTP (`effect/http` on Node's server):
 *
 * - `GET /healthz/live`: 200 while the process is not wedged; 503 once the event loop has run a
 *   timer later than `maxEventLoopLag` within the last 10 seconds;
 * - `GET /healthz/ready`: 200 only while the process is running (start-up over, not shutting
 *   down) and every readiness component (consumers, dependencies such as the NATS connection) is
 *   up; 503 otherwise. The JSON body says which part is not ready and why;
 * - `GET /metrics`: every Effect metric of the process in the Prometheus text format, and the
 *   process's memory, read at each scrape: `process_resident_memory_bytes`,
 *   `nodejs_heap_size_total_bytes`, `nodejs_heap_size_used_bytes`, `nodejs_external_memory_bytes`
 *   and `nodejs_heap_size_limit_bytes` (V8's bound, which `--max-old-space-size` sets);
 * - anything else: 404.
 *
 * It binds once and logs the bound address as one `health.listening` line with a `port` field
 * (port 0 picks a free port). It serves nothing else and keeps no state of its own.
 *
 * @since 0.2.0
 */
import { NodeHttpServer } from "@effect/platform-node"
import type { Lifecycle } from "@jetworker/core"
import { Duration, Effect, type Scope } from "effect"
import { type HttpServerError, HttpServerRequest, HttpServerResponse } from "effect/http"
import { PrometheusMetrics } from "effect/observability"
import { createServer } from "node:http"
import * as EventLoopLag from "./internal/eventLoopLag.ts"
import * as ProcessMetrics from "./internal/processMetrics.ts"

/** Where to listen and what to report. */
export interface Options {
  /** TCP port; 0 picks a free one. */
  readonly port: number
  /** Interface to bind. Default: `0.0.0.0` (reachable by the orchestrator's probes). */
  readonly host?: string | undefined
  /**
   * Event-loop lag past which `/healthz/live` answers 503; positive and finite (0 would fail every
   * probe). Default: 5 seconds.
   */
  readonly maxEventLoopLag?: Duration.Input | undefined
  /** The readiness to report (a managed lifecycle's). */
  readonly readiness: () => Lifecycle.Readiness
}

/** A listening health server. */
export interface HealthServer {
  /** The bound port. */
  readonly port: number
}

const json = (body: unknown, status: number) =>
  HttpServerResponse.jsonUnsafe(body, { status, headers: { "cache-control": "no-store" } })

/** Starts the server in the current scope; closing the scope closes it. */
export const make = (options: Options): Effect.Effect<HealthServer, HttpServerError.ServeError, Scope.Scope> =>
  Effect.gen(function*() {
    const maxLag = Duration.fromInput(options.maxEventLoopLag ?? "5 seconds")
    if (maxLag._tag === "None" || !Duration.isFinite(maxLag.value) || !(Duration.toMillis(maxLag.value) > 0)) {
      // A programming error, as a defect naming the option (`Worker` checks its variable first).
      return yield* Effect.die(
        new Error(`HealthServer.make: maxEventLoopLag must be a positive, finite duration, got ${String(options.maxEventLoopLag)}`)
      )
    }
    const maxLagMillis = Duration.toMillis(maxLag.value)
    const lag = yield* Effect.acquireRelease(Effect.sync(() => EventLoopLag.start()), (lag) => Effect.sync(lag.stop))
    const server = yield* NodeHttpServer.make(() => createServer({ requestTimeout: 10_000 }), {
      port: options.port,
      host: options.host ?? "0.0.0.0",
      gracefulShutdownTimeout: "1 second"
    })
    const app = Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const path = request.url.split("?")[0]
      if (request.method !== "GET") return HttpServerResponse.text("method not allowed\n", { status: 405 })
      switch (path) {
        case "/healthz/live": {
          const worst = lag.worst()
          const live = worst <= maxLagMillis
          return json({ live, eventLoopLagMs: Math.round(worst), maxEventLoopLagMs: maxLagMillis }, live ? 200 : 503)
        }
        case "/healthz/ready": {
          const readiness = options.readiness()
          return json(readiness, readiness.ready ? 200 : 503)
        }
        case "/metrics": {
          const body = yield* PrometheusMetrics.format()
          return HttpServerResponse.text(body + ProcessMetrics.prometheusText(body), { contentType: "text/plain; version=0.0.4; charset=utf-8" })
        }
        default:
          return HttpServerResponse.text("not found\n", { status: 404 })
      }
    })
    yield* server.serve(app)
    const address = server.address
    const port = address._tag === "UnixPathAddress" ? 0 : address.port
    yield* Effect.logInfo("health.listening").pipe(Effect.annotateLogs({ port, host: options.host ?? "0.0.0.0" }))
    return { port }
  })

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
 * - `HEAD` on each of these answers as `GET` does, without the body; another method is a 405 with
 *   `Allow: GET, HEAD`; any other path: 404.
 *
 * It binds once and logs the bound address as one `health.listening` line with a `port` field
 * (port 0 picks a free port). It serves nothing else and keeps no state of its own.
 *
 * It is bounded against clients that hold connections (slowloris): at most `maxConnections`
 * connections at a time (64 by default; past it a new one is closed at once), and a request's
 * headers and the whole request are due within {@link requestTimeoutMillis} (3 s) of the connection
 * or of the request's start, checked every {@link connectionsCheckingIntervalMillis} (1 s), so a
 * client that sends half a request, or nothing, is cut within 4 s (a half request with a 408).
 * Closing it closes every connection as soon as no response is being written (at most
 * {@link closeGraceMillis} for one that is): a half-sent request does not hold the shutdown.
 *
 * @since 0.1.0
 */
import { NodeHttpServer } from "@effect/platform-node"
import type { Lifecycle } from "@jetworker/core"
import { Duration, Effect, type Scope } from "effect"
import { type HttpServerError, HttpServerRequest, HttpServerResponse } from "effect/http"
import { PrometheusMetrics } from "effect/observability"
import { createServer, type ServerResponse } from "node:http"
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
  /**
   * How many connections may be open at once; a positive integer. Past it, a new connection is
   * closed as soon as it is accepted. Default: {@link defaultMaxConnections}.
   */
  readonly maxConnections?: number | undefined
}

/**
 * The default bound on open connections: room for the orchestrator's probes, a few scrapers and an
 * operator's `curl`, without letting a client that opens connections exhaust file descriptors.
 */
export const defaultMaxConnections = 64

/**
 * How long a connection may take to send a whole request (the headers included: probes send no
 * body), from its opening or the request's first byte. Node answers 408 and closes it past that.
 */
export const requestTimeoutMillis = 3_000

/** How often Node looks for connections past {@link requestTimeoutMillis} (its default is 30 s). */
export const connectionsCheckingIntervalMillis = 1_000

/** How long closing the server waits for responses being written before closing their connections. */
export const closeGraceMillis = 1_000

/** The methods every path serves, as a 405's `Allow` header says. */
const allowed = "GET, HEAD"

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
    const maxConnections = options.maxConnections ?? defaultMaxConnections
    if (!(Number.isSafeInteger(maxConnections) && maxConnections > 0)) {
      return yield* Effect.die(
        new Error(`HealthServer.make: maxConnections must be a positive integer, got ${String(options.maxConnections)}`)
      )
    }
    const maxLagMillis = Duration.toMillis(maxLag.value)
    const lag = yield* Effect.acquireRelease(Effect.sync(() => EventLoopLag.start()), (lag) => Effect.sync(lag.stop))
    const nodeServer = createServer({
      requestTimeout: requestTimeoutMillis,
      headersTimeout: requestTimeoutMillis,
      connectionsCheckingInterval: connectionsCheckingIntervalMillis
    })
    nodeServer.maxConnections = maxConnections
    const server = yield* NodeHttpServer.make(() => nodeServer, {
      port: options.port,
      host: options.host ?? "0.0.0.0",
      gracefulShutdownTimeout: Duration.millis(closeGraceMillis)
    })
    const app = Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const path = request.url.split("?")[0]
      if (path !== "/healthz/live" && path !== "/healthz/ready" && path !== "/metrics") {
        return HttpServerResponse.text("not found\n", { status: 404 })
      }
      // HEAD is answered as GET: the server writes the head of the response and leaves the body out.
      if (request.method !== "GET" && request.method !== "HEAD") {
        return HttpServerResponse.text("method not allowed\n", { status: 405, headers: { allow: allowed } })
      }
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
        default: {
          const body = yield* PrometheusMetrics.format()
          return HttpServerResponse.text(body + ProcessMetrics.prometheusText(body), { contentType: "text/plain; version=0.0.4; charset=utf-8" })
        }
      }
    })
    yield* server.serve(app)
    yield* closingPromptly(nodeServer)
    const address = server.address
    const port = address._tag === "UnixPathAddress" ? 0 : address.port
    yield* Effect.logInfo("health.listening").pipe(Effect.annotateLogs({ port, host: options.host ?? "0.0.0.0" }))
    return { port }
  })

/**
 * Closes `server` with its scope without waiting on connections that are not being answered.
 * Node's `close` only ends idle keep-alive connections: one holding half a request, or one that
 * sent nothing yet, would hold it until its request timeout (and the effect server's graceful
 * wait of {@link closeGraceMillis}). Here every connection is closed as soon as no response is
 * being written, and at the latest after {@link closeGraceMillis}. Added after `serve`, so it runs
 * before the effect server's own close, which then finds the server closed.
 */
const closingPromptly = (server: ReturnType<typeof createServer>): Effect.Effect<void, never, Scope.Scope> => {
  const writing = new Set<ServerResponse>()
  let closing = false
  server.on("request", (_request, response: ServerResponse) => {
    writing.add(response)
    response.once("close", () => {
      writing.delete(response)
      if (closing && writing.size === 0) server.closeAllConnections()
    })
  })
  return Effect.addFinalizer(() =>
    Effect.callback<void>((resume) => {
      closing = true
      const cut = setTimeout(() => server.closeAllConnections(), closeGraceMillis)
      // Called once every connection is gone (or at once, with an error, if it was not listening).
      server.close(() => {
        clearTimeout(cut)
        resume(Effect.void)
      })
      if (writing.size === 0) server.closeAllConnections()
    })
  )
}

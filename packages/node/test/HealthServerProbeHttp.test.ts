/**
 * The health server's HTTP behaviour towards probes and hostile clients, on a `HealthServer` in
 * this process, over real sockets:
 *
 * - `HEAD` answers as `GET` does, without a body (RFC 9110 §9.1: GET and HEAD are mandatory; load
 *   balancers and uptime checkers probe with HEAD); another method is a 405 with `Allow`;
 * - `/healthz/live` measures lag on the monotonic clock: a step of the wall clock (NTP, a resumed
 *   VM) is not a blocked event loop, a loop that is really blocked still is;
 * - a client that sends half a request (slowloris) is cut within a few seconds, connections past
 *   `maxConnections` are refused, and closing the server does not wait on half-sent requests.
 */
import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { HealthServer } from "@jetworker/node"
import { Duration, Effect, Exit, Result, Scope } from "effect"
import { connect, type Socket } from "node:net"
import { performance } from "node:perf_hooks"

const request = (port: number, path: string, method = "GET") =>
  Effect.promise(async () => {
    const response = await fetch(`http://127.0.0.1:${port}${path}`, { method, signal: AbortSignal.timeout(5_000) })
    return {
      status: response.status,
      allow: response.headers.get("allow"),
      type: response.headers.get("content-type"),
      body: await response.text()
    }
  })

/** What a raw connection received, and how long after it was opened it was closed. */
interface Received {
  readonly text: string
  readonly closedAfterMs: number
}

/**
 * Opens a connection, writes `text` and collects what comes back until the server closes it (or
 * `limitMs` passes: then `closedAfterMs` is `Infinity` and the socket is destroyed here). An error
 * (a reset) counts as closed.
 */
const raw = (port: number, text: string, limitMs = 10_000) =>
  Effect.callback<Received>((resume) => {
    const opened = performance.now()
    const chunks: Array<Buffer> = []
    const socket = connect({ port, host: "127.0.0.1" })
    let done = false
    const finish = (closedAfterMs: number) => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed({ text: Buffer.concat(chunks).toString("latin1"), closedAfterMs }))
    }
    const timer = setTimeout(() => finish(Number.POSITIVE_INFINITY), limitMs)
    socket.on("connect", () => socket.write(text))
    socket.on("data", (chunk) => chunks.push(chunk))
    socket.on("error", () => finish(performance.now() - opened))
    socket.on("close", () => finish(performance.now() - opened))
    return Effect.sync(() => finish(Number.POSITIVE_INFINITY))
  })

/**
 * A connection that wrote `text` once connected, reading all it is sent (unread, the end of the
 * stream would never be seen, nor the close); destroyed with the scope.
 */
const opened = (port: number, text: string) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly socket: Socket; readonly closed: Promise<number>; readonly received: () => string }>((resume) => {
      const start = performance.now()
      const chunks: Array<Buffer> = []
      const socket = connect({ port, host: "127.0.0.1" })
      const closed = new Promise<number>((resolve) => socket.on("close", () => resolve(performance.now() - start)))
      socket.on("data", (chunk) => chunks.push(chunk))
      socket.on("error", () => {})
      socket.on("connect", () => {
        if (text !== "") socket.write(text)
        resume(Effect.succeed({ socket, closed, received: () => Buffer.concat(chunks).toString("latin1") }))
      })
    }),
    ({ socket }) => Effect.sync(() => socket.destroy())
  )

/** Waits (at most `limitMs`) for a connection to be closed; `Infinity` if it was not. */
const closedWithin = (connection: { readonly closed: Promise<number> }, limitMs: number) =>
  Effect.promise(() => connection.closed).pipe(
    Effect.timeoutOption(Duration.millis(limitMs)),
    Effect.map((ms) => (ms._tag === "Some" ? ms.value : Number.POSITIVE_INFINITY))
  )

const probe = (path: string, method = "GET") => `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`
/** A request whose headers never end: the blank line is never sent. */
const halfRequest = "GET /healthz/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"

const running = (options: Partial<HealthServer.Options> = {}) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "10 seconds" })
    const server = yield* HealthServer.make({ port: 0, host: "127.0.0.1", readiness: lifecycle.readiness, ...options })
    yield* lifecycle.started
    const consumer = yield* lifecycle.component("c", "consumer")
    yield* consumer.up
    return server
  })

describe("HealthServer over HTTP", () => {
  it.live("HEAD on each path answers as GET does (status and content type), without a body", () =>
    Effect.gen(function*() {
      const server = yield* running()
      for (const path of ["/healthz/ready", "/healthz/live", "/metrics"]) {
        const get = yield* request(server.port, path)
        const head = yield* request(server.port, path, "HEAD")
        assert.deepStrictEqual([head.status, head.type, head.body], [200, get.type, ""], path)
        // On the wire: the head of the response and nothing after it.
        const { text } = yield* raw(server.port, probe(path, "HEAD"))
        assert.match(text, /^HTTP\/1\.1 200 /, path)
        assert.isTrue(text.endsWith("\r\n\r\n"), `${path}: a body after the head of a HEAD response: ${JSON.stringify(text)}`)
      }
      assert.strictEqual((yield* request(server.port, "/nope", "HEAD")).status, 404)
    }))

  it.live("another method is a 405 with Allow: GET, HEAD; an unknown path is a 404 whatever the method", () =>
    Effect.gen(function*() {
      const server = yield* running()
      for (const path of ["/healthz/ready", "/healthz/live", "/metrics"]) {
        for (const method of ["POST", "PUT", "DELETE"]) {
          const answer = yield* request(server.port, path, method)
          assert.deepStrictEqual([answer.status, answer.allow], [405, "GET, HEAD"], `${method} ${path}`)
        }
      }
      assert.strictEqual((yield* request(server.port, "/nope", "POST")).status, 404)
    }))

  it.live("a wall-clock step forward is not event-loop lag: /healthz/live stays 200", () =>
    Effect.gen(function*() {
      const server = yield* running()
      assert.strictEqual((yield* request(server.port, "/healthz/live")).status, 200)
      const realNow = Date.now
      yield* Effect.acquireRelease(
        Effect.sync(() => {
          // The system clock is stepped one minute forward (as NTP does on a drifted host).
          Date.now = () => realNow() + 60_000
        }),
        () =>
          Effect.sync(() => {
            Date.now = realNow
          })
      )
      const live = yield* request(server.port, "/healthz/live")
      assert.strictEqual(live.status, 200, live.body)
      assert.isBelow(JSON.parse(live.body).eventLoopLagMs, 1_000, live.body)
    }))

  it.live("a loop that is really blocked is still seen: /healthz/live answers 503 with the lag", () =>
    Effect.gen(function*() {
      const server = yield* running({ maxEventLoopLag: "100 millis" })
      assert.strictEqual((yield* request(server.port, "/healthz/live")).status, 200)
      // Blocks this process's event loop for 400 ms, as a synchronous handler would.
      const end = performance.now() + 400
      while (performance.now() < end) {
        // busy
      }
      const live = yield* request(server.port, "/healthz/live")
      assert.strictEqual(live.status, 503, live.body)
      assert.isAtLeast(JSON.parse(live.body).eventLoopLagMs, 300, live.body)
    }))

  it.live("a client that sends half a request, or nothing, is cut within a few seconds (408 for the half request)", () =>
    Effect.gen(function*() {
      const server = yield* running()
      const [half, silent] = yield* Effect.all([raw(server.port, halfRequest), raw(server.port, "")], { concurrency: 2 })
      // Headers are due within 3 s, checked every second: cut by 4 s, 6 on a busy machine (Node's
      // defaults took 10 to 40 s).
      assert.isBelow(half.closedAfterMs, 6_000, "half a request")
      assert.match(half.text, /^HTTP\/1\.1 408 /)
      assert.isBelow(silent.closedAfterMs, 6_000, "nothing sent")
      assert.strictEqual((yield* raw(server.port, probe("/healthz/live"))).text.split("\r\n")[0], "HTTP/1.1 200 OK")
    }))

  it.live("connections past maxConnections are refused while slow clients hold them, and served again once those are cut", () =>
    Effect.gen(function*() {
      const server = yield* running({ maxConnections: 3 })
      const holders = yield* Effect.forEach([1, 2, 3], () => opened(server.port, halfRequest))
      // The server accepts in order: the three holders are counted before this one.
      const refused = yield* raw(server.port, probe("/healthz/live"))
      assert.notMatch(refused.text, /^HTTP/, `a connection past the limit was served: ${refused.text}`)
      assert.isBelow(refused.closedAfterMs, 1_000, "refused at once")
      for (const holder of holders) {
        assert.isBelow(yield* closedWithin(holder, 8_000), 6_000, "a slow client is cut")
        assert.match(holder.received(), /^HTTP\/1\.1 408 /)
      }
      const served = yield* raw(server.port, probe("/healthz/live"))
      assert.strictEqual(served.text.split("\r\n")[0], "HTTP/1.1 200 OK")
    }))

  it.live("closing the server does not wait on half-sent requests, silent or idle connections", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const server = yield* running().pipe(Scope.provide(scope))
      const connections = yield* Effect.all([
        opened(server.port, halfRequest),
        opened(server.port, ""),
        // Keep-alive: answered, then idle on an open connection.
        opened(server.port, "GET /healthz/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
      ])
      const start = performance.now()
      yield* Scope.close(scope, Exit.void)
      const closeMs = performance.now() - start
      // The server's own graceful wait for responses in flight is 1 s: none is, so it is not taken.
      assert.isBelow(closeMs, 500, "the server's close")
      for (const connection of connections) assert.isBelow(yield* closedWithin(connection, 2_000), 2_000)
    }))

  it.live("maxConnections that is not a positive integer is refused before listening, naming the option", () =>
    Effect.gen(function*() {
      for (const maxConnections of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
        const exit = yield* running({ maxConnections }).pipe(Effect.scoped, Effect.exit)
        assert.isTrue(Exit.isFailure(exit), String(maxConnections))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "HealthServer.make: maxConnections must be a positive integer")
      }
    }))
})

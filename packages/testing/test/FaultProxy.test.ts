import { assert, describe, it } from "@effect/vitest"
import { connect, type NatsConnection, type Status, TimeoutError } from "@nats-io/transport-node"
import { Effect, Exit, Option, Queue, Schedule, Scope, Stream } from "effect"
import { randomUUID } from "node:crypto"
import * as Net from "node:net"
import * as FaultProxy from "../src/FaultProxy.ts"

const bound = "10 seconds"
const nats = { host: "127.0.0.1", port: 4222 }

/** A TCP echo server on an ephemeral loopback port, closed with the scope. */
const echoServer = Effect.acquireRelease(
  Effect.callback<Net.Server>((resume) => {
    const server = Net.createServer((socket) => {
      socket.on("error", () => {})
      socket.pipe(socket)
    })
    server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
  }),
  (server) =>
    Effect.callback<void>((resume) => {
      server.close(() => resume(Effect.void))
    }).pipe(Effect.timeoutOption(bound))
).pipe(
  Effect.map((server) => ({ host: "127.0.0.1", port: (server.address() as Net.AddressInfo).port })),
  Effect.timeout(bound)
)

/** A raw TCP client that records what it receives and how its socket ended. */
const client = (port: number) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const socket = Net.connect({ host: "127.0.0.1", port })
      const state = { received: "", closed: false, error: undefined as string | undefined }
      socket.setEncoding("utf8")
      socket.on("data", (chunk: string) => {
        state.received += chunk
      })
      socket.on("error", (error: NodeJS.ErrnoException) => {
        state.error = error.code
      })
      socket.on("close", () => {
        state.closed = true
      })
      /** Waits (bounded by the caller) until `predicate` holds, checking on each socket event. */
      const until = (predicate: () => boolean) =>
        Effect.callback<void>((resume) => {
          if (predicate()) return resume(Effect.void)
          const check = () => {
            if (predicate()) {
              unlisten()
              resume(Effect.void)
            }
          }
          const unlisten = () => {
            socket.off("data", check)
            socket.off("close", check)
          }
          socket.on("data", check)
          socket.on("close", check)
          return Effect.sync(unlisten)
        })
      return {
        socket,
        state,
        send: (text: string) => Effect.sync(() => socket.write(text)),
        received: (text: string) => until(() => state.received.includes(text)),
        closed: until(() => state.closed)
      }
    }),
    (c) => Effect.sync(() => c.socket.destroy())
  )

/** A NATS connection closed with the scope. */
const natsConnection = (servers: string, options: { readonly reconnectTimeWait?: number } = {}) =>
  Effect.acquireRelease(
    Effect.tryPromise(() => connect({ servers, maxReconnectAttempts: -1, ...options })).pipe(Effect.timeout(bound)),
    (nc) => Effect.promise(() => nc.close()).pipe(Effect.timeoutOption(bound))
  )

/** Every status event of `nc` from now on, in a queue. */
const statusEvents = (nc: NatsConnection) =>
  Effect.gen(function*() {
    const events = yield* Queue.unbounded<Status>()
    // nc.status() buffers from this call on, so no event is lost before the fiber starts.
    yield* Stream.fromAsyncIterable(nc.status(), (error) => error).pipe(
      Stream.runForEach((status) => Queue.offer(events, status)),
      Effect.ignore,
      Effect.forkScoped
    )
    return events
  })

/** Takes events until one of `type` arrives; returns it and the types skipped on the way. */
const awaitStatus = (events: Queue.Queue<Status>, type: Status["type"]) =>
  Effect.gen(function*() {
    const skipped: Array<string> = []
    while (true) {
      const status = yield* Queue.take(events)
      if (status.type === type) return { status, skipped }
      skipped.push(status.type)
    }
  }).pipe(Effect.timeout(bound))

/** A responder on a direct connection (not through the proxy) that echoes requests on a fresh subject. */
const echoResponder = Effect.gen(function*() {
  const direct = yield* natsConnection(`${nats.host}:${nats.port}`)
  const subject = `jetworker.test.faultproxy.${randomUUID()}`
  direct.subscribe(subject, {
    callback: (error, msg) => {
      if (error === null) msg.respond(msg.data)
    }
  })
  yield* Effect.tryPromise(() => direct.flush()).pipe(Effect.timeout(bound))
  return subject
})

describe("FaultProxy", () => {
  it.live("forwards bytes both ways and counts them", () =>
    Effect.gen(function*() {
      const echo = yield* echoServer
      const proxy = yield* FaultProxy.make({ target: echo })
      assert.deepStrictEqual(proxy.address, { host: "127.0.0.1", port: proxy.port })
      const c = yield* client(proxy.port)
      yield* c.send("hello")
      yield* c.received("hello").pipe(Effect.timeout(bound))
      assert.strictEqual(yield* proxy.connections, 1)
      assert.deepStrictEqual(yield* proxy.stats, { bytesToTarget: 5, bytesToClient: 5, accepted: 1, refused: 0 })
    }))

  it.live("cut resets open connections and new ones until restore", () =>
    Effect.gen(function*() {
      const echo = yield* echoServer
      const proxy = yield* FaultProxy.make({ target: echo })
      const before = yield* client(proxy.port)
      yield* before.send("one")
      yield* before.received("one").pipe(Effect.timeout(bound))

      yield* proxy.cut
      yield* before.closed.pipe(Effect.timeout(bound))
      assert.strictEqual(before.state.error, "ECONNRESET")
      assert.strictEqual(yield* proxy.connections, 0)

      const during = yield* client(proxy.port)
      yield* during.closed.pipe(Effect.timeout(bound))
      assert.strictEqual(during.state.error, "ECONNRESET")
      assert.strictEqual(during.state.received, "")

      yield* proxy.restore
      const after = yield* client(proxy.port)
      yield* after.send("two")
      yield* after.received("two").pipe(Effect.timeout(bound))
      const stats = yield* proxy.stats
      assert.strictEqual(stats.accepted, 2)
      assert.strictEqual(stats.refused, 1)
    }))

  it.live("pause holds bytes back without closing, resume delivers them", () =>
    Effect.gen(function*() {
      const echo = yield* echoServer
      const proxy = yield* FaultProxy.make({ target: echo })
      const c = yield* client(proxy.port)
      yield* c.send("a")
      yield* c.received("a").pipe(Effect.timeout(bound))

      yield* proxy.pause
      yield* c.send("b")
      // Nothing may arrive while paused: this bounded wait is the assertion, not a pacing sleep.
      assert.isTrue(Option.isNone(yield* c.received("b").pipe(Effect.timeoutOption("300 millis"))))
      assert.strictEqual((yield* proxy.stats).bytesToTarget, 1)
      assert.strictEqual(yield* proxy.connections, 1)
      assert.isFalse(c.state.closed)

      yield* proxy.resume
      yield* c.received("ab").pipe(Effect.timeout(bound))
      assert.deepStrictEqual(yield* proxy.stats, { bytesToTarget: 2, bytesToClient: 2, accepted: 1, refused: 0 })
    }))

  it.live("pauseToClient lets requests through and holds the replies back until resume", () =>
    Effect.gen(function*() {
      const echo = yield* echoServer
      const proxy = yield* FaultProxy.make({ target: echo })
      const c = yield* client(proxy.port)
      yield* c.send("a")
      yield* c.received("a").pipe(Effect.timeout(bound))

      yield* proxy.pauseToClient
      yield* c.send("b")
      // The request reaches the target (it is counted as forwarded); its echo waits.
      yield* Effect.suspend(() =>
        Effect.flatMap(proxy.stats, (stats) => stats.bytesToTarget === 2 ? Effect.void : Effect.fail("not yet"))
      ).pipe(Effect.retry({ times: 100, schedule: Schedule.spaced("20 millis") }), Effect.timeout(bound))
      // Nothing may arrive while replies are held: this bounded wait is the assertion.
      assert.isTrue(Option.isNone(yield* c.received("ab").pipe(Effect.timeoutOption("300 millis"))))
      assert.isFalse(c.state.closed)

      yield* proxy.resume
      yield* c.received("ab").pipe(Effect.timeout(bound))
      assert.deepStrictEqual(yield* proxy.stats, { bytesToTarget: 2, bytesToClient: 2, accepted: 1, refused: 0 })
    }))

  it.live("closing the scope closes the listener and every connection", () =>
    Effect.gen(function*() {
      const echo = yield* echoServer
      const scope = yield* Scope.make()
      const proxy = yield* FaultProxy.make({ target: echo }).pipe(Scope.provide(scope))
      const c = yield* client(proxy.port)
      yield* c.send("x")
      yield* c.received("x").pipe(Effect.timeout(bound))

      yield* Scope.close(scope, Exit.void)
      yield* c.closed.pipe(Effect.timeout(bound))
      assert.strictEqual(c.state.error, "ECONNRESET")
      const later = yield* client(proxy.port)
      yield* later.closed.pipe(Effect.timeout(bound))
      assert.strictEqual(later.state.error, "ECONNREFUSED")
    }))

  it.live("rejects a listen port out of range", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(FaultProxy.make({ target: nats, listenPort: 70_000 }))
      assert.strictEqual(error.reason, "InvalidOptions")
    }))

  it.live("fails with ListenFailed when the port is taken", () =>
    Effect.gen(function*() {
      const first = yield* FaultProxy.make({ target: nats })
      const error = yield* Effect.flip(FaultProxy.make({ target: nats, listenPort: first.port }))
      assert.strictEqual(error.reason, "ListenFailed")
      assert.include(error.message, "EADDRINUSE")
      assert.isTrue(error.isRetryable)
    }))

  it.live("a NATS client sees disconnect on cut and reconnect on restore, then requests work", () =>
    Effect.gen(function*() {
      const subject = yield* echoResponder
      const proxy = yield* FaultProxy.make({ target: nats })
      const nc = yield* natsConnection(`127.0.0.1:${proxy.port}`, { reconnectTimeWait: 100 })
      const events = yield* statusEvents(nc)
      const request = (timeout: number) =>
        Effect.tryPromise(() => nc.request(subject, "ping", { timeout })).pipe(Effect.map((msg) => msg.string()))
      assert.strictEqual(yield* request(2_000), "ping")

      yield* proxy.cut
      const disconnect = yield* awaitStatus(events, "disconnect")
      assert.deepStrictEqual(disconnect.skipped, [])
      // While cut, every reconnect attempt is accepted by TCP and reset by the proxy: a second
      // "reconnecting" means the first attempt has been reset.
      yield* awaitStatus(events, "reconnecting")
      yield* awaitStatus(events, "reconnecting")
      assert.isAtLeast((yield* proxy.stats).refused, 1)

      yield* proxy.restore
      yield* awaitStatus(events, "reconnect")
      yield* Effect.tryPromise(() => nc.flush()).pipe(Effect.timeout(bound))
      assert.strictEqual(yield* request(2_000), "ping")
      assert.strictEqual(yield* proxy.connections, 1)
    }))

  it.live("a NATS request times out while paused and succeeds after resume", () =>
    Effect.gen(function*() {
      const subject = yield* echoResponder
      const proxy = yield* FaultProxy.make({ target: nats })
      const nc = yield* natsConnection(`127.0.0.1:${proxy.port}`, { reconnectTimeWait: 100 })
      const events = yield* statusEvents(nc)
      const request = (timeout: number) =>
        Effect.tryPromise({ try: () => nc.request(subject, "ping", { timeout }), catch: (error) => error }).pipe(
          Effect.map((msg) => msg.string())
        )
      assert.strictEqual(yield* request(2_000), "ping")

      yield* proxy.pause
      const error = yield* Effect.flip(request(300))
      assert.instanceOf(error, TimeoutError)
      assert.isFalse(nc.isClosed())

      yield* proxy.resume
      assert.strictEqual(yield* request(2_000), "ping")
      // The pause was invisible to the client: no disconnect, no reconnect.
      const seen = yield* Queue.clear(events)
      assert.deepStrictEqual(seen.map((s) => s.type), [])
    }))
})

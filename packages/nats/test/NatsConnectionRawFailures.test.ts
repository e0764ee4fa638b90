/**
 * A first connection that fails in a way nats.js words only for itself ("error connecting - node
 * provided an undefined error", "unexpected response from server", a JSON parser's complaint, a bare
 * "connect ECONNRESET 127.0.0.1:…", "getaddrinfo ENOTFOUND …") says what happened in words, names
 * the server (without the URL's credentials) and what to check, and keeps its reason (a retryable
 * failure stays retryable). Each is made for real against a loopback TCP listener that misbehaves.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, type NatsError } from "@jetworker/nats"
import { Effect, Layer } from "effect"
import * as Net from "node:net"
import { connectError, connectNextStep } from "../src/internal/connectSettings.ts"

const secret = "pw-never-printed-7c1e"

/**
 * A loopback listener that hands each connection to `onSocket`; closed, with every socket it
 * accepted, when the scope closes. Yields the server URL with credentials (which must never show).
 */
const fakeServer = (onSocket: (socket: Net.Socket) => void) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly listener: Net.Server; readonly sockets: Array<Net.Socket> }>((resume) => {
      const sockets: Array<Net.Socket> = []
      const listener = Net.createServer((socket) => {
        sockets.push(socket)
        socket.on("error", () => undefined)
        onSocket(socket)
      })
      listener.listen(0, "127.0.0.1", () => resume(Effect.succeed({ listener, sockets })))
    }),
    ({ listener, sockets }) =>
      Effect.sync(() => {
        for (const socket of sockets) socket.destroy()
        listener.close()
      })
  ).pipe(Effect.map(({ listener }) => (listener.address() as Net.AddressInfo).port))

/** The first connection's failure, within a bound (the connect timeout is 1 s). */
const failure = (servers: string) =>
  Effect.flip(
    Layer.build(NatsConnection.layer({ servers, connectTimeout: "1 second", maxReconnectAttempts: 0 }))
  ).pipe(Effect.scoped, Effect.timeout("15 seconds"))

const info = (extra: Record<string, unknown> = {}) =>
  `INFO ${JSON.stringify({ server_id: "FAKE", version: "2.10.0", proto: 1, headers: true, max_payload: 1048576, ...extra })}\r\n`

/** What every such failure says: the server without credentials, and no bare nats.js wording. */
const named = (error: NatsError.NatsError, port: number) => {
  assert.include(error.message, `nats://127.0.0.1:${port}`, error.message)
  assert.notInclude(error.message, secret)
  assert.notInclude(error.message, "node provided an undefined error")
  assert.notInclude(error.message, "unexpected response from server")
}

describe("NatsConnection: a first connection that fails in nats.js's own words", () => {
  it.live("a listener that accepts and closes at once: the server closed the connection before its greeting; retryable (ConnectionRefused)", () =>
    Effect.gen(function*() {
      for (const close of [(socket: Net.Socket) => socket.destroy(), (socket: Net.Socket) => socket.end()]) {
        const port = yield* fakeServer(close)
        const error = yield* failure(`nats://op:${secret}@127.0.0.1:${port}`)
        named(error, port)
        assert.strictEqual(error.reason, "ConnectionRefused")
        assert.isTrue(error.isRetryable)
        assert.include(error.message, `could not connect to nats://127.0.0.1:${port}`)
        assert.include(error.message, "closed the connection before sending NATS's greeting (INFO)")
        assert.include(error.message, "client port (4222 by default)")
        assert.include(error.message, "Set NATS_URL, or the servers option, to where it runs")
      }
    }).pipe(Effect.scoped), 30_000)

  it.live("a listener that accepts and never answers: no NATS handshake within the connect timeout, what else takes a connection silently; retryable (Timeout)", () =>
    Effect.gen(function*() {
      const port = yield* fakeServer(() => undefined)
      const error = yield* failure(`nats://op:${secret}@127.0.0.1:${port}`)
      named(error, port)
      assert.strictEqual(error.reason, "Timeout")
      assert.isTrue(error.isRetryable)
      assert.include(error.message, `could not connect to nats://127.0.0.1:${port}`)
      assert.include(error.message, "did not complete the NATS handshake (its INFO greeting, then a PONG) within the connect timeout")
      assert.include(error.message, "monitoring port (8222)")
      assert.include(error.message, "Set NATS_URL, or the servers option, to where it runs")
    }).pipe(Effect.scoped), 30_000)

  it.live("a listener that sends something other than INFO, or an INFO that is no JSON: not a NATS server, naming the ports to check; final (Unknown)", () =>
    Effect.gen(function*() {
      for (const greeting of ["SSH-2.0-OpenSSH_9.6\r\n", "HTTP/1.1 400 Bad Request\r\n\r\n", "INFO {not json\r\n"]) {
        const port = yield* fakeServer((socket) => void socket.write(greeting))
        const error = yield* failure(`nats://op:${secret}@127.0.0.1:${port}`)
        named(error, port)
        assert.strictEqual(error.reason, "Unknown", greeting)
        assert.isFalse(error.isRetryable)
        assert.include(error.message, `nats://127.0.0.1:${port} answered, but not as a NATS server`, greeting)
        assert.include(error.message, "is a nats-server running there")
        assert.include(error.message, "client port (4222 by default)")
        assert.notInclude(error.message, "Expected property name", "no bare JSON parser message")
      }
    }).pipe(Effect.scoped), 30_000)

  it.live("a listener that resets the connection: said in words with the code; retryable (ConnectionRefused: a start-up waits for it)", () =>
    Effect.gen(function*() {
      const port = yield* fakeServer((socket) => void socket.resetAndDestroy())
      const error = yield* failure(`nats://op:${secret}@127.0.0.1:${port}`)
      named(error, port)
      assert.strictEqual(error.reason, "ConnectionRefused")
      assert.isTrue(error.isRetryable)
      assert.include(error.message, `could not connect to nats://127.0.0.1:${port}`)
      assert.include(error.message, "reset the connection (ECONNRESET)")
      assert.include(error.message, "Set NATS_URL, or the servers option, to where it runs")
      assert.notMatch(error.message, /^connect ECONNRESET/)
    }).pipe(Effect.scoped), 30_000)

  it.live("a server that requires TLS and drops the handshake: the TLS handshake was cut off, what to check; its reason is kept", () =>
    Effect.gen(function*() {
      // The INFO asks for TLS; the first bytes of the client's handshake close the connection.
      const port = yield* fakeServer((socket) => {
        socket.write(info({ tls_required: true }))
        socket.once("data", () => socket.destroy())
      })
      const error = yield* failure(`nats://op:${secret}@127.0.0.1:${port}`)
      named(error, port)
      assert.strictEqual(error.reason, "Unknown")
      assert.include(error.message, `the TLS handshake with nats://127.0.0.1:${port} was cut off`)
      assert.include(error.message, "NATS_TLS_CA")
      assert.notInclude(error.message, "Client network socket disconnected")
    }).pipe(Effect.scoped), 30_000)

  it.live("a host name that does not resolve (.invalid, reserved): the host is named as unresolvable, what to check; its reason is kept", () =>
    Effect.gen(function*() {
      // A host with "tls" in its name is no TLS failure.
      for (const host of ["nats-missing.invalid", "nats-tls.invalid"]) {
        const error = yield* failure(`nats://op:${secret}@${host}:4222`)
        assert.notInclude(error.message, secret)
        assert.strictEqual(error.reason, "Unknown")
        assert.include(error.message, `could not connect to nats://${host}:4222`)
        assert.include(error.message, "cannot resolve the host name")
        assert.include(error.message, "check the host in NATS_URL, or the servers option, and the DNS")
      }
    }).pipe(Effect.scoped), 30_000)

  it("a host that cannot be reached (no route, a dropped SYN): said in words with the code, the server named; retryable (a network still coming up)", () => {
    const options = { servers: "nats://op:pw@10.255.255.1:4222" }
    for (const code of ["EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT"]) {
      const raw = Object.assign(new Error(`connect ${code} 10.255.255.1:4222`), { code })
      const error = connectNextStep(connectError(raw), options)
      assert.strictEqual(error.reason, "ConnectionRefused", code)
      assert.include(error.message, `could not connect to nats://10.255.255.1:4222: it cannot be reached from here (${code})`)
      assert.notInclude(error.message, ":pw@")
    }
  })
})

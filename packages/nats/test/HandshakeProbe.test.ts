/**
 * The probe that asks a server for the `-ERR` nats.js keeps to itself at connect: against real
 * nats-servers (a PONG for a good login, with a password or an NKey signing the server's nonce; the
 * server's words for a refused one or a full server), and against loopback listeners that
 * misbehave (no credentials where nats.js would use TLS, the bound kept).
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsServer } from "@jetworker/testing"
import { createUser } from "@nats-io/nkeys"
import { connect, nkeyAuthenticator } from "@nats-io/transport-node"
import { Duration, Effect } from "effect"
import * as Net from "node:net"
import { refusal } from "../src/internal/handshakeProbe.ts"

const password = "pw-never-printed-93fe"

/**
 * A loopback listener that greets with `info` (and `then`, a line right after it) and records
 * what each client sends; closed with the scope.
 */
const fakeServer = (info: Record<string, unknown> | undefined, then = "") =>
  Effect.acquireRelease(
    Effect.callback<{ readonly listener: Net.Server; readonly sockets: Array<Net.Socket>; readonly received: Array<string> }>((resume) => {
      const sockets: Array<Net.Socket> = []
      const received: Array<string> = []
      const listener = Net.createServer((socket) => {
        sockets.push(socket)
        socket.on("error", () => undefined)
        socket.on("data", (chunk) => void received.push(chunk.toString("utf8")))
        if (info !== undefined) socket.write(`INFO ${JSON.stringify({ server_id: "FAKE", version: "2.10.0", proto: 1, ...info })}\r\n${then}`)
      })
      listener.listen(0, "127.0.0.1", () => resume(Effect.succeed({ listener, sockets, received })))
    }),
    ({ listener, sockets }) =>
      Effect.sync(() => {
        for (const socket of sockets) socket.destroy()
        listener.close()
      })
  ).pipe(Effect.map(({ listener, received }) => ({ port: (listener.address() as Net.AddressInfo).port, received })))

describe("HandshakeProbe.refusal", () => {
  it.live("a good login gets a PONG (nothing to name); a wrong password or none gets the server's Authorization Violation", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config: `authorization { user: op, password: "${password}" }` })
      const servers = [`127.0.0.1:${server.port}`]
      assert.isUndefined(yield* refusal({ servers, user: "op", pass: password }, 2_000))
      const wrong = yield* refusal({ servers, user: "op", pass: "not-it" }, 2_000)
      assert.deepStrictEqual(wrong, { server: servers[0], text: "Authorization Violation" })
      const none = yield* refusal({ servers: [server.url] }, 2_000)
      assert.deepStrictEqual(none, { server: server.url, text: "Authorization Violation" })
    }).pipe(Effect.scoped), 30_000)

  it.live("an NKey login signs the server's nonce as nats.js does: a PONG; an unknown key is refused", () =>
    Effect.gen(function*() {
      const user = createUser()
      const server = yield* NatsServer.make({ config: `authorization { users: [ { nkey: "${user.getPublicKey()}" } ] }` })
      assert.isUndefined(yield* refusal({ servers: [server.url], authenticator: nkeyAuthenticator(user.getSeed()) }, 2_000))
      const stranger = yield* refusal({ servers: [server.url], authenticator: nkeyAuthenticator(createUser().getSeed()) }, 2_000)
      assert.strictEqual(stranger?.text, "Authorization Violation")
    }).pipe(Effect.scoped), 30_000)

  it.live("a server at its connection limit: its words, from whichever of the servers said them", () =>
    Effect.gen(function*() {
      const full = yield* NatsServer.make({ config: "max_connections: 1" })
      const holder = yield* Effect.acquireRelease(
        Effect.promise(() => connect({ servers: full.url, maxReconnectAttempts: 0 })),
        (connection) => Effect.promise(() => connection.close().catch(() => undefined))
      )
      assert.isFalse(holder.isClosed())
      const open = yield* NatsServer.make()
      const answer = yield* refusal({ servers: [open.url, full.url] }, 2_000)
      assert.deepStrictEqual(answer, { server: full.url, text: "maximum connections exceeded" })
    }).pipe(Effect.scoped), 30_000)

  it.live("a server that asks for TLS, or options that do: no credentials sent in the clear, only an -ERR sent before TLS is read", () =>
    Effect.gen(function*() {
      for (const [info, tls] of [[{ tls_required: true }, undefined], [{ tls_available: true }, undefined], [{}, {}]] as const) {
        const fake = yield* fakeServer(info)
        const [elapsed, answer] = yield* Effect.timed(
          refusal({ servers: [`nats://127.0.0.1:${fake.port}`], user: "op", pass: password, ...(tls === undefined ? {} : { tls }) }, 2_000)
        )
        assert.isUndefined(answer)
        assert.deepStrictEqual(fake.received, [], JSON.stringify(info))
        // Listening for an early -ERR is shorter than the bound.
        assert.isBelow(Duration.toMillis(elapsed), 1_500)
      }
      // A server at its connection limit says so right after its INFO, before TLS.
      const full = yield* fakeServer({ tls_required: true }, "-ERR 'maximum connections exceeded'\r\n")
      const answer = yield* refusal({ servers: [`127.0.0.1:${full.port}`], user: "op", pass: password }, 2_000)
      assert.deepStrictEqual(answer, { server: `127.0.0.1:${full.port}`, text: "maximum connections exceeded" })
      assert.deepStrictEqual(full.received, [])
    }).pipe(Effect.scoped), 30_000)

  it.live("without TLS, the CONNECT carries what nats.js would send; a listener that never answers, or is no NATS server, ends within the bound", () =>
    Effect.gen(function*() {
      const fake = yield* fakeServer({})
      const [elapsed, answer] = yield* Effect.timed(refusal({ servers: [`127.0.0.1:${fake.port}`], name: "probe-test", user: "op", pass: password }, 700))
      assert.isUndefined(answer)
      assert.isAtLeast(Duration.toMillis(elapsed), 600)
      assert.isBelow(Duration.toMillis(elapsed), 1_500)
      const sent = fake.received.join("")
      assert.match(sent, /^CONNECT \{.*\}\r\nPING\r\n$/)
      const hello = JSON.parse(sent.slice("CONNECT ".length, sent.indexOf("\r\n")))
      assert.include(hello, { user: "op", pass: password, name: "probe-test", protocol: 1, verbose: false })

      const silent = yield* fakeServer(undefined)
      const [quiet] = yield* Effect.timed(refusal({ servers: [`127.0.0.1:${silent.port}`] }, 500))
      assert.isBelow(Duration.toMillis(quiet), 1_500)
      // Nothing listening: refused at once.
      assert.isUndefined(yield* refusal({ servers: ["127.0.0.1:1"] }, 2_000))
    }).pipe(Effect.scoped), 30_000)
})

/**
 * A `tls://` server URL asks for TLS, as other NATS clients (nats.go, the nats CLI) read it, also
 * without the `tls` option: a server (or anything in between) that offers no TLS is refused before
 * anything is sent to it, and never receives the password the URL carries. nats.js ignores the
 * scheme; since credentials are read from URLs, it would have sent them in a plain-text CONNECT. A
 * loopback fake server that offers no TLS records what the client sends.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import { createServer, type Socket } from "node:net"

const fakeServer = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<{ readonly port: number; readonly received: Array<string>; readonly close: () => void }>((resolve) => {
      const received: Array<string> = []
      const sockets: Array<Socket> = []
      const server = createServer((socket) => {
        sockets.push(socket)
        socket.write(`INFO {"server_id":"FAKE","version":"2.10.0","proto":1,"max_payload":1048576,"headers":true}\r\n`)
        socket.on("data", (data) => {
          const text = data.toString("utf8")
          received.push(text)
          if (text.includes("PING")) socket.write("PONG\r\n")
        })
        socket.on("error", () => undefined)
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        resolve({
          port: typeof address === "object" && address !== null ? address.port : 0,
          received,
          close: () => {
            for (const socket of sockets) socket.destroy()
            server.close()
          }
        })
      })
    })
  ),
  (fake) => Effect.sync(fake.close)
)

describe("NatsConnection: tls:// in a server URL", () => {
  it.live("a server without TLS is refused, saying it offers no TLS, and never receives the URL's password", () =>
    Effect.gen(function*() {
      const fake = yield* fakeServer
      const exit = yield* Layer.build(
        NatsConnection.layer({ servers: `tls://alice:s3cret@127.0.0.1:${fake.port}`, connectTimeout: "2 seconds" })
      ).pipe(Effect.scoped, Effect.timeout("10 seconds"), Effect.exit)
      const sent = fake.received.join("")
      assert.notInclude(
        sent,
        "s3cret",
        `connected: ${Exit.isSuccess(exit)}; the client sent in plain text:\n${sent.slice(0, 400)}`
      )
      assert.isTrue(Exit.isFailure(exit), "connected to a server without TLS")
      const error = Exit.isFailure(exit) ? Cause.findErrorOption(exit.cause) : Option.none()
      assert.isTrue(Option.isSome(error))
      assert.include(String((error as Option.Some<{ readonly message: string }>).value.message), "does not offer TLS")
    }), 30_000)
})

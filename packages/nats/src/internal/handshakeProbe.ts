/**
 * What a server said when it turned a client away during the handshake. nats.js v3 records an
 * `-ERR` other than a refused login (e.g. `maximum connections exceeded`, sent right after the INFO
 * greeting, or `maximum account active connections exceeded`, sent after the login) and keeps
 * waiting for the handshake's PONG, so its first connection only times out. After such a timeout
 * the connection asks again, on a socket of its own: reads the INFO, sends the CONNECT nats.js
 * would (the same name and credentials) and a PING, and reads the answer (a PONG, or the `-ERR`).
 *
 * Bounded by `timeoutMillis`; never fails. Credentials go only where nats.js would have sent them
 * in the clear: to a server whose INFO asks for no TLS, when the connection asks for none either.
 * Otherwise it only listens for an `-ERR` sent before TLS (the server's connection limit).
 */
import type { ConnectionOptions } from "@nats-io/transport-node"
import { Effect } from "effect"
import * as Net from "node:net"

/** A server's `-ERR` during the handshake: the server (as given, without credentials) and its words. */
export interface Refusal {
  readonly server: string
  readonly text: string
}

// A server that expects TLS waits for the client's hello; an -ERR sent before it comes at once.
const LISTEN_MILLIS = 500
// An INFO (with a cluster's URLs) is a few KB; more without a line end is no NATS server.
const MAX_LINE = 64 * 1024

/** `host` and `port` of a server as nats.js reads it: `nats://host:port`, `host:port`, `[::1]:port`; 4222 by default. */
const addressOf = (server: string): { readonly host: string; readonly port: number } | undefined => {
  try {
    const url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(server) ? server : `nats://${server}`)
    const port = url.port === "" ? 4222 : Number(url.port)
    return { host: url.hostname.replace(/^\[(.*)\]$/, "$1"), port }
  } catch {
    return undefined
  }
}

/** The fields of an INFO line the probe reads, or `undefined` when the line is no INFO. */
const infoOf = (
  line: string
): { readonly nonce?: unknown; readonly tls_required?: unknown; readonly tls_available?: unknown } | undefined => {
  if (!line.startsWith("INFO ")) return undefined
  try {
    const info: unknown = JSON.parse(line.slice(5))
    return typeof info === "object" && info !== null ? info : undefined
  } catch {
    return undefined
  }
}

/** The CONNECT fields nats.js sends with these options (its `buildAuthenticator`, and the protocol fields). */
const connectFields = (options: ConnectionOptions, nonce: string | undefined): Record<string, unknown> => {
  const authenticators = typeof options.authenticator === "function"
    ? [options.authenticator]
    : Array.isArray(options.authenticator)
    ? options.authenticator
    : []
  const credentials = Object.assign(
    {},
    ...authenticators.map((authenticate) => authenticate(nonce) ?? {}),
    options.token === undefined ? {} : { auth_token: options.token },
    options.user === undefined ? {} : { user: options.user, pass: options.pass }
  ) as Record<string, unknown>
  return {
    protocol: 1,
    lang: "nats.js",
    verbose: false,
    pedantic: false,
    headers: true,
    no_responders: true,
    ...(options.name === undefined ? {} : { name: options.name }),
    ...credentials
  }
}

/**
 * The `-ERR` text, as one printable line of at most 200 characters without its quotes, and
 * without a secret of `options` should a server echo one.
 */
const cleaned = (line: string, options: ConnectionOptions): string => {
  let text = line.slice(4).trim().replace(/^'(.*)'$/, "$1").replace(/[^\x20-\x7e]/g, "?")
  for (const secret of [options.pass, options.token]) {
    if (typeof secret === "string" && secret !== "") text = text.split(secret).join("***")
  }
  return text.length > 200 ? `${text.slice(0, 200)}…` : text
}

/**
 * Asks `server`; `done` is called once, with the `-ERR` text or `undefined` (a PONG, no NATS
 * server, a closed socket, the bound). The function returned ends it early (without `done`).
 */
const askOne = (
  server: string,
  options: ConnectionOptions,
  timeoutMillis: number,
  done: (text: string | undefined) => void
): () => void => {
  const address = addressOf(server)
  if (address === undefined) {
    done(undefined)
    return () => undefined
  }
  let finished = false
  let buffer = ""
  let greeted = false
  const socket = Net.connect({ host: address.host, port: address.port })
  const finish = (text: string | undefined, report: boolean) => {
    if (finished) return
    finished = true
    clearTimeout(timer)
    socket.destroy()
    if (report) done(text)
  }
  let timer = setTimeout(() => finish(undefined, true), timeoutMillis)
  socket.setNoDelay(true)
  socket.on("error", () => finish(undefined, true))
  socket.on("close", () => finish(undefined, true))
  socket.on("data", (chunk: Buffer) => {
    buffer += chunk.toString("utf8")
    let end = buffer.indexOf("\r\n")
    while (end !== -1 && !finished) {
      const line = buffer.slice(0, end)
      buffer = buffer.slice(end + 2)
      if (line.startsWith("-ERR")) return finish(cleaned(line, options), true)
      if (!greeted) {
        greeted = true
        const info = infoOf(line)
        if (info === undefined) return finish(undefined, true)
        // nats.js turns TLS on when the options ask for it or the server offers it: no credentials in the clear.
        if (options.tls != null || info.tls_required === true || info.tls_available === true) {
          clearTimeout(timer)
          timer = setTimeout(() => finish(undefined, true), Math.min(timeoutMillis, LISTEN_MILLIS))
        } else {
          let hello: string
          try {
            hello = JSON.stringify(connectFields(options, typeof info.nonce === "string" ? info.nonce : undefined))
          } catch {
            // An authenticator that cannot sign (nats.js fails the same way, with its own words).
            return finish(undefined, true)
          }
          socket.write(`CONNECT ${hello}\r\nPING\r\n`)
        }
      } else if (line === "PONG") {
        return finish(undefined, true)
      }
      end = buffer.indexOf("\r\n")
    }
    if (buffer.length > MAX_LINE) finish(undefined, true)
  })
  return () => finish(undefined, false)
}

/**
 * What the first of `options.servers` that turned the client away said (all are asked at once),
 * or `undefined` when none did within `timeoutMillis`.
 */
export const refusal = (options: ConnectionOptions, timeoutMillis: number): Effect.Effect<Refusal | undefined> =>
  Effect.callback<Refusal | undefined>((resume) => {
    const servers = options.servers === undefined ? [] : typeof options.servers === "string" ? [options.servers] : options.servers
    if (servers.length === 0 || !(timeoutMillis > 0)) {
      resume(Effect.succeed(undefined))
      return
    }
    const answers: Array<string | undefined> = servers.map(() => undefined)
    let pending = servers.length
    const cancels = servers.map((server, i) =>
      askOne(server, options, timeoutMillis, (text) => {
        answers[i] = text
        pending--
        if (pending > 0) return
        const first = answers.findIndex((answer) => answer !== undefined)
        resume(Effect.succeed(first === -1 ? undefined : { server: servers[first]!, text: answers[first]! }))
      })
    )
    return Effect.sync(() => cancels.forEach((cancel) => cancel()))
  })

/**
 * A fault-injecting TCP proxy on loopback, for tests that need the network to fail on cue. It
 * listens on 127.0.0.1, forwards every accepted connection to one target, and can `cut` (reset
 * every open connection both ways, then reset new ones until `restore`) or `pause` (keep the
 * sockets open but stop reading them, so bytes wait in the kernel's buffers and the peers'
 * writes block on TCP back-pressure; nothing is buffered here without bound), or
 * `pauseToClient` (the same for the target's side only: requests get through, replies wait). It counts the
 * bytes it forwards and the connections it accepts, for assertions.
 *
 * It deliberately does not shape traffic (latency, bandwidth, partial writes), speak any
 * protocol, or listen anywhere but loopback. While cut it still accepts TCP connections and
 * resets them at once, so a client sees "connection reset" rather than "connection refused",
 * and the port stays owned by the proxy.
 *
 * @since 0.1.0
 */
import { Data, Effect } from "effect"
import type { Scope } from "effect"
import * as Net from "node:net"

/** A host and port. */
export interface Address {
  readonly host: string
  readonly port: number
}

/** How to build a proxy. */
export interface Options {
  /** Where accepted connections are forwarded. Required. */
  readonly target: Address
  /** The port to listen on at 127.0.0.1. Default `0`: an ephemeral port chosen by the system. */
  readonly listenPort?: number
}

/** Counters since the proxy started. */
export interface Stats {
  /** Bytes read from clients and written to the target. */
  readonly bytesToTarget: number
  /** Bytes read from the target and written to clients. */
  readonly bytesToClient: number
  /** Connections accepted and forwarded. */
  readonly accepted: number
  /** Connections accepted while cut, and reset at once. */
  readonly refused: number
}

/** A running proxy; it stops when the scope that made it closes. */
export interface FaultProxy {
  /** The port the proxy listens on at 127.0.0.1. */
  readonly port: number
  /** The proxy's address, for building client URLs (`nats://${host}:${port}`). */
  readonly address: Address
  /** Resets every open connection both ways and resets new ones until {@link FaultProxy.restore}. */
  readonly cut: Effect.Effect<void>
  /** Accepts and forwards new connections again after {@link FaultProxy.cut}. */
  readonly restore: Effect.Effect<void>
  /** Stops reading every socket, open or new, both ways; connections stay open. */
  readonly pause: Effect.Effect<void>
  /**
   * Stops reading what the target sends, open connections and new ones, while what the client
   * sends still gets through: requests reach the server, its replies wait (a reply lost in
   * flight, as the client sees it). `resume` reads again.
   */
  readonly pauseToClient: Effect.Effect<void>
  /** Reads and forwards again after {@link FaultProxy.pause} or {@link FaultProxy.pauseToClient}. */
  readonly resume: Effect.Effect<void>
  /** The number of client connections currently open through the proxy. */
  readonly connections: Effect.Effect<number>
  /** A snapshot of the counters. */
  readonly stats: Effect.Effect<Stats>
}

/** Why a proxy could not start. */
export class FaultProxyError extends Data.TaggedError("FaultProxyError")<{
  /** `InvalidOptions`: a port is out of range. `ListenFailed`: the listening socket could not be opened in time. */
  readonly reason: "InvalidOptions" | "ListenFailed"
  readonly message: string
  readonly cause?: unknown
}> {
  /** Whether trying again may succeed (a busy fixed port may become free). */
  get isRetryable(): boolean {
    return this.reason === "ListenFailed"
  }
}

const listenHost = "127.0.0.1"
const listenTimeout = "5 seconds"
const closeTimeout = "5 seconds"

interface Pair {
  readonly client: Net.Socket
  readonly upstream: Net.Socket
  /** Sockets whose reading stopped because the other side's write buffer is full. */
  readonly blocked: Set<Net.Socket>
}

interface State {
  cut: boolean
  paused: boolean
  /** Only the target's side is not read (see `pauseToClient`). */
  pausedToClient: boolean
  closing: boolean
  readonly pairs: Set<Pair>
  bytesToTarget: number
  bytesToClient: number
  accepted: number
  refused: number
}

/** Closes a socket with a TCP reset, so the peer sees ECONNRESET; a socket still connecting is just destroyed. */
const reset = (socket: Net.Socket): void => {
  if (socket.destroyed) return
  if (socket.connecting) socket.destroy()
  else socket.resetAndDestroy()
}

const isPort = (port: number, min: number): boolean => Number.isInteger(port) && port >= min && port <= 65535

/** Copies `from` to `to`, honouring `to`'s back-pressure and the proxy's pause. */
const forward = (state: State, pair: Pair, from: Net.Socket, to: Net.Socket, count: (n: number) => void): void => {
  from.on("data", (chunk: Buffer) => {
    if (to.destroyed) return
    count(chunk.length)
    if (!to.write(chunk)) {
      pair.blocked.add(from)
      from.pause()
    }
  })
  to.on("drain", () => {
    pair.blocked.delete(from)
    if (!state.paused && !(state.pausedToClient && from === pair.upstream)) from.resume()
  })
  // Half-close travels through: the peer's FIN becomes our FIN on the other side.
  from.on("end", () => to.end())
  // An abnormal close on one side resets the other, so the failure reaches the far peer.
  from.on("close", (hadError: boolean) => {
    state.pairs.delete(pair)
    if (hadError) reset(to)
  })
}

const accept = (state: State, target: Address, client: Net.Socket): void => {
  client.on("error", () => {})
  if (state.cut || state.closing) {
    state.refused += 1
    reset(client)
    return
  }
  state.accepted += 1
  const upstream = Net.connect({ host: target.host, port: target.port, allowHalfOpen: true })
  upstream.on("error", () => {})
  const pair: Pair = { client, upstream, blocked: new Set() }
  state.pairs.add(pair)
  forward(state, pair, client, upstream, (n) => {
    state.bytesToTarget += n
  })
  forward(state, pair, upstream, client, (n) => {
    state.bytesToClient += n
  })
  if (state.paused) {
    client.pause()
    upstream.pause()
  } else if (state.pausedToClient) {
    upstream.pause()
  }
}

const listen = (server: Net.Server, port: number): Effect.Effect<number, FaultProxyError> =>
  Effect.callback<number, FaultProxyError>((resume) => {
    const onError = (cause: Error) =>
      resume(Effect.fail(
        new FaultProxyError({ reason: "ListenFailed", message: `cannot listen on ${listenHost}:${port}: ${cause.message}`, cause })
      ))
    server.once("error", onError)
    server.listen(port, listenHost, () => {
      server.off("error", onError)
      const address = server.address()
      if (address !== null && typeof address === "object") resume(Effect.succeed(address.port))
      else resume(Effect.fail(new FaultProxyError({ reason: "ListenFailed", message: "the server reported no TCP address" })))
    })
    return Effect.sync(() => server.off("error", onError))
  }).pipe(
    Effect.timeoutOrElse({
      duration: listenTimeout,
      orElse: () =>
        Effect.fail(
          new FaultProxyError({ reason: "ListenFailed", message: `listening on ${listenHost}:${port} took over ${listenTimeout}` })
        )
    })
  )

const shutdown = (state: State, server: Net.Server): Effect.Effect<void> =>
  Effect.sync(() => {
    state.closing = true
    for (const pair of state.pairs) {
      reset(pair.client)
      reset(pair.upstream)
    }
    state.pairs.clear()
  }).pipe(
    Effect.andThen(Effect.callback<void>((resume) => {
      // The callback runs (with ERR_SERVER_NOT_RUNNING) even when the server never listened.
      server.close(() => resume(Effect.void))
    })),
    Effect.timeoutOption(closeTimeout),
    Effect.asVoid
  )

/** Starts a proxy on 127.0.0.1 forwarding to `options.target`; closing the scope stops it and closes every socket. */
export const make: (options: Options) => Effect.Effect<FaultProxy, FaultProxyError, Scope.Scope> = Effect.fn(
  "FaultProxy.make"
)(function*(options: Options) {
  const listenPort = options.listenPort ?? 0
  if (!isPort(listenPort, 0)) {
    return yield* new FaultProxyError({ reason: "InvalidOptions", message: `listenPort ${listenPort} is not a port` })
  }
  if (!isPort(options.target.port, 1)) {
    return yield* new FaultProxyError({ reason: "InvalidOptions", message: `target port ${options.target.port} is not a port` })
  }
  const target: Address = { host: options.target.host, port: options.target.port }
  const state: State = {
    cut: false,
    paused: false,
    pausedToClient: false,
    closing: false,
    pairs: new Set(),
    bytesToTarget: 0,
    bytesToClient: 0,
    accepted: 0,
    refused: 0
  }
  const server = Net.createServer({ allowHalfOpen: true }, (client) => accept(state, target, client))
  yield* Effect.addFinalizer(() => shutdown(state, server))
  const port = yield* listen(server, listenPort)

  const setReading = (reading: "both" | "toTarget" | "none") =>
    Effect.sync(() => {
      state.paused = reading === "none"
      state.pausedToClient = reading === "toTarget"
      for (const pair of state.pairs) {
        for (const socket of [pair.client, pair.upstream]) {
          const read = reading === "both" || (reading === "toTarget" && socket === pair.client)
          if (!read) socket.pause()
          else if (!pair.blocked.has(socket)) socket.resume()
        }
      }
    })

  return {
    port,
    address: { host: listenHost, port },
    cut: Effect.sync(() => {
      state.cut = true
      for (const pair of state.pairs) {
        reset(pair.client)
        reset(pair.upstream)
      }
      state.pairs.clear()
    }),
    restore: Effect.sync(() => {
      state.cut = false
    }),
    pause: setReading("none"),
    pauseToClient: setReading("toTarget"),
    resume: setReading("both"),
    connections: Effect.sync(() => state.pairs.size),
    stats: Effect.sync((): Stats => ({
      bytesToTarget: state.bytesToTarget,
      bytesToClient: state.bytesToClient,
      accepted: state.accepted,
      refused: state.refused
    }))
  }
})

/**
 * A TCP proxy on loopback that holds every chunk for a fixed delay in each direction, keeping their
 * order: a database "across a network" for the benchmarks, where a round trip costs time rather
 * than CPU. Node's timers make the least delay about a millisecond.
 */
import net from "node:net"

/** A running proxy: where to connect, and how to stop it. */
export interface DelayProxy {
  readonly port: number
  readonly close: () => Promise<void>
}

/** Starts a proxy to `target` that delays each chunk by `delayMillis` each way. */
export const start = (target: { readonly host: string; readonly port: number }, delayMillis: number): Promise<DelayProxy> => {
  const sockets = new Set<net.Socket>()
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: target.host, port: target.port, noDelay: true })
    client.setNoDelay(true)
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on("close", () => sockets.delete(socket))
    }
    const forward = (from: net.Socket, to: net.Socket) =>
      from.on("data", (chunk) => setTimeout(() => to.destroyed || to.write(chunk), delayMillis))
    forward(client, upstream)
    forward(upstream, client)
    const end = () => {
      client.destroy()
      upstream.destroy()
    }
    client.on("error", end).on("close", end)
    upstream.on("error", end).on("close", end)
  })
  return new Promise((resolve, reject) => {
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address() as net.AddressInfo
      resolve({
        port: address.port,
        close: () =>
          new Promise((done) => {
            for (const socket of sockets) socket.destroy()
            server.close(() => done())
          })
      })
    })
  })
}

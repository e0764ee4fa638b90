/**
 * Counts this process's socket writes to PostgreSQL and to NATS, and the time spent inside them
 * (wall time: on this machine's guest a write can be descheduled, so it is not CPU time). On
 * loopback a write is a system call that also runs the receiving side's TCP path and wakes the
 * server, so its cost is much of a consumer's CPU per message, and the number of writes is the
 * number of round trips each message pays (every statement is one write to PostgreSQL, whoever
 * sends it). It wraps `net.Socket`'s internal `_writeGeneric`, through which Node sends every
 * `write` and `writev` of a socket at once (or queues it until the socket connects); where a
 * Node version has no such method, nothing is counted and {@link install} returns false.
 */
import net from "node:net"

/** Writes per server, and the time spent in all of them, since the process started counting. */
export interface Writes {
  readonly postgres: number
  readonly nats: number
  readonly micros: number
}

type WriteGeneric = (this: net.Socket, ...args: Array<unknown>) => unknown

const counts = { postgres: 0, nats: 0, micros: 0 }
let installed = false

/** Starts counting the writes to the servers at `postgresUrl` and `natsUrl` (their ports). */
export const install = (postgresUrl: string, natsUrl: string): boolean => {
  if (installed) return true
  const portOf = (url: string, fallback: number) => {
    const port = new URL(url.split(",")[0]!).port
    return port === "" ? fallback : Number(port)
  }
  const postgresPort = portOf(postgresUrl, 5432)
  const natsPort = portOf(natsUrl, 4222)
  const original: unknown = Reflect.get(net.Socket.prototype, "_writeGeneric")
  if (typeof original !== "function") return false
  const writeGeneric = original as WriteGeneric
  const counted: WriteGeneric = function(this: net.Socket, ...args) {
    const port = this.remotePort
    if (port === postgresPort) counts.postgres++
    else if (port === natsPort) counts.nats++
    else return writeGeneric.apply(this, args)
    const start = performance.now()
    try {
      return writeGeneric.apply(this, args)
    } finally {
      counts.micros += (performance.now() - start) * 1000
    }
  }
  Reflect.set(net.Socket.prototype, "_writeGeneric", counted)
  installed = true
  return true
}

/** The counts so far (all zero before {@link install}). */
export const read = (): Writes => ({ ...counts })

/** What was written between `before` and `after`. */
export const between = (before: Writes, after: Writes): Writes => ({
  postgres: after.postgres - before.postgres,
  nats: after.nats - before.nats,
  micros: after.micros - before.micros
})

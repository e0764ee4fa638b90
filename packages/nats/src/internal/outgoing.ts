/**
 * Publishes held until the end of the event loop's poll phase, or until a few of them wait.
 * nats.js writes what was published in one macrotask in one socket write (it flushes in a
 * microtask). A consumer whose handlers wait on a database settles each delivery in the
 * macrotask that read its last reply, one per socket read, so each ack would be a write of its
 * own. Held until `setImmediate`, which runs once the poll phase has handled every socket that was
 * ready, the acks and pulls sent in answer to all of them leave together: on the idempotent path
 * 0.4 writes to NATS per message instead of 1.2 (docs/performance-log.md).
 *
 * Held too long, they idle the server: a consumer whose handlers do not wait settles a whole
 * socket read's worth of deliveries in one macrotask, and the server, which runs on another core,
 * had nothing to do until the last of them was handled, then this process nothing until the
 * server answered (on the no-op path the rate went from 0.6 to 0.8 of the hand-written loop's,
 * whose acks leave one by one). So once `eager` publishes wait, they are written at once, and the
 * server works on them while this process handles the rest. `together` keeps what one caller
 * sends at once (a batch's acks) in one write. Order is kept: the publishes leave in the order
 * they were queued. Internal to the adapter.
 */
import type { NatsConnection as Connection } from "@nats-io/transport-node"

/** Publishes on one connection that leave together at the end of the poll phase, or a few at a time. */
export interface Outgoing {
  /**
   * Queues a publish; `failed` is called once if nats.js refuses it (a closed connection): when the
   * queue is sent, at the end of the poll phase or at once when a publish fills it to `eager`.
   */
  readonly publish: (subject: string, payload: Uint8Array, reply: string, failed: (error: unknown) => void) => void
  /**
   * Runs `f`, whose publishes are not sent early: they leave together, at once if `eager` or more
   * wait when `f` returns, else with the rest at the end of the poll phase.
   */
  readonly together: <A>(f: () => A) => A
  /** Sends what is queued now (before the connection drains, so that a drain includes it). */
  readonly flush: () => void
}

interface Queued {
  readonly subject: string
  readonly payload: Uint8Array
  readonly reply: string
  readonly failed: (error: unknown) => void
}

/**
 * How many publishes wait before they are written at once (measured on the no-op path at
 * concurrency 16: 2 and 4 wrote too often, 16 was rarely reached; docs/performance-log.md).
 */
export const defaultEager = 8

/**
 * nats.js's own write of what it buffered, which it otherwise does in a microtask: not before the
 * socket read being handled is done. Not part of its typed API, so looked up, and without it the
 * publishes still leave, in that microtask.
 */
const writerOf = (connection: Connection): (() => void) | undefined => {
  const protocol = (connection as { readonly protocol?: { readonly flushPending?: unknown } }).protocol
  const flushPending = protocol?.flushPending
  return typeof flushPending === "function" ? () => flushPending.call(protocol) : undefined
}

/**
 * The outgoing publishes of `connection`. At most `eager` wait outside `together` (a `together`
 * holds what its caller sends at once, bounded by the caller: a batch's size).
 */
export const make = (connection: Connection, eager = defaultEager): Outgoing => {
  let queued: Array<Queued> = []
  let holding = 0
  // One immediate per turn, however often the queue was sent early meanwhile.
  let scheduled = false
  const write = writerOf(connection)

  const flush = () => {
    const batch = queued
    queued = []
    for (const item of batch) {
      try {
        connection.publish(item.subject, item.payload, { reply: item.reply })
      } catch (error) {
        item.failed(error)
      }
    }
  }

  const atPollEnd = () => {
    scheduled = false
    flush()
  }

  // Outside `together`, `eager` waiting publishes are written at once.
  const sendIfEager = () => {
    if (holding === 0 && queued.length >= eager) {
      flush()
      write?.()
    }
  }

  const publish: Outgoing["publish"] = (subject, payload, reply, failed) => {
    if (!scheduled) {
      scheduled = true
      setImmediate(atPollEnd)
    }
    queued.push({ subject, payload, reply, failed })
    sendIfEager()
  }

  const together = <A>(f: () => A): A => {
    holding++
    try {
      return f()
    } finally {
      holding--
      sendIfEager()
    }
  }

  return { publish, together, flush }
}

/**
 * Publishes held until the end of the event loop's poll phase. nats.js writes what was published
 * in one macrotask in one socket write (it flushes in a microtask). A consumer whose handlers
 * wait on a database settles each delivery in the macrotask that read its last reply, one per
 * socket read, so each ack would be a write of its own. Held until `setImmediate`, which runs once
 * the poll phase has handled every socket that was ready, the acks and pulls sent in answer to all
 * of them leave in one write: on the idempotent path 0.4 writes to NATS per message instead of
 * 1.2 (docs/performance-log.md). Order is kept: the publishes leave in the order they were queued.
 * Internal to the adapter.
 */
import type { NatsConnection as Connection } from "@nats-io/transport-node"

/** Publishes on one connection that leave together at the end of the poll phase. */
export interface Outgoing {
  /**
   * Queues a publish; `failed` is called once if nats.js refuses it (a closed connection): when the
   * queue is sent, at the end of the poll phase or at once when a publish fills it to its limit.
   */
  readonly publish: (subject: string, payload: Uint8Array, reply: string, failed: (error: unknown) => void) => void
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
 * The outgoing publishes of `connection`. At most `limit` wait: the one past it sends them all at
 * once (the queue only holds what one turn of the event loop sent, bounded by the consumers'
 * concurrency and prefetch, so the limit is a backstop).
 */
export const make = (connection: Connection, limit = 1024): Outgoing => {
  let queued: Array<Queued> = []

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

  const publish: Outgoing["publish"] = (subject, payload, reply, failed) => {
    if (queued.length === 0) setImmediate(flush)
    queued.push({ subject, payload, reply, failed })
    // The immediate still runs, and finds nothing left to send.
    if (queued.length >= limit) flush()
  }

  return { publish, flush }
}

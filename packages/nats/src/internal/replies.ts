/**
 * Request/reply for the broker's confirmations (ack, nak, term, working) at the cost of a
 * publish. nats.js's `request` builds a promise, a timer and, once the reply has arrived, an
 * `Error` (its request is "cancelled" after it resolves) for every call: on the per-message path
 * that was a tenth of a consumer's CPU. Here one wildcard subscription per connection receives
 * every reply, a counter names each request, and requests with the same timeout share one timer,
 * because they expire in the order they were sent. The requests leave through `Outgoing`, with
 * the other requests and pulls of the same turn of the event loop. Behaves as nats.js's request
 * does: a reply confirms, a 503 status means no responders, no reply within the bound is a
 * timeout (also across a reconnect), a closed connection fails what is pending, and a publish the
 * server refuses for lack of permission fails the requests pending on its subject at once with
 * `NotAuthorized` (the server says it only on the connection, as an `-ERR`, never as a reply), as
 * does a refused reply subscription for everything pending. Internal to the adapter.
 */
import { createInbox, type Msg, type NatsConnection as Connection, type Subscription } from "@nats-io/transport-node"
import { Effect } from "effect"
import type { Shape } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"
import * as Outgoing from "./outgoing.ts"
import { refusalOf } from "./permissionRefusal.ts"

/** Confirmed requests on one connection: `NatsConnection`'s `request` and `send`. */
export interface Replies {
  readonly request: Shape["request"]
  readonly send: Shape["send"]
}

interface Pending {
  readonly token: number
  readonly operation: string
  /** Where it was published: a permission refusal names only the subject. */
  readonly subject: string
  readonly deadline: number
  /** Dropped once settled: the entry may wait in its expiry queue until the timer passes it. */
  done: ((result: Msg | NatsError.NatsError) => void) | undefined
  settled: boolean
}

/** The requests of one timeout, oldest first: their deadlines are in the same order. */
interface Expiries {
  readonly timeoutMillis: number
  entries: Array<Pending>
  head: number
  timer: ReturnType<typeof setTimeout> | undefined
}

const noop = (): void => undefined

const timedOut = (operation: string, timeoutMillis: number) =>
  new NatsError.NatsError({ reason: "Timeout", operation, message: `no reply within ${timeoutMillis} ms` })

/** The replies of `connection`, to `<inboxPrefix>.<unique>.*`; its subscription is opened by the first request. */
export const make = (
  connection: Connection,
  outgoing: Outgoing.Outgoing = Outgoing.make(connection),
  inboxPrefix?: string
): Replies => {
  const prefix = `${createInbox(inboxPrefix)}.`
  // Keyed by each request's number, in an object rather than a `Map`: a long-lived `Map` that
  // adds and deletes an entry per message keeps the deleted entries alive through scavenges until
  // the next full collection (see core's internal `liveSet`). An object's integer keys hold nothing
  // once deleted.
  const pending: Record<number, Pending> = {}
  const expiries = new Map<number, Expiries>()
  let subscription: Subscription | undefined
  let next = 0

  const settle = (entry: Pending, result: Msg | NatsError.NatsError) => {
    entry.settled = true
    delete pending[entry.token]
    const done = entry.done
    entry.done = undefined
    done?.(result)
  }

  const notAuthorized = (entry: Pending, message: string) =>
    settle(entry, new NatsError.NatsError({ reason: "NotAuthorized", operation: entry.operation, message }))

  const onReply = (error: Error | null, msg: Msg) => {
    if (error !== null) {
      // The reply subscription refused (no permission to subscribe to the inbox): no reply can
      // come to anything pending. nats.js closes it; the next request subscribes again.
      const refusal = refusalOf(error)
      if (refusal !== undefined) for (const key in pending) notAuthorized(pending[key]!, refusal.message)
      return
    }
    const token = parseInt(msg.subject.slice(prefix.length), 36)
    const entry = pending[token]
    if (entry === undefined) return // late (timed out or interrupted)
    if (msg.data.length === 0 && msg.headers?.code === 503) {
      settle(entry, new NatsError.NatsError({ reason: "NoResponders", operation: entry.operation, message: "no responders" }))
    } else {
      settle(entry, msg)
    }
  }

  // A refused publish is said only on the connection (its `error` status), naming the subject:
  // the requests pending there fail now instead of at their bound. Rare, so found by a scan.
  let watching = false
  const watchRefusals = () => {
    watching = true
    const statuses = connection.status()
    void (async () => {
      for await (const status of statuses) {
        if (status.type !== "error") continue
        const refusal = refusalOf(status.error)
        if (refusal === undefined || refusal.operation !== "publish") continue
        for (const key in pending) {
          const entry = pending[key]!
          if (entry.subject === refusal.subject) notAuthorized(entry, refusal.message)
        }
      }
    })().catch(noop)
  }

  const subscribe = (): Subscription => {
    if (!watching) watchRefusals()
    if (subscription === undefined || subscription.isClosed()) {
      subscription = connection.subscribe(`${prefix}*`, { callback: onReply })
      void connection.closed().then(() => {
        const error = new NatsError.NatsError({ reason: "ConnectionClosed", operation: "request", message: "connection closed" })
        for (const entry of Object.values(pending)) settle(entry, new NatsError.NatsError({ ...error, operation: entry.operation }))
      })
    }
    return subscription
  }

  // Forgets the entries before `head`: all of them once none is left, or by copying the rest
  // once the forgotten ones are most of the array.
  const forgetBefore = (queue: Expiries, head: number) => {
    if (head === queue.entries.length) {
      queue.entries = []
      queue.head = 0
    } else if (head >= 1024 && head * 2 >= queue.entries.length) {
      queue.entries = queue.entries.slice(head)
      queue.head = 0
    } else {
      queue.head = head
    }
  }

  // Replies mostly come in the order of the requests, so the settled ones are dropped from the
  // front as new ones arrive: the queue holds about what is in flight, not every request of the
  // last `timeoutMillis` (at 10k acks/s and a 5 s bound that was 50k entries kept alive, a
  // quarter of a consumer's heap).
  const dropSettled = (queue: Expiries) => {
    const entries = queue.entries
    let head = queue.head
    while (head < entries.length && entries[head]!.settled) head++
    forgetBefore(queue, head)
  }

  // Fires at the oldest live deadline of one timeout; what has settled meanwhile is skipped.
  const arm = (queue: Expiries) => {
    const now = performance.now()
    const entries = queue.entries
    let head = queue.head
    while (head < entries.length) {
      const entry = entries[head]!
      if (!entry.settled) {
        if (entry.deadline > now) break
        settle(entry, timedOut(entry.operation, queue.timeoutMillis))
      }
      head++
    }
    forgetBefore(queue, head)
    if (queue.entries.length === 0) {
      queue.timer = undefined
      return
    }
    queue.timer = setTimeout(() => arm(queue), queue.entries[queue.head]!.deadline - now)
  }

  const send: Replies["send"] = (operation, subject, payload, timeoutMillis, done) => {
    if (connection.isClosed()) {
      done(new NatsError.NatsError({ reason: "ConnectionClosed", operation, message: "connection closed" }))
      return noop
    }
    // Below 2^31, where integer keys stay array indices; wrapped long after any reply is due.
    const token = next
    next = next === 0x7fffffff ? 0 : next + 1
    // Deadlines on the monotonic clock: a wall clock stepped back (NTP, a resumed VM) would stretch them.
    const entry: Pending = { token, operation, subject, deadline: performance.now() + timeoutMillis, done, settled: false }
    try {
      subscribe()
      pending[token] = entry
      outgoing.publish(subject, payload, prefix + token.toString(36), (error) => {
        if (!entry.settled) settle(entry, NatsError.fromUnknown(operation, error))
      })
    } catch (error) {
      delete pending[token]
      entry.settled = true
      entry.done = undefined
      done(NatsError.fromUnknown(operation, error))
      return noop
    }
    let queue = expiries.get(timeoutMillis)
    if (queue === undefined) {
      queue = { timeoutMillis, entries: [], head: 0, timer: undefined }
      expiries.set(timeoutMillis, queue)
    }
    dropSettled(queue)
    queue.entries.push(entry)
    if (queue.timer === undefined) arm(queue)
    // Withdrawn: the reply, if it comes, is dropped.
    return () => {
      if (!entry.settled) {
        entry.settled = true
        entry.done = undefined
        delete pending[token]
      }
    }
  }

  const request: Replies["request"] = (operation, subject, payload, timeoutMillis) =>
    Effect.callback<Msg, NatsError.NatsError>((resume) => {
      const withdraw = send(operation, subject, payload, timeoutMillis, (result) =>
        resume(result instanceof NatsError.NatsError ? Effect.fail(result) : Effect.succeed(result)))
      // Interrupted: the reply, if it comes, is dropped.
      return Effect.sync(withdraw)
    })

  return { request, send }
}

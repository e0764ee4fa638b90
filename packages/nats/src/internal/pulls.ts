/**
 * The intake's pulls: requests to the consumer's next-message API whose replies come to one
 * inbox subscription, open while the intake is. A pull costs one publish, not the subscription,
 * iterator, timers and promises of a nats.js `fetch` (which also kept each message alive long
 * enough to reach the old generation, doubling the heap's peak). Each pull has a reply subject of
 * its own, so the server's status for it (408 expired, 409 ...) says which pull ended and how many
 * of its messages it did not send (`Nats-Pending-Messages`).
 *
 * The count bounds what the server has handed out: what has arrived and waits for `take`
 * (`buffered`) plus what open pulls still ask for (`requested`) never exceeds `prefetch`; a pull
 * asks for the free room, once that is at least a quarter of `prefetch`. (nats.js's `consume()`
 * does not bound it: after two missed idle heartbeats, which is any pause of the handlers longer
 * than `pullExpires` while its buffer is full, it re-pulls a whole `max_messages` on top of what
 * it holds, and again at every heartbeat interval, so a slow consumer is handed out many times
 * `prefetch`.)
 */
import { Source } from "@jetworker/core"
import { createInbox, type Msg, type Subscription } from "@nats-io/transport-node"
import { parse } from "./delivery.ts"
import { fail, type IntakeEnv, type IntakeState, signal } from "./intakeState.ts"
import { terminal } from "./sourceErrors.ts"

const encoder = new TextEncoder()

/** Within `millis`, failed or not: a step of the checks and of `close`, never a hang. */
export const boundedPromise = (millis: number, f: () => Promise<unknown>): Promise<void> =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, millis)
    f().then(() => undefined, () => undefined).then(() => {
      clearTimeout(timer)
      resolve()
    })
  })

/** The pulls of one intake, and what its watchers and `close` do to them. */
export interface Pulls {
  /** Where the pulls are published: the consumer's next-message API. */
  readonly subject: string
  /** Pulls the free room, when it is worth a pull and the intake is neither pausing nor ended. */
  readonly pump: () => void
  /** Pulls again after a growing pause, once the consumer answers (a failure ends the intake). */
  readonly pause: () => void
  /** Writes off the open pulls: their inbox is retired, the next pulls go to a new one. */
  readonly writeOff: () => void
  /** Stops a pause's timer (`close`: nothing is pulled again). */
  readonly cancelPause: () => void
  /** Unsubscribes the inbox and the retired ones (`close`, once what was sent is read). */
  readonly unsubscribe: () => void
}

/** The pull loop over `state`, its inbox subscribed. */
export const makePulls = (env: IntakeEnv, state: IntakeState): Pulls => {
  const { connection, name, prefetch, expiresMillis, heartbeatMillis } = env
  const minPull = Math.max(1, Math.ceil(prefetch / 4))
  const pullSubject = `$JS.API.CONSUMER.MSG.NEXT.${env.stream}.${env.durable}`
  let inbox = `${createInbox(connection.inboxPrefix)}.`
  let nextPull = 0
  let pauseTimer: ReturnType<typeof setTimeout> | undefined
  // Messages of written-off pulls left to their ack wait for want of room, not yet reported.
  let leftToAckWait = 0
  // Inboxes of pulls written off (after a silence or a reconnect), still subscribed until the
  // server has dropped those pulls (see `writeOff` and `pause`).
  const retired: Array<Subscription> = []

  const failOrPause = (error: unknown) => {
    const ended = terminal(name, error)
    if (ended === undefined) pause()
    else fail(state, ended)
  }

  // Pulls written off may still be open on the server (a link that froze without breaking, a
  // pull that outlived a reconnect): what they bring first is read (a round trip), then their
  // inbox is unsubscribed, and the consumer info that follows makes the server drop requests
  // whose inbox has no interest, before the room is pulled again.
  const dropRetired = (): Promise<void> => {
    if (retired.length === 0) return Promise.resolve()
    return boundedPromise(env.settleTimeoutMillis, () => connection.connection.flush()).then(() => {
      for (const old of retired.splice(0)) if (!old.isClosed()) old.unsubscribe()
      if (leftToAckWait > 0) {
        env.logWarning(`${name}: ${leftToAckWait} messages of written-off pulls arrived with the buffer full; they are redelivered after their ack wait`)
        leftToAckWait = 0
      }
      return boundedPromise(env.settleTimeoutMillis, () => connection.connection.flush())
    })
  }

  const pause = () => {
    if (state.pausing || state.closed || state.failure !== undefined) return
    state.pausing = true
    state.pauseMillis = Math.min(5_000, state.pauseMillis === 0 ? 100 : state.pauseMillis * 2)
    pauseTimer = setTimeout(() => {
      pauseTimer = undefined
      // Like nats.js after missed heartbeats: pull again only while the consumer exists.
      void dropRetired().then(() => connection.manager.consumers.info(env.stream, env.durable)).then(
        () => {
          state.pausing = false
          if (state.closed) return
          // The consumer exists; a stall ends once a pull of it is answered (`onInbox`), or at
          // once when there is nothing to pull (the buffer holds what can be taken).
          pump()
          if (state.requested === 0 && state.buffered.length > 0) resumed()
        },
        (error: unknown) => {
          state.pausing = false
          failOrPause(error)
        }
      )
    }, state.pauseMillis)
  }

  const pump = () => {
    if (state.closed || state.pausing || state.failure !== undefined) return
    const room = prefetch - state.buffered.length - state.requested
    if (room >= minPull) pull(room)
  }

  const pull = (batch: number) => {
    const id = (nextPull++).toString(36)
    const now = performance.now()
    state.requested += batch
    const thisPull = { id, batch, sentAt: now, received: 0 }
    state.waiting.push(thisPull)
    state.lastHeard = now
    // It leaves with the acks sent in the same turn of the event loop (`publishSoon`).
    connection.publishSoon(
      pullSubject,
      encoder.encode(`{"batch":${batch},"expires":${Math.round(expiresMillis * 1_000_000)},"idle_heartbeat":${heartbeatMillis * 1_000_000}}`),
      inbox + id,
      (error) => {
        // Never sent, so never answered: nothing of it is on its way.
        state.requested -= batch
        const at = state.waiting.indexOf(thisPull)
        if (at >= 0) state.waiting.splice(at, 1)
        failOrPause(error)
      }
    )
  }

  // A status for one pull: it ended (expired, refused, or the server gave up on it).
  const onStatus = (msg: Msg) => {
    const code = msg.headers?.code ?? 0
    if (code === 100) return // an idle heartbeat: the pull is still open
    const at = state.waiting.findIndex((p) => inbox + p.id === msg.subject)
    const ended = at >= 0 ? state.waiting.splice(at, 1)[0] : undefined
    const unsent = Number(msg.headers?.get("Nats-Pending-Messages") || NaN)
    state.requested = Math.max(
      0,
      state.requested - (Number.isSafeInteger(unsent) ? unsent : ended === undefined ? 0 : ended.batch - ended.received)
    )
    if (state.closed) return
    const text = `${code} ${msg.headers?.description ?? ""}`.trim()
    if (code === 408 || code === 404) {
      // Ended early with nothing (not by its expiry): do not spin on it.
      if (ended !== undefined && ended.received === 0 && performance.now() - ended.sentAt < expiresMillis / 2) pause()
      else pump()
      return
    }
    const fatal = terminal(name, new Error(text))
    if (fatal !== undefined) return fail(state, fatal)
    // No responders (JetStream or the consumer unavailable), a leader change, a full
    // waiting queue: pull again after a pause, once the consumer answers.
    pause()
  }

  /** Ends a stall (`intake.resumed`, readiness `Healthy`), if one was reported. */
  const resumed = () => {
    if (state.stalledSince === undefined) return
    const stalledMs = Math.round(performance.now() - state.stalledSince)
    state.stalledSince = undefined
    env.logEvent("Info", "intake.resumed", `${name}: the server answers the pulls again after ${stalledMs} ms stalled`, { stalledMs })
    env.reportHealth({ _tag: "Healthy" })
  }

  // Each message is buffered as it is read from the socket, in the server's order.
  const onInbox = (error: Error | null, msg: Msg) => {
    if (error !== null) return failOrPause(error)
    state.lastHeard = performance.now()
    // Anything on the pulls' inbox (a message, a heartbeat, a status) is the server answering them.
    if (state.stalledSince !== undefined && !state.closed) resumed()
    const pulled = parse(msg, env.receivedNow())
    if (pulled === undefined) return onStatus(msg)
    // A pull re-sent after a reconnect may bring more than was counted.
    if (state.requested > 0) state.requested--
    const oldest = state.waiting[0]
    if (oldest !== undefined && ++oldest.received >= oldest.batch) state.waiting.shift()
    state.pauseMillis = 0
    state.buffered.push(pulled)
    signal(state)
  }

  // A message for a pull written off (its inbox retired): kept while the buffer has room
  // beside what the open pulls will bring, else left to its ack wait (redelivered then), so the
  // intake never holds more than `prefetch`. A retired pull's statuses say nothing now.
  const onRetired = (error: Error | null, msg: Msg) => {
    if (error !== null || state.closed) return
    const pulled = parse(msg, env.receivedNow())
    if (pulled === undefined) return
    if (state.buffered.length + state.requested < prefetch) {
      state.buffered.push(pulled)
      signal(state)
    } else leftToAckWait++
  }

  const listen = (): Subscription => {
    const listening: Subscription = connection.connection.subscribe(`${inbox}*`, {
      callback: (error, msg) => (listening === subscription ? onInbox(error, msg) : onRetired(error, msg))
    })
    void listening.closed.then(() => {
      if (!state.closed && listening === subscription) {
        fail(state, new Source.SourceError({ reason: "ConnectionClosed", message: `${name}: the NATS connection closed` }))
      }
    })
    return listening
  }
  let subscription = listen()

  // The server may still hold the open pulls, so their inbox is retired, and the next pulls go
  // to a new one once the old is dropped (`pause`): the room is not pulled twice, and what is
  // counted is what was sent since.
  const writeOff = () => {
    state.requested = 0
    state.waiting.length = 0
    retired.push(subscription)
    inbox = `${createInbox(connection.inboxPrefix)}.`
    subscription = listen()
  }

  const cancelPause = () => {
    if (pauseTimer !== undefined) clearTimeout(pauseTimer)
  }

  const unsubscribe = () => {
    for (const open of [subscription, ...retired.splice(0)]) if (!open.isClosed()) open.unsubscribe()
  }

  return { subject: pullSubject, pump, pause, writeOff, cancelPause, unsubscribe }
}

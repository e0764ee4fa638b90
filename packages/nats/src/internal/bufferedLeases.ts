/**
 * The leases of the messages an intake buffers, kept while the engine takes none of them
 * (`Intake.holdBuffered`: while it is paused on a dependency). A buffered message is delivered as
 * far as the server knows, so its ack wait runs in the buffer: a pause longer than it would hand
 * the message to the broker for redelivery while this intake still holds it, and both deliveries
 * would run. They are kept as the engine's lease keeper keeps a running delivery's: an extension
 * (`+WPI`, confirmed) once a message has waited a third of its lease since it was last known held,
 * sent again at once if unanswered in that time, and none once 90% of it has passed
 * (`Lease.timing`), since the server confirms an old owner's extension too and a confirmation
 * then proves nothing. When the engine takes again, each message kept so far gets
 * one last extension, so it does not start with part of its lease spent. A confirmed extension
 * moves the message's `receivedAt` to when it was sent: the engine's lease counts from there once
 * it takes the message (and the engine extends at once a lease a third spent when taken).
 */
import { timing } from "@jetworker/core/Lease"
import type * as NatsError from "../NatsError.ts"
import { type Pulled, sendExtend } from "./delivery.ts"
import type { IntakeEnv, IntakeState } from "./intakeState.ts"

/**
 * Keeping the buffered messages' leases: `hold` for a while, or 0 once the engine takes again (each
 * buffered message held until then gets one last extension); `stop` for good (the intake closes).
 */
export interface BufferedLeases {
  readonly hold: (forMillis: number) => void
  readonly stop: () => void
}

/**
 * The keeper of `state`'s buffered messages, whose lease (the consumer's ack wait) is `leaseMillis`;
 * an extension the server refuses for lack of permission is told to `refused` (the intake ends).
 */
export const makeBufferedLeases = (
  env: IntakeEnv,
  state: IntakeState,
  leaseMillis: number,
  refused: (pulled: Pulled, error: NatsError.NatsError) => void
): BufferedLeases => {
  // Until when the engine holds the buffer, on the intake's monotonic time; undefined: it does not.
  let until: number | undefined
  let timer: ReturnType<typeof setInterval> | undefined
  // Messages whose extension is in flight (at most `prefetch`), with its withdrawal.
  const extending = new Map<Pulled, () => void>()
  const endHold = () => {
    until = undefined
    if (timer !== undefined) clearInterval(timer)
    timer = undefined
  }
  const extend = (pulled: Pulled, sentAt: number) => {
    // The answer may come before `sendExtend` returns (a closed connection answers at once):
    // then there is nothing to withdraw.
    let answered = false
    const withdraw = sendExtend(env.connection, pulled, Math.min(env.settleTimeoutMillis, leaseMillis * timing.extendAfter), (error) => {
      answered = true
      extending.delete(pulled)
      if (error === undefined) pulled.receivedAt = Math.max(pulled.receivedAt, sentAt)
      else if (error.reason === "NotAuthorized") refused(pulled, error)
      else if (error.reason === "Timeout") {
        // Unanswered (its request or reply lost, as across a reconnect): sent again at once, as
        // the engine's keeper does, since the next check could come past 90% of the lease.
        const now = env.receivedNow()
        if (now > sentAt && !state.closed && now - pulled.receivedAt < leaseMillis * timing.localEnd && state.buffered.includes(pulled)) {
          extend(pulled, now)
        }
      }
    })
    if (!answered) extending.set(pulled, withdraw)
  }
  // Extends each buffered message held at least `after` since it was last known held, and not yet
  // 90% of its lease.
  const extendHeld = (after: number) => {
    const now = env.receivedNow()
    for (const pulled of state.buffered) {
      const held = now - pulled.receivedAt
      if (held >= after && held < leaseMillis * timing.localEnd && !extending.has(pulled)) extend(pulled, now)
    }
  }
  const tick = () => {
    if (until === undefined || env.receivedNow() >= until || state.closed) return endHold()
    extendHeld(leaseMillis * timing.extendAfter)
  }
  return {
    hold: (forMillis) => {
      if (!(forMillis > 0)) {
        const holding = until !== undefined
        endHold()
        // The engine takes again: what waited through the pause starts with a fresh lease, as if
        // just received, instead of with up to half of one spent since its last extension.
        if (holding && !state.closed) extendHeld(0)
        return
      }
      if (!(leaseMillis > 0) || !Number.isFinite(leaseMillis) || state.closed) return endHold()
      until = env.receivedNow() + forMillis
      if (timer === undefined) {
        timer = setInterval(tick, Math.max(10, leaseMillis / 6))
        timer.unref()
        tick()
      }
    },
    stop: () => {
      endHold()
      for (const withdraw of extending.values()) withdraw()
      extending.clear()
    }
  }
}

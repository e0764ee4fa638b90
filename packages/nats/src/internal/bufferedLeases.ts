/**
 * The leases of the messages an intake buffers, kept while the engine takes none of them
 * (`Intake.holdBuffered`: while it is paused on a dependency). A buffered message is delivered as
 * far as the server knows, so its ack wait runs in the buffer: a pause longer than it would hand
 * the message to the broker for redelivery while this intake still holds it, and both deliveries
 * would run. They are kept as the engine's lease keeper keeps a running delivery's: an extension
 * (`+WPI`, confirmed) once a message has waited a third of its lease since it was last known held,
 * and none once 90% of it has passed, since the server confirms an old owner's extension too and
 * a confirmation then proves nothing. A confirmed extension moves the message's `receivedAt` to
 * when it was sent: the engine's lease counts from there once it takes the message.
 */
import { type Pulled, sendExtend } from "./delivery.ts"
import type { IntakeEnv, IntakeState } from "./intakeState.ts"

/** Keeping the buffered messages' leases: `hold` for a while (0: no longer), `stop` for good. */
export interface BufferedLeases {
  readonly hold: (forMillis: number) => void
  readonly stop: () => void
}

/** The keeper of `state`'s buffered messages, whose lease (the consumer's ack wait) is `leaseMillis`. */
export const makeBufferedLeases = (env: IntakeEnv, state: IntakeState, leaseMillis: number): BufferedLeases => {
  // Until when the engine holds the buffer, on the intake's monotonic time; undefined: it does not.
  let until: number | undefined
  let timer: ReturnType<typeof setInterval> | undefined
  // Messages whose extension is in flight (at most `prefetch`).
  const extending = new Set<Pulled>()
  const withdrawals = new Set<() => void>()
  const endHold = () => {
    until = undefined
    if (timer !== undefined) clearInterval(timer)
    timer = undefined
  }
  const extend = (pulled: Pulled, sentAt: number) => {
    extending.add(pulled)
    const withdraw = sendExtend(env.connection, pulled, Math.min(env.settleTimeoutMillis, leaseMillis / 3), (confirmed) => {
      extending.delete(pulled)
      withdrawals.delete(withdraw)
      if (confirmed) pulled.receivedAt = Math.max(pulled.receivedAt, sentAt)
    })
    withdrawals.add(withdraw)
  }
  const tick = () => {
    const now = env.receivedNow()
    if (until === undefined || now >= until || state.closed) return endHold()
    for (const pulled of state.buffered) {
      const held = now - pulled.receivedAt
      if (held >= leaseMillis / 3 && held < leaseMillis * 0.9 && !extending.has(pulled)) extend(pulled, now)
    }
  }
  return {
    hold: (forMillis) => {
      if (!(leaseMillis > 0) || !Number.isFinite(leaseMillis) || !(forMillis > 0) || state.closed) return endHold()
      until = env.receivedNow() + forMillis
      if (timer === undefined) {
        timer = setInterval(tick, Math.max(10, leaseMillis / 6))
        timer.unref()
        tick()
      }
    },
    stop: () => {
      endHold()
      for (const withdraw of withdrawals) withdraw()
      withdrawals.clear()
      extending.clear()
    }
  }
}

/**
 * The intake's keeper of buffered leases, with a connection whose answers the test gives and a
 * clock it sets: an extension that goes unanswered (`Timeout`) is sent again at once, not at the
 * keeper's next check, which can come after 90% of the lease; one answered otherwise is not, and
 * nothing is sent again past 90%, for a message no longer buffered, or once the keeper stopped.
 * Lease 60 s, so that the keeper's own checks (every 10 s) never run during a test: only `hold`
 * and the answers act. The real-broker case is in `test/dependency-pause-buffered-faults.test.ts`.
 */
import { assert, describe, it } from "vitest"
import type { Msg } from "@nats-io/transport-node"
import type { Shape } from "../src/NatsConnection.ts"
import * as NatsError from "../src/NatsError.ts"
import { makeBufferedLeases } from "../src/internal/bufferedLeases.ts"
import type { Pulled } from "../src/internal/delivery.ts"
import { type IntakeEnv, initialState } from "../src/internal/intakeState.ts"

const leaseMillis = 60_000

/** One extension sent: when, and how to answer it. */
interface Sent {
  readonly at: number
  readonly answer: (result: Msg | NatsError.NatsError) => void
}

const keeperOf = (...held: Array<number>) => {
  let now = 100_000
  const sent: Array<Sent> = []
  // As `Replies` does: a withdrawn request's answer is never told.
  const send: Shape["send"] = (_operation, _subject, _payload, _timeoutMillis, done) => {
    let withdrawn = false
    sent.push({ at: now, answer: (result) => withdrawn || done(result) })
    return () => void (withdrawn = true)
  }
  const env = { connection: { send } as unknown as Shape, settleTimeoutMillis: 30_000, receivedNow: () => now } as unknown as IntakeEnv
  const state = initialState()
  const messages = held.map((millis, i) => ({ stream: "S", streamSequence: i + 1, reply: `$JS.ACK.S.c.1.${i + 1}.${i + 1}.0.0`, receivedAt: now - millis }) as unknown as Pulled)
  state.buffered.push(...messages)
  const keeper = makeBufferedLeases(env, state, leaseMillis, () => undefined)
  return {
    keeper,
    state,
    messages,
    sent,
    advance: (millis: number) => void (now += millis),
    timeout: (operation = "Extend") => new NatsError.NatsError({ reason: "Timeout", operation, message: "no reply within 20000 ms" })
  }
}

const confirmed = {} as Msg

describe("the intake's keeper of buffered leases", () => {
  it("an extension unanswered within its wait is sent again at once, and the answer to that one keeps the lease", () => {
    // Held 30 s of 60: extended when the hold begins; its wait (20 s) ends at 50 s held.
    const { keeper, messages, sent, advance, timeout } = keeperOf(30_000)
    keeper.hold(300_000)
    assert.strictEqual(sent.length, 1, "extended when the hold began")
    advance(20_000)
    sent[0]!.answer(timeout())
    assert.strictEqual(sent.length, 2, "sent again at once, at 50 s of the lease (the next check could come at 60 s)")
    sent[1]!.answer(confirmed)
    assert.strictEqual(messages[0]!.receivedAt, sent[1]!.at, "the lease counts from the second extension")
    keeper.stop()
  })

  it("an extension answered with a failure other than Timeout, or a Timeout that took no time, is not sent again at once", () => {
    const { keeper, sent, advance, timeout } = keeperOf(30_000, 30_000)
    keeper.hold(300_000)
    assert.strictEqual(sent.length, 2)
    sent[0]!.answer(timeout())
    advance(1_000)
    sent[1]!.answer(new NatsError.NatsError({ reason: "ConnectionClosed", operation: "Extend", message: "closed" }))
    assert.strictEqual(sent.length, 2, "each waits for the keeper's next check")
    keeper.stop()
  })

  it("an unanswered extension is not sent again past 90% of the lease, for a message taken meanwhile, or once the keeper stopped", () => {
    const { keeper, state, sent, advance, timeout } = keeperOf(40_000, 30_000, 30_000)
    keeper.hold(300_000)
    assert.strictEqual(sent.length, 3)
    advance(15_000)
    // The first is at 55 s of 60 (past 54 s); the second was taken by the engine; then the keeper stops.
    sent[0]!.answer(timeout())
    state.buffered.splice(1, 1)
    sent[1]!.answer(timeout())
    keeper.stop()
    sent[2]!.answer(timeout())
    assert.strictEqual(sent.length, 3, "none sent again")
  })
})

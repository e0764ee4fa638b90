/**
 * The engine's lease keeper, on the `TestClock` with a delivery whose extensions the test
 * answers: an extension that goes unanswered is sent again at once, not at the keeper's next
 * check, which can come after 90% of the lease. Lease 6 s: a check every second, an extension
 * once a lease is 2 s old (answered within 2 s), lost at 5.4 s.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Duration, Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Delivery from "../src/Delivery.ts"
import * as LeaseKeeper from "../src/internal/leaseKeeper.ts"
import * as Monotonic from "../src/internal/monotonic.ts"

/**
 * How the delivery answers its next extension: not at all, at once, or with a failure (a
 * `Timeout` after 1 s, as the delivery's own bound would, or at once as a faulty source might;
 * the others after a round trip of 100 ms).
 */
type Reply = "never" | "confirm" | "Timeout at once" | Delivery.SettleFailure

/** A delivery whose extensions answer as `replies` say, in turn (then confirm), and are counted. */
const deliveryAnswering = (replies: Array<Reply>) => {
  const sent: Array<number> = []
  const extend = Effect.clockWith((clock) => {
    sent.push(Monotonic.millis(clock))
    const reply = replies.shift() ?? "confirm"
    if (reply === "never") return Effect.never
    if (reply === "confirm") return Effect.void
    const reason = reply === "Timeout at once" ? "Timeout" : reply
    const failure = Effect.fail(new Delivery.SettleError({ command: "Extend", reason, message: `extend: ${reply}` }))
    return reply === "Timeout at once" ? failure : Effect.andThen(Effect.sleep(reply === "Timeout" ? "1 second" : "100 millis"), failure)
  })
  const delivery: Delivery.Delivery = {
    subject: "jobs.a",
    payload: new Uint8Array(),
    sequence: 1,
    deliveryCount: 1,
    header: () => undefined,
    ack: Effect.void,
    nak: () => Effect.void,
    deadLetter: () => Effect.void,
    extend
  }
  return { delivery, sent }
}

/**
 * A keeper made at 0, and a delivery taken at 500 ms that waited `held` (3.3 s) in a buffer:
 * extended at once, that extension's wait ending at 2.5 s (held 5.3 s), the next check at 3 s
 * (held 5.8 s, past the 5.4 s end).
 */
const takenLate = (replies: Array<Reply>, held = 3_300) =>
  Effect.gen(function*() {
    const clock = yield* Clock.Clock
    const keeper = yield* LeaseKeeper.make(Duration.seconds(6))
    const handler = yield* Effect.forkChild(Effect.never)
    yield* TestClock.adjust("500 millis")
    const { delivery, sent } = deliveryAnswering(replies)
    const now = Monotonic.millis(clock)
    const lease = keeper.register(delivery, now - held, handler, now)
    const origin = now - 500
    return { keeper, lease, handler, sent: () => sent.map((at) => at - origin), since: () => lease.hold.since - origin }
  })

describe("the engine's lease keeper", () => {
  it.effect("an extension unanswered within its wait is sent again at once: a lease whose first one was lost is kept", () =>
    Effect.scoped(Effect.gen(function*() {
      const { lease, handler, sent, since } = yield* takenLate(["never", "confirm"])
      assert.deepStrictEqual(sent(), [500], "extended when taken")
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(sent(), [500, 2_500], "sent again as the first one's wait ended, at 5.3 s of the lease")
      assert.strictEqual(since(), 2_500, "the second one confirmed")
      yield* TestClock.adjust("1 second")
      assert.isFalse(lease.lost, "kept past the check at 3 s")
      assert.isUndefined(handler.pollUnsafe(), "the handler runs on")
    })))

  it.effect("a Timeout from the delivery's own bound is sent again at once too", () =>
    Effect.scoped(Effect.gen(function*() {
      const { lease, sent, since } = yield* takenLate(["Timeout", "confirm"])
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(sent(), [500, 1_500], "the delivery's bound (1 s) ended the first; sent again at once")
      assert.strictEqual(since(), 1_500)
      assert.isFalse(lease.lost)
    })))

  it.effect("an extension that fails with an answer (Unavailable, Refused, a Timeout that took no time) waits for the next check, and a lease with none confirmed is lost at 90%", () =>
    Effect.scoped(Effect.gen(function*() {
      const { lease, handler, sent } = yield* takenLate(["Unavailable", "Refused", "Timeout at once", "Unavailable"])
      assert.deepStrictEqual(sent(), [500], "not sent again at once")
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(sent(), [500, 1_000, 2_000], "once per check, not when answered")
      yield* TestClock.adjust("1 second")
      assert.isTrue(lease.lost, "past 5.4 s with nothing confirmed")
      yield* TestClock.adjust("1 millis")
      assert.isDefined(handler.pollUnsafe(), "the handler was interrupted")
    })))

  it.effect("an unanswered extension is not sent again past 90% of the lease", () =>
    Effect.scoped(Effect.gen(function*() {
      const late = yield* takenLate(["never", "never"])
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(late.sent(), [500, 2_500], "the second at 5.3 s")
      yield* TestClock.adjust("3 seconds")
      assert.deepStrictEqual(late.sent(), [500, 2_500], "none at 7.3 s: the lease ended at 5.4 s")
      assert.isTrue(late.lease.lost)
      // Taken 3.4 s held: the first wait ends at 5.4 s held, the lease's end.
      const later = yield* takenLate(["never", "never"], 3_400)
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(later.sent(), [500], "not sent again at 5.4 s")
    })))

  it.effect("an unanswered extension of a delivery no longer watched (its handler ended) is not sent again", () =>
    Effect.scoped(Effect.gen(function*() {
      const { keeper, lease, sent } = yield* takenLate(["never", "never"])
      keeper.unregister(lease)
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(sent(), [500], "not sent again once unregistered")
    })))
})

/**
 * An expired event found past 90% of the lease: its ack, or with `onExpired: "deadLetter"` its dead
 * letter and term, is not sent (another consumer may hold the message), and the outcome,
 * `Released` (LeaseLost), says that the event expired rather than a generic "lease ran out before
 * the ack"; the next delivery finds it expired again and settles it once. On the broker's last
 * delivery (MaxDeliver) nobody else can hold the message and no redelivery would write the dead
 * letter: it is written there. In-memory broker and test clock: the lease window is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Expiry, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Clock, DateTime, Effect, Schema } from "effect"
import { runUntil as runConsumerUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.Number })
const metadata = (event: { readonly id: string; readonly expiresAt: number }) => ({
  id: event.id,
  time: DateTime.makeUnsafe(0),
  expiresAt: DateTime.makeUnsafe(event.expiresAt)
})

const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : "stage" in outcome ? outcome.stage : ""
const errorOf = (outcome: Outcome.Outcome) =>
  "error" in outcome && outcome.error !== undefined ? `${outcome.error.tag}: ${outcome.error.message}` : ""

/** Runs `run` on the test clock until `done`, then stops it (see `support/testClock.ts`). */
const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean) => runConsumerUntil(run, done, 1000)

/**
 * A consumer whose handler waits 560 ms of the 600 ms lease (the lease is never extended), then
 * checks the expiry: the event, due at 500 ms, ends `Expired` (AfterWait) past 90% of the lease.
 */
const expiring = (name: string, source: Source.Source, onExpired: "ack" | "deadLetter", outcomes: Array<Outcome.Outcome>) =>
  Consumer.make({
    name,
    source,
    schema: Event,
    metadata,
    handle: () => Effect.andThen(Effect.sleep("560 millis"), Expiry.ensure),
    classify: {},
    expiry: { onExpired },
    retry: Retry.exponential({ attempts: 5, base: "1 second", inProcessRetries: 0 }),
    onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
  })

describe("an expired event found past the lease", () => {
  for (const onExpired of ["deadLetter", "ack"] as const) {
    it.effect(`onExpired: ${onExpired}: Released (LeaseLost) says it expired; the next delivery settles it once`, () =>
      Effect.gen(function*() {
        const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10, faults: { extendFails: 1 } })
        const now = yield* Clock.currentTimeMillis
        yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now + 500 }))
        const outcomes: Array<Outcome.Outcome> = []
        yield* runUntil(Consumer.run(expiring(`expired-past-lease-${onExpired}`, broker.source, onExpired, outcomes)), () => outcomes.length >= 2)
        assert.deepStrictEqual(
          outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
          [["Released", "LeaseLost", 1], ["Expired", "BeforeHandler", 2]]
        )
        assert.match(errorOf(outcomes[0]!), /^Expired: the event expired \(found after a wait, due .*\); found past the lease, its (ack|dead letter) was not sent/)
        assert.deepStrictEqual(
          broker.events().filter((e) => e._tag !== "Delivered" && e._tag !== "Extended").map((e) => [e._tag, e.deliveryCount]),
          onExpired === "ack" ? [["Acked", 2]] : [["DeadLettered", 2], ["Termed", 2]]
        )
        assert.isTrue(broker.quiescent(), "settled for good")
      }))
  }

  it.effect("onExpired: deadLetter, on the broker's last delivery (MaxDeliver): the dead letter is written past the lease", () =>
    Effect.gen(function*() {
      // A source whose broker delivers a message at most once, and whose delivery sat 580 ms of a
      // 600 ms lease in its buffer: the engine finds the event expired as it takes it, past 90%
      // of its lease. No redelivery would come to write the dead letter.
      const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10 })
      const source: Source.Source = {
        name: "buffered-once",
        open: (options) =>
          Effect.map(broker.source.open(options), (intake) => ({
            ...intake,
            maxDeliver: 1,
            take: Effect.flatMap(intake.take, (delivery) =>
              Clock.clockWith((clock) =>
                Effect.succeed({ ...delivery, receivedAt: Number(clock.monotonicTimeNanosUnsafe()) / 1_000_000 - 580 })
              ))
          }))
      }
      const now = yield* Clock.currentTimeMillis
      yield* broker.publish(JSON.stringify({ id: "e1", expiresAt: now - 1_000 }))
      const outcomes: Array<Outcome.Outcome> = []
      yield* runUntil(Consumer.run(expiring("expired-past-lease-last", source, "deadLetter", outcomes)), () => outcomes.length >= 1)
      assert.deepStrictEqual(outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]), [["Expired", "BeforeHandler", 1]])
      assert.deepStrictEqual(broker.deadLetters().map((letter) => letter.reason), ["Expired"])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))
})

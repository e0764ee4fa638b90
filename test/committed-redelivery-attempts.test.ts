/**
 * Without an attempt store the broker's delivery count stands for the failed attempts. A delivery
 * whose effect COMMITTED but whose ack was withheld (found past the lease) or not confirmed is
 * redelivered, and that redelivery was no failed attempt: it must reach the handler (whose
 * idempotency store finds the effect committed: `Duplicate`), not be dead-lettered
 * `AttemptsExhausted` before the handler runs — a false dead letter for an applied event. The
 * consumer run remembers the committed deliveries it could not ack; another process (or this one
 * after a restart) does not know them (documented on `Consumer`'s `attemptStore`). In-memory
 * broker and test clock: the lease window is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { DateTime, Effect, Schema } from "effect"
import { runUntil as runConsumerUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : "ackWithheld" in outcome ? outcome.ackWithheld ?? "" : ""

/** Runs `run` on the test clock until `done`, then stops it (see `support/testClock.ts`). */
const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean) => runConsumerUntil(run, done, 2000)

/**
 * A consumer whose handler commits its event through the store, after `slowRuns` runs that take
 * 560 ms of the 600 ms lease (their ack is withheld past 90% of it) and then at once.
 */
const committing = (name: string, broker: InMemoryBroker.InMemoryBroker, attempts: number, slowRuns: number, outcomes: Array<Outcome.Outcome>) => {
  const store = InMemoryIdempotencyStore.make()
  let runs = 0
  const consumer = Consumer.make({
    name,
    source: broker.source,
    schema: Event,
    metadata,
    handle: (event) =>
      Effect.suspend(() => {
        runs++
        const commit = IdempotencyStore.commit(event.id, Effect.void)
        return runs <= slowRuns ? Effect.andThen(Effect.sleep("560 millis"), commit) : commit
      }),
    classify: { IdempotencyError: "transient" },
    retry: Retry.exponential({ attempts, base: "1 second", inProcessRetries: 0 }),
    onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
  })
  return { run: Effect.provide(Consumer.run(consumer), store.layer), store, runs: () => runs }
}

describe("a committed delivery's redelivery without an attempt store", () => {
  it.effect("one attempt: a commit whose ack was withheld past the lease is redelivered as a Duplicate, not dead-lettered AttemptsExhausted", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10, faults: { extendFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const { run, store, runs } = committing("committed-withheld-one-attempt", broker, 1, 1, outcomes)
      yield* runUntil(run, () => outcomes.length >= 2)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["Committed", "LeaseLost", 1], ["Duplicate", "", 2]]
      )
      assert.strictEqual(store.commits().length, 1, "the effect committed once")
      assert.strictEqual(runs(), 2, "the redelivery reached the handler")
      assert.deepStrictEqual(broker.deadLetters(), [], "no dead letter for an applied event")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("two attempts: a commit whose ack was withheld twice is redelivered a third time as a Duplicate, not dead-lettered", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10, faults: { extendFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      // The first run commits past 90% of the lease; the second finds it committed, past the lease too.
      const { run, store } = committing("committed-withheld-two-attempts", broker, 2, 2, outcomes)
      yield* runUntil(run, () => outcomes.length >= 3)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["Committed", "LeaseLost", 1], ["Released", "LeaseLost", 2], ["Duplicate", "", 3]]
      )
      // The second delivery found the effect committed: its withheld ack says so.
      const second = outcomes[1]!
      assert.isTrue(second._tag === "Released" && second.effectCommitted === true, JSON.stringify(second))
      assert.strictEqual(store.commits().length, 1, "the effect committed once")
      assert.deepStrictEqual(broker.deadLetters(), [], "no dead letter for an applied event")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("one attempt: a commit whose ack was not confirmed is redelivered as a Duplicate, not dead-lettered", () =>
    Effect.gen(function*() {
      // The first delivery's ack is lost (applied or not: here not applied, the command lost) each
      // time it is sent within its lease, so its outcome is left unconfirmed.
      const outcomes: Array<Outcome.Outcome> = []
      const broker = InMemoryBroker.make({
        lease: "600 millis",
        maxDeliver: 10,
        faults: { commandLost: 0.5 },
        random: () => (outcomes.length === 0 ? 0 : 1)
      })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const { run, store } = committing("committed-unconfirmed-one-attempt", broker, 1, 0, outcomes)
      yield* runUntil(run, () => outcomes.length >= 2)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, o.confirmed, o.message.deliveryCount]),
        [["Committed", false, 1], ["Duplicate", true, 2]]
      )
      assert.strictEqual(store.commits().length, 1, "the effect committed once")
      assert.deepStrictEqual(broker.deadLetters(), [], "no dead letter for an applied event")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))
})

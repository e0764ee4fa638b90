/**
 * A handler that fails after its `IdempotencyStore.commit` returned (a publish or a log step after
 * it) keeps its failure outcome, so that what failed after the commit is retried (`Released`) or
 * kept for an operator (`DeadLettered`) rather than dropped by an ack; but the outcome, and the
 * dead letter, say that the effect itself is applied (`effectCommitted: true`): nothing was rolled
 * back, and the redelivery or a replay finds the effect committed (`Duplicate`) and runs only what
 * followed the commit. A failure before any commit says nothing of the kind. In-memory broker and
 * store under the test clock: the claim is the engine's verdict.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, IdempotencyStore, Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Data, DateTime, Effect, Schema } from "effect"
import { runUntil as runConsumerUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class PublishFailed extends Data.TaggedError("PublishFailed")<{ readonly message: string }> {}
class PublishRefused extends Data.TaggedError("PublishRefused")<{ readonly message: string }> {}

const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : ""
const committedOf = (outcome: Outcome.Outcome) =>
  outcome._tag === "Released" || outcome._tag === "DeadLettered" ? outcome.effectCommitted === true : false

/** Runs `run` on the test clock until `done`, then stops it (see `support/testClock.ts`). */
const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean) => runConsumerUntil(run, done, 2000)

/** A consumer whose handler commits its event, then "publishes": `publish(run)` says how that run's step ends. */
const committingThen = (
  name: string,
  broker: InMemoryBroker.InMemoryBroker,
  attempts: number,
  publish: (run: number) => Effect.Effect<void, PublishFailed | PublishRefused>,
  outcomes: Array<Outcome.Outcome>
) => {
  const store = InMemoryIdempotencyStore.make()
  let runs = 0
  const published: Array<number> = []
  const consumer = Consumer.make({
    name,
    source: broker.source,
    schema: Event,
    metadata,
    handle: (event) =>
      Effect.suspend(() => {
        const run = ++runs
        return IdempotencyStore.commit(event.id, Effect.void).pipe(
          Effect.andThen(publish(run)),
          Effect.andThen(Effect.sync(() => published.push(run)))
        )
      }),
    classify: { PublishFailed: "transient", PublishRefused: "permanent", IdempotencyError: "transient" },
    retry: Retry.exponential({ attempts, base: "100 millis", inProcessRetries: 0 }),
    onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
  })
  return { run: Effect.provide(Consumer.run(consumer), store.layer), store, published }
}

describe("a failure after the commit returned", () => {
  it.effect("transient: Released (Retrying) says the effect is committed; the redelivery is a Duplicate that runs the rest once", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const { run, store, published } = committingThen(
        "after-commit-transient",
        broker,
        3,
        (run) => run === 1 ? Effect.fail(new PublishFailed({ message: "publish timed out" })) : Effect.void,
        outcomes
      )
      yield* runUntil(run, () => outcomes.length >= 2)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), committedOf(o), o.message.deliveryCount]),
        [["Released", "Retrying", true, 1], ["Duplicate", "", false, 2]]
      )
      assert.include(Outcome.describe(outcomes[0]!), "the effect was committed before the failure")
      assert.strictEqual(store.commits().length, 1, "the effect committed once")
      assert.deepStrictEqual(published, [2], "what followed the commit ran once, on the redelivery")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("permanent: DeadLettered (PermanentError) with effectCommitted, in the outcome and the dead letter", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const { run, store } = committingThen(
        "after-commit-permanent",
        broker,
        3,
        () => Effect.fail(new PublishRefused({ message: "the topic refused the message" })),
        outcomes
      )
      yield* runUntil(run, () => outcomes.length >= 1)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), committedOf(o), o.message.deliveryCount]),
        [["DeadLettered", "PermanentError", true, 1]]
      )
      assert.strictEqual(store.commits().length, 1)
      const letters = broker.deadLetters()
      assert.deepStrictEqual(
        letters.map((letter) => [letter.reason, letter.effectCommitted, letter.error.fields.effectCommitted, letter.error.message]),
        [["PermanentError", true, true, "the topic refused the message"]]
      )
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("attempts spent: DeadLettered (AttemptsExhausted) with effectCommitted; a failure before any commit has none", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const { run } = committingThen(
        "after-commit-exhausted",
        broker,
        2,
        () => Effect.fail(new PublishFailed({ message: "publish timed out" })),
        outcomes
      )
      yield* runUntil(run, () => outcomes.length >= 2)
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), committedOf(o), o.message.deliveryCount]),
        [["Released", "Retrying", true, 1], ["DeadLettered", "AttemptsExhausted", true, 2]]
      )
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.effectCommitted]), [["AttemptsExhausted", true]])

      // A handler that fails before its commit: nothing committed, nothing said.
      const other = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 10 })
      yield* other.publish(JSON.stringify({ id: "e2" }))
      const before: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "before-commit",
        source: other.source,
        schema: Event,
        metadata,
        handle: () => Effect.fail(new PublishRefused({ message: "refused" })),
        classify: { PublishRefused: "permanent" },
        retry: Retry.exponential({ attempts: 2, base: "100 millis", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => before.push(outcome))
      })
      yield* runUntil(Consumer.run(consumer), () => before.length >= 1)
      assert.deepStrictEqual(before.map((o) => [o._tag, "effectCommitted" in o]), [["DeadLettered", false]])
      assert.deepStrictEqual(other.deadLetters().map((letter) => ["effectCommitted" in letter, "effectCommitted" in letter.error.fields]), [[false, false]])
    }))
})

/**
 * BE-JOB-003: without an attempt store the delivery count stands for the attempts, so the
 * deliveries spent on a dead letter that could not be written (an outage of the dead-letter
 * stream) count as failed attempts. A permanent failure's dead letter, written once the outage is
 * over on a delivery beyond the attempts, was dead-lettered before the handler ran with reason
 * `AttemptsExhausted`, and `jetworker dlq list --reason PermanentError` missed it. It keeps the
 * reason (and error) of the dead letter that was not written. In-memory broker (dead-letter writes
 * refused while the outage lasts) and test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Result, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Invalid extends Data.TaggedError("Invalid")<{ readonly message: string }> {}
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/**
 * A broker whose dead-letter writes are refused while `outage.on`: its fault source answers 0
 * (below every probability) during the outage, 1 (above all) after.
 */
const brokerWithOutage = (maxDeliver = 10) => {
  const outage = { on: true }
  const broker = InMemoryBroker.make({
    lease: "30 seconds",
    maxDeliver,
    faults: { deadLetterFails: 1 },
    random: () => (outage.on ? 0 : 1)
  })
  return { broker, outage }
}

/** Runs the consumer on the test clock until `outageOverWhen`, then ends the outage and runs until `finished`. */
const runThroughOutage = (
  run: Effect.Effect<never, unknown>,
  outage: { on: boolean },
  outageOverWhen: () => boolean,
  finished: () => boolean
) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(run)
    for (let i = 0; i < 3_000 && !outageOverWhen(); i++) yield* TestClock.adjust("10 millis")
    outage.on = false
    for (let i = 0; i < 3_000 && !finished(); i++) yield* TestClock.adjust("10 millis")
    yield* Fiber.interrupt(fiber)
  })

describe("the reason of a dead letter written after an outage of the dead-letter stream", () => {
  // MaxDeliver 10: delivery 4 is beyond the attempts (AttemptsExhausted before). MaxDeliver 4: it
  // is beyond the deliveries too, the crash-loop bound being 3 (DeliveriesExhausted before).
  it.effect.each([10, 4])("BE-JOB-003: without an attempt store, a permanent failure whose dead letter was refused on every attempt is dead-lettered PermanentError (with its error) once the outage ends, not AttemptsExhausted (MaxDeliver %d)", (maxDeliver) =>
    Effect.gen(function*() {
      const { broker, outage } = brokerWithOutage(maxDeliver)
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = Consumer.make({
        name: "reason-after-outage",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () =>
          Effect.suspend(() => {
            runs++
            return Effect.fail(new Invalid({ message: "amount is negative" }))
          }),
        classify: { Invalid: "permanent" },
        retry: Retry.exponential({ attempts: 3, base: "50 millis", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      // The outage lasts through the attempts: deliveries 1 to 3 each fail to write the dead letter.
      yield* runThroughOutage(
        Consumer.run(consumer),
        outage,
        () => outcomes.filter((o) => o._tag === "Released").length >= 3,
        () => outcomes.some((o) => o._tag === "DeadLettered" && o.confirmed)
      )
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, o.message.deliveryCount, "reason" in o ? o.reason : ""]),
        [
          ["Released", 1, "DeadLetterFailed"],
          ["Released", 2, "DeadLetterFailed"],
          ["Released", 3, "DeadLetterFailed"],
          ["DeadLettered", 4, "PermanentError"]
        ]
      )
      assert.strictEqual(runs, 3, "the handler ran the policy's attempts, not once more")
      const letters = broker.deadLetters()
      assert.deepStrictEqual(letters.map((letter) => [letter.reason, letter.message.deliveryCount]), [["PermanentError", 4]])
      assert.strictEqual(letters[0]!.error.tag, "Invalid")
      assert.include(letters[0]!.error.message, "amount is negative")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-003: without an attempt store, a transient failure whose last attempt's dead letter was refused is dead-lettered AttemptsExhausted once the outage ends", () =>
    Effect.gen(function*() {
      const { broker, outage } = brokerWithOutage()
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "reason-after-outage-transient",
        source: broker.source,
        schema: Event,
        metadata,
        handle: () => Effect.fail(new Flaky({ message: "try again" })),
        classify: { Flaky: "transient" },
        retry: Retry.exponential({ attempts: 3, base: "50 millis", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runThroughOutage(
        Consumer.run(consumer),
        outage,
        () => outcomes.some((o) => o._tag === "Released" && o.reason === "DeadLetterFailed"),
        () => outcomes.some((o) => o._tag === "DeadLettered" && o.confirmed)
      )
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, o.message.deliveryCount, "reason" in o ? o.reason : ""]),
        [
          ["Released", 1, "Retrying"],
          ["Released", 2, "Retrying"],
          ["Released", 3, "DeadLetterFailed"],
          ["DeadLettered", 4, "AttemptsExhausted"]
        ]
      )
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["AttemptsExhausted", 4]])
    }))

  it.effect("BE-JOB-003: in a batch, without an attempt store, a permanent element whose dead letter was refused on every attempt is dead-lettered PermanentError once the outage ends", () =>
    Effect.gen(function*() {
      const { broker, outage } = brokerWithOutage()
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.makeBatch({
        name: "reason-after-outage-batch",
        source: broker.source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: "20 millis" },
        handleBatch: (events) => Effect.succeed(events.map(() => Result.fail(new Invalid({ message: "amount is negative" })))),
        classify: { Invalid: "permanent" },
        retry: Retry.exponential({ attempts: 3, base: "50 millis", inProcessRetries: 0 }),
        concurrency: 1,
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runThroughOutage(
        Consumer.run(consumer),
        outage,
        () => outcomes.filter((o) => o._tag === "Released").length >= 3,
        () => outcomes.some((o) => o._tag === "DeadLettered" && o.confirmed)
      )
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, o.message.deliveryCount, "reason" in o ? o.reason : ""]).slice(-1),
        [["DeadLettered", 4, "PermanentError"]]
      )
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["PermanentError", 4]])
    }))
})

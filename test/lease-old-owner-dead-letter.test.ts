/**
 * BE-JOB-006: an owner past its local lease neither stores a dead letter nor sends a term. Past
 * 90% of the lease another consumer may hold the message, and NATS 2.9 applies a term by sequence
 * to whoever holds it: the old owner's term would end the new owner's delivery while it runs it
 * (and its dead letter would be a false one if the new owner commits). As a transient failure
 * found there sends no nak (test/lease-old-owner-nak.test.ts), a permanent failure, or a last
 * attempt, ends `Released` (LeaseLost) with its error kept, and the next delivery decides: it is
 * dead-lettered then, once. In-memory broker and test clock: the window (from 90% of the lease to
 * the keeper's next check) is hit exactly.
 */
import { assert, describe, it } from "@effect/vitest"
import { type Classification, Consumer, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Clock, Data, DateTime, Duration, Effect, Result, Schema } from "effect"
import { runUntil as runConsumerUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Invalid extends Data.TaggedError("Invalid")<{ readonly message: string }> {}
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/** The broker's terms and dead letters of delivery `deliveryCount`. */
const settlingCommands = (broker: InMemoryBroker.InMemoryBroker, deliveryCount: number) =>
  broker.events().filter((event) => (event._tag === "Termed" || event._tag === "DeadLettered") && event.deliveryCount === deliveryCount)

const reasonOf = (outcome: Outcome.Outcome | undefined) => outcome !== undefined && "reason" in outcome ? outcome.reason : ""
const errorOf = (outcome: Outcome.Outcome | undefined) =>
  outcome !== undefined && "error" in outcome && outcome.error !== undefined ? outcome.error.message : ""

/** Runs `run` on the test clock until `done`, then stops it (see `support/testClock.ts`). */
const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean) => runConsumerUntil(run, done, 1000)

/**
 * One message on a broker that confirms no lease extension (lease 600 ms: the keeper takes it lost
 * at its check at 600 ms), consumed by `name` with a handler that runs `handle(run)` (`run` from 1)
 * and a policy of `attempts` attempts, until its first two outcomes.
 */
const oldOwner = <E extends Classification.Tagged>(options: {
  readonly name: string
  readonly attempts: number
  readonly classify: Consumer.Options<{ readonly id: string }, E, never>["classify"]
  readonly handle: (run: number) => Effect.Effect<void, E>
}) =>
  Effect.gen(function*() {
    const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10, faults: { extendFails: 1 } })
    yield* broker.publish(JSON.stringify({ id: "e1" }))
    const outcomes: Array<Outcome.Outcome> = []
    let runs = 0
    const consumer = Consumer.make({
      name: options.name,
      source: broker.source,
      schema: Event,
      metadata,
      handle: () => Effect.suspend(() => options.handle(++runs)),
      classify: options.classify,
      retry: Retry.exponential({ attempts: options.attempts, base: "1 second", inProcessRetries: 0 }),
      onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
    })
    yield* runUntil(Consumer.run(consumer), () => outcomes.length >= 2)
    return { broker, outcomes, runs: () => runs }
  })

describe("an old owner's dead letter", () => {
  it.effect("BE-JOB-006: a permanent failure found past 90% of the lease stores no dead letter and sends no term: Released (LeaseLost) with its error; the next delivery dead-letters it once", () =>
    Effect.gen(function*() {
      // Every extension fails, so the lease is not renewed; the keeper checks every 100 ms (a
      // sixth of the lease) and takes it lost at its check at 600 ms. The first run fails at
      // 560 ms, the redelivery's (at 600 ms) at once.
      const { broker, outcomes } = yield* oldOwner({
        name: "old-owner-dead-letter",
        attempts: 5,
        classify: { Invalid: "permanent" },
        handle: (run) => {
          const fail = Effect.fail(new Invalid({ message: "amount is negative" }))
          return run === 1 ? Effect.andThen(Effect.sleep("560 millis"), fail) : fail
        }
      })
      const first = outcomes[0]
      assert.isDefined(first, "an outcome for the first delivery")
      assert.deepStrictEqual(settlingCommands(broker, 1), [], `the old owner's dead letter or term reached the broker: ${JSON.stringify(first)}`)
      assert.deepStrictEqual([first!._tag, reasonOf(first), first!.message.deliveryCount], ["Released", "LeaseLost", 1])
      // The failure that ended the run is kept for the operator.
      assert.include(errorOf(first), "amount is negative")
      // The next delivery decides: dead-lettered there, once, with the reason and error of its own run.
      assert.deepStrictEqual(
        outcomes.slice(1).map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["DeadLettered", "PermanentError", 2]]
      )
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["PermanentError", 2]])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-006: a last attempt's transient failure found past 90% of the lease stores no dead letter and sends no term; the next delivery dead-letters it AttemptsExhausted, once", () =>
    Effect.gen(function*() {
      const { broker, outcomes, runs } = yield* oldOwner({
        name: "old-owner-last-attempt",
        // The first delivery is the last attempt.
        attempts: 1,
        classify: { Flaky: "transient" },
        handle: () => Effect.andThen(Effect.sleep("560 millis"), Effect.fail(new Flaky({ message: "try again" })))
      })
      const first = outcomes[0]
      assert.isDefined(first, "an outcome for the first delivery")
      assert.deepStrictEqual(settlingCommands(broker, 1), [], `the old owner's dead letter or term reached the broker: ${JSON.stringify(first)}`)
      assert.deepStrictEqual([first!._tag, reasonOf(first)], ["Released", "LeaseLost"])
      assert.include(errorOf(first), "try again")
      assert.deepStrictEqual(
        outcomes.slice(1).map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
        [["DeadLettered", "AttemptsExhausted", 2]]
      )
      assert.strictEqual(runs(), 1, "the handler ran the policy's one attempt")
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["AttemptsExhausted", 2]])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-006: without an attempt store, a last attempt's permanent failure found past 90% of the lease is withheld; the next delivery, beyond the attempts, dead-letters it PermanentError without running the handler", () =>
    Effect.gen(function*() {
      const { broker, outcomes, runs } = yield* oldOwner({
        name: "old-owner-last-permanent",
        attempts: 1,
        classify: { Invalid: "permanent" },
        handle: () => Effect.andThen(Effect.sleep("560 millis"), Effect.fail(new Invalid({ message: "amount is negative" })))
      })
      assert.deepStrictEqual(settlingCommands(broker, 1), [], "the old owner's dead letter or term reached the broker")
      assert.deepStrictEqual(
        outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount, errorOf(o)]),
        [["Released", "LeaseLost", 1, "amount is negative"], ["DeadLettered", "PermanentError", 2, "amount is negative"]]
      )
      assert.strictEqual(runs(), 1, "the handler ran the policy's one attempt")
      assert.deepStrictEqual(broker.deadLetters().map((letter) => [letter.reason, letter.message.deliveryCount]), [["PermanentError", 2]])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-006: on the broker's last delivery (MaxDeliver) no other consumer can hold the message: past its lease the owner still dead-letters it", () =>
    Effect.gen(function*() {
      // A source whose broker delivers a message at most once, and whose deliveries sat 580 ms of
      // a 600 ms lease in its buffer: the engine takes the first (and last) delivery past 90% of
      // its lease, and dead-letters it at once (DeliveriesExhausted: the bound is below MaxDeliver).
      // Withholding that dead letter would strand the message: no redelivery can decide.
      const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10 })
      const source: Source.Source = {
        name: "buffered",
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
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "old-owner-max-deliver",
        source,
        schema: Event,
        metadata,
        handle: () => Effect.void,
        classify: {},
        retry: Retry.exponential({ attempts: 1, base: "1 second", inProcessRetries: 0 }),
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runUntil(Consumer.run(consumer), () => outcomes.length >= 1)
      assert.deepStrictEqual(outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]), [["DeadLettered", "DeliveriesExhausted", 1]])
      assert.deepStrictEqual(broker.deadLetters().map((letter) => letter.reason), ["DeliveriesExhausted"])
      assert.isTrue(broker.quiescent(), "settled for good")
    }))

  it.effect("BE-JOB-006: in a batch, an element's permanent failure found past 90% of the lease stores no dead letter and sends no term; the next delivery dead-letters it once", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "600 millis", maxDeliver: 10, faults: { extendFails: 1 } })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const outcomes: Array<Outcome.Outcome> = []
      let runs = 0
      const consumer = Consumer.makeBatch({
        name: "old-owner-batch",
        source: broker.source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: Duration.millis(20) },
        handleBatch: (events) =>
          Effect.suspend(() => {
            runs++
            const results = events.map(() => Result.fail(new Invalid({ message: "amount is negative" })))
            return runs === 1 ? Effect.as(Effect.sleep("540 millis"), results) : Effect.succeed(results)
          }),
        classify: { Invalid: "permanent" },
        retry: Retry.exponential({ attempts: 5, base: "1 second", inProcessRetries: 0 }),
        concurrency: 1,
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runUntil(Consumer.run(consumer), () => outcomes.length >= 4)
      assert.deepStrictEqual(settlingCommands(broker, 1), [], `the old owner's dead letters or terms reached the broker: ${JSON.stringify(outcomes.slice(0, 2))}`)
      assert.deepStrictEqual(
        outcomes.slice(0, 2).map((o) => [o.message.eventId, o._tag, reasonOf(o), errorOf(o)]).sort(),
        [["e1", "Released", "LeaseLost", "amount is negative"], ["e2", "Released", "LeaseLost", "amount is negative"]]
      )
      assert.deepStrictEqual(
        outcomes.slice(2).map((o) => [o.message.eventId, o._tag, reasonOf(o), o.message.deliveryCount]).sort(),
        [["e1", "DeadLettered", "PermanentError", 2], ["e2", "DeadLettered", "PermanentError", 2]]
      )
      assert.strictEqual(broker.deadLetters().length, 2, "one dead letter each")
      assert.isTrue(broker.quiescent(), "settled for good")
    }))
})

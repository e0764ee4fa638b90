/**
 * A handler that ends interrupted by itself (it joins a fiber it interrupted, or calls
 * `Effect.interrupt`) failed: nothing outside it asked it to stop. It is retried under the
 * consumer's retry policy (its attempts and backoff) like any other failure, and dead-lettered when
 * the attempts are spent, instead of being released at once without spending an attempt: that is
 * for the engine's own cut (a shutdown past its drain, a lost lease), and a self-interrupting
 * handler then ran in a hot loop until the crash-loop guard dead-lettered it as
 * `DeliveriesExhausted`. In-memory broker, test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { DateTime, Duration, Effect, Fiber, Schema } from "effect"
import { runUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : ""

/** Interrupts a child fiber of its own and joins it: the handler ends interrupted, by itself. */
const joinsWhatItInterrupted = Effect.andThen(
  Effect.forkChild(Effect.never),
  (child) => Effect.andThen(Fiber.interrupt(child), Fiber.join(child))
)

const runWith = (name: string, handle: Effect.Effect<void>) =>
  Effect.gen(function*() {
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 20 })
    yield* broker.publish(JSON.stringify({ id: "e1" }))
    const outcomes: Array<Outcome.Outcome> = []
    let runs = 0
    const consumer = Consumer.make({
      name,
      source: broker.source,
      schema: Event,
      metadata,
      handle: (): Effect.Effect<void> => Effect.suspend(() => {
        runs++
        return handle
      }),
      classify: {},
      retry: Retry.exponential({ attempts: 3, base: "1 second", cap: "30 seconds", jitter: false, inProcessRetries: 0 }),
      onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
    })
    yield* runUntil(Consumer.run(consumer), () => outcomes.some((o) => o._tag === "DeadLettered"), 5_000)
    return { outcomes, runs, broker }
  })

describe("a handler that interrupts itself", () => {
  const handlers: ReadonlyArray<readonly [string, Effect.Effect<void>]> = [
    ["joins a fiber it interrupted", joinsWhatItInterrupted],
    ["calls Effect.interrupt", Effect.interrupt]
  ]
  for (const [label, handle] of handlers) {
    it.effect(`BE-JOB-003: a handler that ${label} spends an attempt each time, with the policy's backoff, and is dead-lettered AttemptsExhausted after 3`, () =>
      Effect.gen(function*() {
        const { outcomes, runs, broker } = yield* runWith(`self-interrupting-${label.split(" ")[0]}`, handle)
        assert.deepStrictEqual(
          outcomes.map((o) => [o._tag, reasonOf(o), o.message.deliveryCount]),
          [["Released", "Retrying", 1], ["Released", "Retrying", 2], ["DeadLettered", "AttemptsExhausted", 3]],
          JSON.stringify(outcomes)
        )
        const retries = outcomes.flatMap((o) => o._tag === "Released" && o.retryIn !== undefined ? [Duration.toMillis(o.retryIn)] : [])
        assert.deepStrictEqual(retries, [1_000, 2_000], "the policy's backoff")
        assert.strictEqual(runs, 3)
        const dead = outcomes[2]!
        assert.include(dead._tag === "DeadLettered" ? dead.error.message : "", "interrupted")
        assert.lengthOf(broker.deadLetters(), 1)
      }))
  }
})

/**
 * BE-JOB-003 with a dependency outage: under a managed lifecycle, while a dependency the consumer
 * pauses on is down (`Lifecycle.resource` with a failing `check`), a delivery whose handler fails
 * transiently is held (lease kept, failure not counted) and runs again once the dependency is
 * back, and the workers take nothing new meanwhile. Without the pause (`pauseOn: "none"`) the same
 * outage spends the attempts and dead-letters; a hold is bounded by `maxHold`, and a shutdown ends
 * it with a release. In-memory broker, test clock, a dependency whose check reads a flag.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { gauge, tags, withBatchConsumer, withConsumer } from "./support/pause.ts"

describe("pausing on a dependency that is down", () => {
  it.effect("BE-JOB-003: handlers failing while the database is down are held, not counted (1 attempt would dead-letter them), the intake takes nothing new, and every message commits once the database is back", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(6, { concurrency: 2 })
      t.db.up = false
      // The check still passes (its next probe is 500 ms away): the first failure probes it at once.
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "a delivery held")
      assert.deepStrictEqual(t.outcomes, [], `no outcome while the database is down: ${JSON.stringify(tags(t.outcomes))}`)
      // Paused for 5 s: the held deliveries (one per worker at most) are all that ran, and no new one is taken.
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(t.outcomes, [])
      const held = new Set(t.events("delivery.held").map((l) => l.annotations.eventId))
      assert.isAtMost(held.size, 2)
      assert.deepStrictEqual([...new Set(t.runs.map((r) => r.id))].sort(), [...held].sort(), "only the held deliveries ran")
      assert.lengthOf(t.events("consumer.paused"), 1, "the pause is logged once")
      assert.strictEqual(yield* gauge("jetworker.paused", "paused"), 1, "jetworker.paused is 1 while paused")
      assert.strictEqual(yield* gauge("jetworker.held", "paused"), held.size, "jetworker.held counts the held deliveries")
      const status = t.lifecycle.readiness().components.find((c) => c.name === "db")
      assert.isFalse(status?.up, "the dependency is down on the readiness probe")
      t.db.up = true
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 6), "every message settled once the database is back")
      assert.deepStrictEqual(tags(t.outcomes), Array(6).fill("Committed"))
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      assert.lengthOf(t.events("consumer.resumed"), 1, "the resumption is logged once")
      assert.strictEqual(yield* gauge("jetworker.paused", "paused"), 0)
      assert.strictEqual(yield* gauge("jetworker.held", "paused"), 0)
      const line = t.events("delivery.held")[0]!
      assert.strictEqual(line.annotations.dependencies, "db")
      assert.include(String(line.message), "db (connection refused)")
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003, BE-JOB-007: a batch that fails as a whole while the database is down: its elements, run alone, are held, not counted, and all commit once it is back", () =>
    Effect.gen(function*() {
      const t = yield* withBatchConsumer(4)
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "an element held")
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(t.outcomes, [], `no outcome while the database is down: ${JSON.stringify(tags(t.outcomes))}`)
      t.db.up = true
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 4), "every element settled once the database is back")
      assert.deepStrictEqual(tags(t.outcomes), Array(4).fill("Committed"))
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: with pauseOn \"none\" the same outage counts the failure: dead-lettered AttemptsExhausted", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1, dependencies: { pauseOn: "none" } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1))
      assert.deepStrictEqual(tags(t.outcomes), ["DeadLettered:AttemptsExhausted"])
      assert.lengthOf(t.events("delivery.held"), 0)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: a hold lasts at most maxHold; then the failure counts as usual (logged delivery.hold_ended)", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1, dependencies: { maxHold: "3 seconds" } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1))
      // The hold began within the last 100 ms step.
      yield* TestClock.adjust("2800 millis")
      assert.deepStrictEqual(t.outcomes, [], "still held within maxHold")
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 10))
      assert.deepStrictEqual(tags(t.outcomes), ["DeadLettered:AttemptsExhausted"])
      assert.lengthOf(t.events("delivery.hold_ended"), 1)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: a shutdown ends a hold: the delivery is released (Interrupted), not counted", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1 })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1))
      // Interrupting the run drains for `drainTimeout` (10 s), then interrupts the held delivery.
      const stopping = yield* Effect.forkChild(Fiber.interrupt(t.fiber))
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 200))
      yield* Fiber.join(stopping)
      assert.deepStrictEqual(tags(t.outcomes), ["Released:Interrupted"])
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      yield* Scope.close(t.scope, Exit.void)
    }))
})

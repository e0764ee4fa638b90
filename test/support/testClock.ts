/**
 * Driving a consumer on the test clock (`effect/testing`'s `TestClock`): the in-memory engine tests
 * step the clock instead of waiting on real time.
 */
import { assert } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"

/**
 * Runs `run` on the test clock, 10 ms a step, until `done` (at most `maxSteps` steps), then stops
 * it, stepping on while its shutdown waits on the clock (at most 1 000 steps), and asserts that it
 * stopped.
 */
export const runUntil = (run: Effect.Effect<never, unknown>, done: () => boolean, maxSteps: number) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(run)
    for (let i = 0; i < maxSteps && !done(); i++) yield* TestClock.adjust("10 millis")
    let stopped = false
    yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
      stopped = true
    })))
    for (let i = 0; i < 1_000 && !stopped; i++) yield* TestClock.adjust("10 millis")
    assert.isTrue(stopped, "the consumer stopped")
  })

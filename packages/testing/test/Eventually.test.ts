import { assert, describe, it } from "@effect/vitest"
import type { Outcome } from "@jetworker/core"
import { Effect } from "effect"
import { Eventually, OutcomeLog } from "../src/index.ts"

// `it.effect` runs under TestClock: without the real clock, these bounds would never run out and
// the test would hang until the runner's timeout.
describe("bounded waits under the test clock", () => {
  it.effect("Eventually.holds fails with a WaitTimeout in real time instead of hanging", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Eventually.holds("a condition that never holds", Effect.succeed(false), "200 millis"))
      assert.strictEqual(error._tag, "WaitTimeout")
      assert.strictEqual(error.message, "waited 200ms for a condition that never holds")
    }))

  it.effect("OutcomeLog.waitUntil fails with a WaitTimeout saying what it saw", () =>
    Effect.gen(function*() {
      const log = yield* OutcomeLog.make
      const error = yield* Effect.flip(log.waitUntil((all: ReadonlyArray<Outcome.Outcome>) => all.length > 0, "200 millis", "one outcome"))
      assert.strictEqual(error._tag, "WaitTimeout")
      assert.include(error.message, "waited 200ms for one outcome; saw")
    }))
})

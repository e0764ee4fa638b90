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

  // README, "Testing your consumer": a wait that cannot be satisfied fails with a `WaitTimeout`
  // "saying what it waited for and what it saw". Failed before: poll's said only "waited 200ms for
  // ...", not what the probe returned.
  it.effect("Eventually.poll's WaitTimeout names what it awaited and the last value the probe returned", () =>
    Effect.gen(function*() {
      let reads = 0
      const error = yield* Effect.flip(
        Eventually.poll(
          "the consumer's num_pending to reach 0",
          Effect.sync(() => ({ num_pending: 7, reads: ++reads })),
          (info) => info.num_pending === 0,
          { timeout: "200 millis" }
        )
      )
      assert.strictEqual(error._tag, "WaitTimeout")
      assert.strictEqual(error.message, `waited 200ms for the consumer's num_pending to reach 0; saw {"num_pending":7,"reads":${reads}}`)
    }))

  it.effect("Eventually.poll shortens a long last value, and says when the probe never returned", () =>
    Effect.gen(function*() {
      const long = yield* Effect.flip(Eventually.poll("a short text", Effect.succeed("x".repeat(1_000)), (text) => text.length < 10, {
        timeout: "100 millis"
      }))
      assert.match(long.message, /^waited 100ms for a short text; saw "x{199}… \(1002 characters\)$/)
      const never = yield* Effect.flip(Eventually.poll("an answer", Effect.never, () => true, { timeout: "100 millis" }))
      assert.strictEqual(never.message, "waited 100ms for an answer; saw nothing (the probe had not returned yet)")
    }))

  // Found sound before the fix; kept as they are cheap.
  it.effect("sound: bad bounds are refused at once with a WaitTimeout naming the bound", () =>
    Effect.gen(function*() {
      const log = yield* OutcomeLog.make
      const messages = [
        (yield* Effect.flip(Eventually.holds("x", Effect.succeed(false), "banana" as never))).message,
        (yield* Effect.flip(Eventually.holds("x", Effect.succeed(false), Number.NaN))).message,
        (yield* Effect.flip(Eventually.poll("x", Effect.succeed(1), () => false, { interval: 0 }))).message,
        (yield* Effect.flip(log.waitUntil(() => false, "-1 seconds" as never))).message,
        (yield* Effect.flip(Eventually.holds("x", Effect.succeed(false), Infinity))).message
      ]
      for (const message of messages) assert.match(message, /^cannot wait for .*(timeout|interval) must be a finite duration/)
    }))
})

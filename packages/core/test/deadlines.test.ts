import { assert, describe, it } from "@effect/vitest"
import { Clock, Duration, Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Deadlines from "../src/internal/deadlines.ts"

describe("the deadline watcher of handler runs", () => {
  it.effect("each run expires at its own start plus the bound, in order; a withdrawn run never does", () =>
    Effect.scoped(Effect.gen(function*() {
      const clock = yield* Clock.Clock
      const deadlines = yield* Deadlines.make(Duration.seconds(1), clock)
      const expired: Array<string> = []
      const at = (name: string) => () => expired.push(`${name}@${clock.currentTimeMillisUnsafe()}`)
      deadlines.add(clock.currentTimeMillisUnsafe(), at("a"))
      yield* TestClock.adjust("300 millis")
      const b = deadlines.add(clock.currentTimeMillisUnsafe(), at("b"))
      yield* TestClock.adjust("200 millis")
      deadlines.add(clock.currentTimeMillisUnsafe(), at("c"))
      deadlines.withdraw(b)
      yield* TestClock.adjust("499 millis")
      assert.deepStrictEqual(expired, [], "nothing before its bound")
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(expired, ["a@1000"])
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(expired, ["a@1000", "c@1500"], "b was withdrawn")
    })))

  it.effect("an idle watcher wakes for a new run, and withdrawn runs do not pile up", () =>
    Effect.scoped(Effect.gen(function*() {
      const clock = yield* Clock.Clock
      const deadlines = yield* Deadlines.make(Duration.millis(100), clock)
      let expired = 0
      // Many runs that end in time, then one that does not, after the watcher has been idle.
      for (let i = 0; i < 5000; i++) deadlines.withdraw(deadlines.add(clock.currentTimeMillisUnsafe(), () => expired++))
      yield* TestClock.adjust("1 second")
      deadlines.add(clock.currentTimeMillisUnsafe(), () => expired++)
      yield* TestClock.adjust("99 millis")
      assert.strictEqual(expired, 0)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(expired, 1)
    })))

  it("an infinite bound watches nothing", () => {
    assert.strictEqual(Deadlines.none.add(0, () => undefined), undefined)
  })
})

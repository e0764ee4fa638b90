import { assert, describe, it } from "@effect/vitest"
import { Retry } from "@jetworker/core"
import { Duration, Effect } from "effect"

/** The options as a configuration file could give them (a cast string, a NaN from `Number(...)`). */
const exponential = (options: Record<string, unknown>) => Retry.exponential(options as Retry.ExponentialOptions)

const problemsOf = (options: Record<string, unknown>) => Retry.validate(exponential(options))

describe("Retry options", () => {
  it.effect("inProcessMaxDelay must be finite and not negative; NaN is not quietly zero", () =>
    Effect.sync(() => {
      for (const [value, shown] of [["-1 seconds", "-1s"], [-5, "-5"], [Number.NaN, "NaN"], [[Number.NaN, 0], "NaN"]] as const) {
        const problems = problemsOf({ inProcessMaxDelay: value })
        assert.deepStrictEqual(problems.map((p) => p.option), ["retry.inProcessMaxDelay"], `inProcessMaxDelay ${String(value)}`)
        assert.include(problems[0]!.problem, `got `)
        assert.include(problems[0]!.problem, shown)
      }
      // Zero stays accepted: no delay is short enough, every retry is a nak.
      assert.deepStrictEqual(problemsOf({ inProcessMaxDelay: 0 }), [])
      assert.deepStrictEqual(problemsOf({ inProcessMaxDelay: "250 millis" }), [])
    }))

  it.effect("NaN base or cap is reported with the value got, not turned into zero", () =>
    Effect.sync(() => {
      const base = problemsOf({ base: Number.NaN })
      assert.deepStrictEqual(base.map((p) => p.option), ["retry.base"])
      assert.include(base[0]!.problem, "got NaN")
      const cap = problemsOf({ cap: { seconds: Number.NaN } })
      assert.deepStrictEqual(cap.map((p) => p.option), ["retry.cap"])
      assert.include(cap[0]!.problem, "got")
      assert.include(cap[0]!.problem, "NaN")
    }))

  it.effect("an unparsable duration string does not throw from exponential; validate reports it with the value", () =>
    Effect.sync(() => {
      let policy: Retry.RetryPolicy | undefined
      assert.doesNotThrow(() => {
        policy = exponential({ base: "5 secs", cap: "a minute", inProcessMaxDelay: "1 sec" })
      })
      const problems = Retry.validate(policy!)
      assert.deepStrictEqual(problems.map((p) => p.option), ["retry.base", "retry.cap", "retry.inProcessMaxDelay"])
      assert.include(problems[0]!.problem, "got \"5 secs\"")
      assert.include(problems[1]!.problem, "got \"a minute\"")
      assert.include(problems[2]!.problem, "got \"1 sec\"")
    }))

  it.effect("duration problems name the value got", () =>
    Effect.sync(() => {
      assert.include(problemsOf({ base: 0 })[0]!.problem, "got 0")
      assert.include(problemsOf({ cap: Duration.infinity })[0]!.problem, "got Infinity")
      assert.include(problemsOf({ inProcessMaxDelay: Duration.infinity })[0]!.problem, "got Infinity")
      assert.include(problemsOf({ base: "2 seconds", cap: "1 second" })[0]!.problem, "got 1s")
    }))

  it.effect("a policy with an invalid input, once a field is replaced by a valid one, is valid again", () =>
    Effect.sync(() => {
      const bad = exponential({ base: "5 secs" })
      assert.deepStrictEqual(Retry.validate({ ...bad, base: Duration.millis(100) }), [])
    }))
})

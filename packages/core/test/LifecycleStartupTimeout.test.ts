import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { Cause, Duration, Effect, Exit, Result } from "effect"

const budget = Result.getOrThrow(Lifecycle.makeBudget())

/** The typed failure of `makeManaged` with `startupTimeout`, or a description of what else happened. */
const refusal = (startupTimeout: Duration.Input) =>
  Effect.gen(function*() {
    const exit = yield* Effect.exit(Effect.suspend(() => Lifecycle.makeManaged({ budget, startupTimeout })))
    if (Exit.isSuccess(exit)) return `accepted, start-up ends at ${exit.value.startupEndsAt}`
    const failure = Cause.findErrorOption(exit.cause)
    return failure._tag === "Some" ? failure.value : `not a typed failure: ${Cause.pretty(exit.cause)}`
  })

describe("Lifecycle.makeManaged startupTimeout", () => {
  it.effect("a startupTimeout that is not a duration above zero is a typed failure naming the option and the value, never a throw", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [Duration.Input, string]> = [
        ["banana" as Duration.Input, `"banana"`],
        [Number.NaN, "NaN"],
        [{ seconds: Number.NaN }, "{ seconds: NaN }"],
        ["-5 seconds", `"-5 seconds"`],
        [0, "0"]
      ]
      for (const [input, shown] of cases) {
        const error = yield* refusal(input)
        assert.instanceOf(error, Lifecycle.InvalidStartupTimeout, String(error))
        if (!(error instanceof Lifecycle.InvalidStartupTimeout)) continue
        assert.strictEqual(
          error.message,
          `startupTimeout must be a duration above zero such as "60 seconds" (infinity: no bound), got ${shown}`
        )
      }
    }))

  it.effect("a finite startupTimeout bounds start-up; an infinite one is no bound", () =>
    Effect.gen(function*() {
      const finite = yield* Lifecycle.makeManaged({ budget, startupTimeout: "3 seconds" })
      assert.strictEqual(finite.startupEndsAt, 3_000)
      assert.strictEqual(finite.startupDeadline(), 3_000)
      const unbounded = yield* Lifecycle.makeManaged({ budget, startupTimeout: Duration.infinity })
      assert.strictEqual(unbounded.startupEndsAt, Number.POSITIVE_INFINITY)
    }))
})

describe("Lifecycle.makeBudget", () => {
  it("a NaN share is refused, naming it, not read as 0", () => {
    const budget = Lifecycle.makeBudget({ readinessGrace: Number.NaN })
    assert.isTrue(Result.isFailure(budget), String(budget))
    if (Result.isSuccess(budget)) return
    assert.deepStrictEqual(budget.failure.problems, ["readinessGrace must be a finite duration, got NaN"])
  })
})

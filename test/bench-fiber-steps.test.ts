/**
 * The benchmarks' count of the Effect runtime's steps (`bench/fiberSteps.ts`): every step of
 * every fiber the counted effect runs, and nothing once the count is over. Pure logic over the
 * runtime's own hook; no server involved.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Tracer } from "effect"
import { counted } from "../bench/fiberSteps.ts"

/** `n` steps that each continue the last one's value. */
const chain = (n: number): Effect.Effect<number> => {
  let effect: Effect.Effect<number> = Effect.sync(() => 0)
  for (let i = 0; i < n; i++) effect = Effect.flatMap(effect, (value) => Effect.sync(() => value + 1))
  return effect
}

describe("bench fiberSteps", () => {
  it.effect("counts each step of the fiber, in proportion to the work", () =>
    Effect.gen(function*() {
      const [ten, tenSteps] = yield* counted(chain(10))
      const [thousand, thousandSteps] = yield* counted(chain(1000))
      assert.strictEqual(ten, 10)
      assert.strictEqual(thousand, 1000)
      // Each link is a flatMap, its sync and the value passed on: at least two steps.
      assert.isAtLeast(tenSteps, 20)
      assert.isAtLeast(thousandSteps, 2000)
      // The count's own steps are a constant: the difference is the 990 links.
      const perLink = (thousandSteps - tenSteps) / 990
      assert.isAtLeast(perLink, 2)
      assert.isAtMost(perLink, 4)
    }))

  it.effect("counts the steps of the fibers the effect forks, and none after it ends", () =>
    Effect.gen(function*() {
      const [, alone] = yield* counted(chain(500))
      const [, withChild] = yield* counted(Effect.flatMap(Effect.forkChild(chain(500)), Fiber.join))
      // The child's 500 links are counted once in each: on its own fiber here, inline there.
      assert.isAtLeast(withChild, alone)
      // Once the count is over, the hook is gone: fibers step without it.
      assert.isUndefined(Tracer.nativeTracer.context)
    }))

  it.effect("refuses a second count while one runs", () =>
    Effect.gen(function*() {
      const exit = yield* Effect.exit(counted(counted(Effect.void)))
      assert.isTrue(Exit.hasDies(exit))
      // The first count ended and released the hook: a new one runs.
      const [, steps] = yield* counted(chain(10))
      assert.isAbove(steps, 0)
    }))
})

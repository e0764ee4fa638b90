import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { Duration, Effect, Layer, Result } from "effect"

const managed = () => Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "60 seconds" })

const problem = (shown: string) =>
  `Lifecycle.resource(db): checkInterval must be a positive, finite duration such as "5 seconds", got ${shown}`

// Values effect's own parsing would throw on, read as 0, or accept with a NaN part read as 0.
const bad: ReadonlyArray<readonly [Duration.Input, string]> = [
  ["banana" as Duration.Input, `"banana"`],
  [Number.NaN, "NaN"],
  [{ seconds: 5, milliseconds: Number.NaN }, "{ seconds: 5, milliseconds: NaN }"],
  [0, "0"],
  ["-5 seconds", `"-5 seconds"`],
  [Duration.infinity, "Infinity"]
]

describe("Lifecycle.resource: checkInterval", () => {
  it.effect("a checkInterval that is not a positive, finite duration fails the layer with InvalidCheckInterval naming the resource, the option and the value, before the resource is built", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      for (const [checkInterval, shown] of bad) {
        let built = 0
        const layer = Layer.effectDiscard(Effect.sync(() => void built++))
        const error = yield* Layer.build(Lifecycle.resource("db", layer, { check: Effect.void, checkInterval })).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.scoped,
          Effect.flip
        )
        assert.instanceOf(error, Lifecycle.InvalidCheckInterval, shown)
        assert.strictEqual(error._tag, "InvalidCheckInterval")
        assert.strictEqual(error.message, problem(shown))
        assert.strictEqual(built, 0, `${shown}: nothing built`)
      }
    }))

  it.effect("refused also without a worker's lifecycle (a test, a script): the same value fails wherever it runs", () =>
    Effect.gen(function*() {
      const error = yield* Layer.build(Lifecycle.resource("db", Layer.empty, { check: Effect.void, checkInterval: "soon" as Duration.Input })).pipe(
        Effect.scoped,
        Effect.flip
      )
      assert.strictEqual(error.message, problem(`"soon"`))
    }))

  it.effect("a good checkInterval, or none, builds the resource", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      const good: ReadonlyArray<Duration.Input | undefined> = [undefined, "50 millis", Duration.seconds(1)]
      for (const checkInterval of good) {
        yield* Layer.build(Lifecycle.resource("db", Layer.empty, { check: Effect.void, checkInterval })).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.scoped
        )
      }
    }))
})

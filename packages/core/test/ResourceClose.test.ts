/**
 * Closing the worker's resources (`Lifecycle.resource`) within the close share: one that hangs
 * (a pool waiting on a black-holed socket) must be named by its own `timeout` line and must not
 * take the others' time, so that they still close (NATS drained) inside the share.
 */
import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { Context, Duration, Effect, Exit, Fiber, Layer, Logger, Result, Scope } from "effect"
import { TestClock } from "effect/testing"

const managed = Effect.gen(function*() {
  const budget = Result.getOrThrow(Lifecycle.makeBudget())
  return yield* Lifecycle.makeManaged({ budget, startupTimeout: "10 seconds" })
})

const collecting = () => {
  const lines: Array<Readonly<Record<string, unknown>>> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push(entry.annotations)
  })
  return { lines, layer: Logger.layer([logger]) }
}

class First extends Context.Service<First, { readonly name: string }>()("test/First") {}
class Second extends Context.Service<Second, { readonly name: string }>()("test/Second") {}

describe("Lifecycle.resource: closing within the close share", () => {
  it.effect("a resource whose close hangs is cut at its part of the share and named; the resource closed after it still closes in time", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed
      const closed: Array<string> = []
      const closeBy: Array<number | undefined> = []
      // Built first, so closed last (like the ledger worker's NATS connection).
      const first = Lifecycle.resource(
        "nats",
        Layer.effect(
          First,
          Effect.as(
            Effect.addFinalizer(() =>
              Effect.gen(function*() {
                closeBy.push(yield* Lifecycle.currentDeadline("close"))
                closed.push("nats")
              })
            ),
            { name: "nats" }
          )
        )
      )
      // Built second (it depends on the first), so closed first; its close never ends.
      const second = Lifecycle.resource(
        "postgres",
        Layer.effect(Second, Effect.as(Effect.addFinalizer(() => Effect.uninterruptible(Effect.never)), { name: "postgres" }))
      )
      const resources = yield* Scope.make()
      yield* Layer.buildWithScope(second.pipe(Layer.provideMerge(first)), resources).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle)
      )
      yield* lifecycle.begin
      const closeStart = Lifecycle.shareEnd(lifecycle.budget, "drain")
      const closeEnd = Lifecycle.shareEnd(lifecycle.budget, "close")
      yield* TestClock.adjust(Duration.millis(closeStart))
      const fiber = yield* Effect.forkChild(
        lifecycle.stage("close", "resources", "close", Scope.close(resources, Exit.void)).pipe(
          Effect.provide(log.layer),
          Effect.provideService(Lifecycle.Lifecycle, lifecycle)
        )
      )
      // Two resources open: the first to close may take half of what is left of the share.
      const half = (closeEnd - closeStart) / 2
      yield* TestClock.adjust(Duration.millis(half - 1))
      assert.deepStrictEqual(closed, [], "postgres is still within its part")
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(yield* Fiber.join(fiber), "completed")
      assert.deepStrictEqual(closed, ["nats"])
      // 50 ms before the resources' stage ends, so that its own line comes first.
      assert.deepStrictEqual(closeBy, [closeEnd - 50], "the last resource may use what is left of the share")
      assert.isTrue(lifecycle.overran(), "a resource overran its part: the shutdown's result is timeout")
      assert.deepStrictEqual(
        log.lines.map((l) => [l.stage, l.target, l.result, l.durationMs]),
        [
          ["close", "postgres", "timeout", half],
          ["close", "nats", "completed", 0],
          ["close", "resources", "completed", half]
        ]
      )
    }))

  it.effect("a stage inside another is bounded by the enclosing stage's end too", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed
      yield* lifecycle.begin
      const drainEnd = Lifecycle.shareEnd(lifecycle.budget, "drain")
      const seen: Array<number | undefined> = []
      // A close-share stage run inside a drain-share stage may not outlive the drain stage.
      const fiber = yield* Effect.forkChild(
        lifecycle.stage(
          "drain",
          "outer",
          "drain",
          Effect.andThen(
            Effect.flatMap(Lifecycle.currentDeadline("close"), (end) => Effect.sync(() => seen.push(end))),
            Effect.asVoid(lifecycle.stage("close", "inner", "close", Effect.uninterruptible(Effect.never)))
          )
        ).pipe(Effect.provide(log.layer), Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      )
      // The inner stage ends 50 ms before the outer one, so that its line is written first.
      yield* TestClock.adjust(Duration.millis(drainEnd - 50))
      assert.strictEqual(yield* Fiber.join(fiber), "completed")
      assert.deepStrictEqual(seen, [drainEnd], "inside the outer stage: its end")
      assert.deepStrictEqual(log.lines.map((l) => [l.target, l.result, l.durationMs]), [
        ["inner", "timeout", drainEnd - 50],
        ["outer", "completed", drainEnd - 50]
      ])
    }))

  it.effect("unmanaged, currentDeadline is undefined and closing bounds nothing", () =>
    Effect.gen(function*() {
      assert.isUndefined(yield* Lifecycle.currentDeadline("close"))
      const scope = yield* Scope.make()
      const closed: Array<string> = []
      yield* Layer.buildWithScope(
        Lifecycle.resource("db", Layer.effectDiscard(Effect.addFinalizer(() => Effect.sync(() => closed.push("db"))))),
        scope
      )
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(closed, ["db"])
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { Duration, Effect, Exit, Fiber, Layer, Logger, Result, Scope } from "effect"
import { TestClock } from "effect/testing"

/** A managed lifecycle with the default budget (25 s: grace 1, drain 18, close 3, telemetry 2, reserve 1). */
const managed = (options: Partial<Lifecycle.ManagedOptions> = {}) =>
  Effect.gen(function*() {
    const budget = Result.getOrThrow(Lifecycle.makeBudget())
    return yield* Lifecycle.makeManaged({ budget, startupTimeout: "10 seconds", ...options })
  })

/** Collects log lines as `{ message, annotations }`. */
const collecting = () => {
  const lines: Array<{ readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]) }
}

describe("Lifecycle", () => {
  it("the budget's drain share is what the other shares leave of the total", () => {
    const budget = Result.getOrThrow(Lifecycle.makeBudget())
    assert.deepStrictEqual(budget, {
      totalMillis: 25_000,
      readinessGraceMillis: 1_000,
      drainMillis: 18_000,
      closeMillis: 3_000,
      telemetryMillis: 2_000,
      reserveMillis: 1_000
    })
    const custom = Result.getOrThrow(Lifecycle.makeBudget({ total: "10 seconds", readinessGrace: "2 seconds", close: "1 second" }))
    assert.strictEqual(custom.drainMillis, 10_000 - 2_000 - 1_000 - 2_000 - 1_000)
  })

  it("shares end one after the other, counted from the start of shutdown", () => {
    const budget = Result.getOrThrow(Lifecycle.makeBudget({ total: "10 seconds" }))
    assert.deepStrictEqual(
      (["readinessGrace", "drain", "close", "telemetry"] as const).map((share) => Lifecycle.shareEnd(budget, share)),
      [1_000, 4_000, 7_000, 9_000]
    )
    assert.isBelow(Lifecycle.shareEnd(budget, "telemetry"), budget.totalMillis, "the reserve is never planned")
  })

  it("a budget without a reserve, without room for the drain or with a non-finite share is refused, naming the problem", () => {
    const noReserve = Lifecycle.makeBudget({ reserve: 0 })
    assert.isTrue(Result.isFailure(noReserve))
    assert.match(Result.isFailure(noReserve) ? noReserve.failure.message : "", /reserve must be above zero/)
    const tooSmall = Lifecycle.makeBudget({ total: "5 seconds" })
    assert.match(Result.isFailure(tooSmall) ? tooSmall.failure.message : "", /leaves no drain share/)
    const infinite = Lifecycle.makeBudget({ close: Duration.infinity })
    assert.match(Result.isFailure(infinite) ? infinite.failure.message : "", /close must be a finite duration/)
  })

  it.effect("before shutdown a stage only runs its effect: no deadline, no log line", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed()
      assert.isUndefined(lifecycle.deadline("drain"))
      const result = yield* lifecycle.stage("drain", "c", "drain", Effect.void).pipe(Effect.provide(log.layer))
      assert.strictEqual(result, "completed")
      assert.strictEqual(log.lines.length, 0)
    }))

  it.effect("the unmanaged lifecycle bounds nothing and logs nothing", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* Lifecycle.Lifecycle
      assert.isFalse(lifecycle.managed)
      assert.isUndefined(lifecycle.deadline("close"))
      assert.isUndefined(lifecycle.startupDeadline())
      const ok = yield* lifecycle.stage("close", "x", "close", Effect.void).pipe(Effect.provide(log.layer))
      const failed = yield* lifecycle.stage("close", "x", "close", Effect.fail("boom")).pipe(Effect.provide(log.layer))
      assert.deepStrictEqual([ok, failed], ["completed", "failed"])
      assert.strictEqual(log.lines.length, 0)
    }))

  it.effect("a stage that ends in time logs one shutdown.stage line with its result and duration", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed()
      assert.isTrue(yield* lifecycle.begin)
      const fiber = yield* Effect.forkChild(
        lifecycle.stage("drain", "ledger", "drain", Effect.sleep("2 seconds")).pipe(Effect.provide(log.layer))
      )
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* Fiber.join(fiber), "completed")
      assert.isFalse(lifecycle.overran())
      assert.deepStrictEqual(log.lines, [{
        message: "shutdown.stage",
        annotations: { stage: "drain", target: "ledger", result: "completed", durationMs: 2_000 }
      }])
    }))

  it.effect("a stage still running at its share's deadline is cut there: result timeout, the shutdown overran", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed()
      yield* lifecycle.begin
      // Uninterruptible and endless: it cannot be stopped, only abandoned.
      const fiber = yield* Effect.forkChild(
        lifecycle.stage("close", "db", "close", Effect.uninterruptible(Effect.never)).pipe(Effect.provide(log.layer))
      )
      yield* TestClock.adjust(Duration.millis(Lifecycle.shareEnd(lifecycle.budget, "close") - 1))
      assert.isUndefined(fiber.pollUnsafe(), "still within the share")
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(yield* Fiber.join(fiber), "timeout")
      assert.isTrue(lifecycle.overran())
      assert.deepStrictEqual(log.lines.map((l) => [l.annotations.stage, l.annotations.result, l.annotations.durationMs]), [
        ["close", "timeout", 22_000]
      ])
    }))

  it.effect("shutdown begins once: deadlines count from the first call", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      yield* TestClock.adjust("5 seconds")
      assert.isTrue(yield* lifecycle.begin)
      yield* TestClock.adjust("3 seconds")
      assert.isFalse(yield* lifecycle.begin)
      assert.strictEqual(lifecycle.startedAt(), 5_000)
      assert.strictEqual(lifecycle.deadline("drain"), 5_000 + 19_000)
    }))

  it.effect("ready only while running with every component up and at least one consumer; never once stopping", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      const scope = yield* Scope.make()
      const nats = yield* lifecycle.component("nats", "dependency").pipe(Scope.provide(scope))
      yield* nats.up
      assert.deepInclude(lifecycle.readiness(), { ready: false, phase: "starting" })
      yield* lifecycle.started
      assert.isFalse(lifecycle.readiness().ready, "no consumer yet")
      const consumer = yield* lifecycle.component("ledger", "consumer").pipe(Scope.provide(scope))
      assert.deepStrictEqual(lifecycle.readiness().components.find((c) => c.name === "ledger"), {
        name: "ledger",
        kind: "consumer",
        up: false,
        reason: "starting"
      })
      yield* consumer.up
      assert.isTrue(lifecycle.readiness().ready)
      yield* nats.down("disconnected")
      assert.isFalse(lifecycle.readiness().ready)
      assert.strictEqual(lifecycle.readiness().components.find((c) => c.name === "nats")?.reason, "disconnected")
      yield* nats.up
      assert.isTrue(lifecycle.readiness().ready)
      yield* lifecycle.begin
      assert.deepInclude(lifecycle.readiness(), { ready: false, phase: "stopping" })
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(lifecycle.readiness().components, [], "components leave with their scope")
    }))

  it.effect("readyWhen started: ready without consumers once start-up is over", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed({ readyWhen: "started" })
      assert.isFalse(lifecycle.readiness().ready)
      yield* lifecycle.started
      assert.isTrue(lifecycle.readiness().ready)
    }))

  it.effect("waitFor runs once when unmanaged", () =>
    Effect.gen(function*() {
      let runs = 0
      const result = yield* Lifecycle.waitFor("db", Effect.suspend(() => {
        runs++
        return Effect.fail("refused")
      })).pipe(Effect.result)
      assert.isTrue(Result.isFailure(result))
      assert.strictEqual(runs, 1)
    }))

  it.effect("waitFor retries a passing failure during start-up, logging each try, until it succeeds", () =>
    Effect.gen(function*() {
      const log = collecting()
      const lifecycle = yield* managed()
      let runs = 0
      const fiber = yield* Effect.forkChild(
        Lifecycle.waitFor("db", Effect.suspend(() => (++runs < 4 ? Effect.fail("refused") : Effect.succeed("up")))).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.provide(log.layer)
        )
      )
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(yield* Fiber.join(fiber), "up")
      assert.strictEqual(runs, 4)
      assert.deepStrictEqual(log.lines.map((l) => [l.message, l.annotations.dependency, l.annotations.attempt]), [
        ["startup.waiting", "db", 1],
        ["startup.waiting", "db", 2],
        ["startup.waiting", "db", 3]
      ])
    }))

  it.effect("waitFor gives up at the start-up deadline, and at once on a failure that will not pass", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed({ startupTimeout: "3 seconds" })
      let runs = 0
      const fiber = yield* Effect.forkChild(
        Lifecycle.waitFor("db", Effect.suspend(() => {
          runs++
          return Effect.fail("refused")
        })).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(Layer.empty), Effect.result)
      )
      yield* TestClock.adjust("1 minute")
      assert.isTrue(Result.isFailure(yield* Fiber.join(fiber)))
      assert.isAbove(runs, 1)
      assert.isBelow(runs, 12, "backoff, not a busy loop")
      let fatal = 0
      const once = yield* Lifecycle.waitFor("db", Effect.suspend(() => {
        fatal++
        return Effect.fail("bad password")
      }), { while: (error) => error !== "bad password" }).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.result)
      assert.isTrue(Result.isFailure(once))
      assert.strictEqual(fatal, 1)
    }))

  it.effect("start-up lasts until the process is first ready: then dependencies are no longer waited for", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      assert.strictEqual(lifecycle.startupDeadline(), 10_000)
      yield* lifecycle.started
      assert.strictEqual(lifecycle.startupDeadline(), 10_000, "built, but no consumer yet")
      const consumer = yield* lifecycle.component("c", "consumer")
      yield* consumer.up
      assert.isTrue(lifecycle.everReady())
      assert.isUndefined(lifecycle.startupDeadline())
      yield* consumer.down("disconnected")
      assert.isUndefined(lifecycle.startupDeadline(), "a later outage is not start-up")
      yield* lifecycle.firstReady
    }))

  it.effect("a resource's checkInterval that is not a positive, finite duration is refused, naming the resource (0 would probe in a hot loop)", () =>
    Effect.gen(function*() {
      const lifecycle = yield* managed()
      for (const checkInterval of [0, "0 millis", Duration.infinity] as const) {
        const exit = yield* Layer.build(Lifecycle.resource("db", Layer.empty, { check: Effect.void, checkInterval })).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.scoped,
          Effect.exit
        )
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "Lifecycle.resource(db): checkInterval must be a positive, finite duration")
      }
    }))
})

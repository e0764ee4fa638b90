/**
 * `Lifecycle.resource`'s periodic dependency check: whatever way a check ends badly (a typed
 * failure, a defect thrown inside it, a rejected promise), the dependency is down, the change is
 * logged once, and the checking goes on for as long as the resource is open.
 */
import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { Effect, Exit, Layer, Logger, Result, Scope } from "effect"
import { TestClock } from "effect/testing"

const managed = Lifecycle.makeManaged({
  budget: Result.getOrThrow(Lifecycle.makeBudget({})),
  startupTimeout: "10 seconds",
  readyWhen: "started"
})

/** Collects log lines as `{ level, message, annotations }`. */
const collecting = () => {
  const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]) }
}

/**
 * Builds resource "db" whose check runs `check(call)` (1-based), probed every 50 ms, under a
 * started managed lifecycle; returns what the test observes.
 */
const setup = (check: (call: number) => Effect.Effect<void, unknown>) =>
  Effect.gen(function*() {
    const lifecycle = yield* managed
    const log = collecting()
    let calls = 0
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Lifecycle.resource("db", Layer.empty, { check: Effect.suspend(() => check(++calls)), checkInterval: "50 millis" }),
      scope
    ).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(log.layer))
    yield* lifecycle.started
    const dbStatus = () => lifecycle.readiness().components.find((c) => c.name === "db")
    return { lifecycle, log, scope, calls: () => calls, dbStatus }
  })

const events = (lines: ReturnType<typeof collecting>["lines"], event: string) =>
  lines.filter((l) => l.annotations.event === event)

describe("Lifecycle.resource", () => {
  it.effect("a check that throws (a defect) takes the dependency down, is logged as dependency.down, and probing goes on", () =>
    Effect.gen(function*() {
      let broken = false
      const t = yield* setup(() =>
        Effect.sync(() => {
          if (broken) throw new Error("connection pool destroyed")
        })
      )
      yield* TestClock.adjust("50 millis")
      assert.strictEqual(t.calls(), 1)
      assert.isTrue(t.lifecycle.readiness().ready)
      broken = true
      yield* TestClock.adjust("50 millis")
      assert.strictEqual(t.calls(), 2)
      assert.isFalse(t.lifecycle.readiness().ready, "a defect in the check is the dependency down")
      assert.include(String(t.dbStatus()?.reason), "connection pool destroyed")
      const downs = events(t.log.lines, "dependency.down")
      assert.strictEqual(downs.length, 1)
      assert.strictEqual(downs[0]!.level, "WARN")
      assert.include(String(downs[0]!.annotations.reason), "connection pool destroyed")
      // The loop survived the defect: it keeps probing, logs the change once, and sees the recovery.
      yield* TestClock.adjust("200 millis")
      assert.strictEqual(t.calls(), 6)
      assert.strictEqual(events(t.log.lines, "dependency.down").length, 1, "one line for the change, not one per failed check")
      broken = false
      yield* TestClock.adjust("50 millis")
      assert.isTrue(t.lifecycle.readiness().ready)
      assert.strictEqual(events(t.log.lines, "dependency.up").length, 1)
      yield* Scope.close(t.scope, Exit.void)
      yield* TestClock.adjust("500 millis")
      assert.strictEqual(t.calls(), 7, "no probe once the resource is closed")
    }))

  it.effect("a check whose promise rejects takes the dependency down, and probing goes on", () =>
    Effect.gen(function*() {
      const t = yield* setup((call) =>
        call === 1 ? Effect.promise(() => Promise.reject(new Error("socket hang up"))) : Effect.void
      )
      yield* TestClock.adjust("50 millis")
      assert.isFalse(t.lifecycle.readiness().ready)
      assert.include(String(events(t.log.lines, "dependency.down")[0]?.annotations.reason), "socket hang up")
      yield* TestClock.adjust("50 millis")
      assert.strictEqual(t.calls(), 2)
      assert.isTrue(t.lifecycle.readiness().ready)
      assert.strictEqual(events(t.log.lines, "dependency.up").length, 1)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("a typed failure still takes the dependency down with its message", () =>
    Effect.gen(function*() {
      const t = yield* setup((call) => (call === 1 ? Effect.fail(new Error("refused")) : Effect.void))
      yield* TestClock.adjust("50 millis")
      assert.isFalse(t.lifecycle.readiness().ready)
      assert.strictEqual(t.dbStatus()?.reason, "refused")
      yield* TestClock.adjust("50 millis")
      assert.isTrue(t.lifecycle.readiness().ready)
      yield* Scope.close(t.scope, Exit.void)
    }))
})

/**
 * BE-JOB-003, the edges of pausing on a dependency that is down (the main path is in
 * test/dependency-pause.test.ts):
 * - a hold however it ends (at `maxHold` or otherwise) leaves the pause state right: once the
 *   dependency is back `jetworker.paused` is 0 and `consumer.resumed` is logged even if no worker
 *   waited at the gate, and a consumer stopped while paused leaves the gauge at 0;
 * - in batch mode the elements held one after another share one `maxHold`: a batch settles within
 *   `maxHold` of its first hold, not n × `maxHold`;
 * - a shutdown ends a hold at once: the held delivery is released `Interrupted` without counting,
 *   and the drain stage completes instead of overrunning;
 * - without an attempt store, a hold ended by a lost lease is not counted as a failed attempt on
 *   the redelivery;
 * - transient failures while the dependencies are up share recent probes: 20 failures within
 *   100 ms cost at most a couple of checks (a probe within 500 ms of one that ended is reused);
 * - `pauseOn` naming no dependency of the process logs a warning (`consumer.pause_on_unknown`)
 *   naming it.
 * In-memory broker, test clock, a dependency whose check reads a flag.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer } from "@jetworker/core"
import { Clock, Data, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { gauge, setup, tags, withBatchConsumer, withConsumer } from "./support/pause.ts"

/** A transient failure that is no outage (a serialization conflict, a busy downstream service). */
class Busy extends Data.TaggedError("Busy")<{ readonly message: string }> {}

describe("pausing on a dependency that is down: edges", () => {
  it.effect("BE-JOB-003: per-key, a hold ended at maxHold: once the dependency is back jetworker.paused is 0 and consumer.resumed is logged; the next outage logs consumer.paused again", () =>
    Effect.gen(function*() {
      // The failure comes 1 s into the run: the intake loop has passed the gate (still open) by then.
      const t = yield* withConsumer(1, {
        name: "keyed",
        concurrency: 2,
        ordering: { perKey: (event) => event.id },
        callAfter: "1 second",
        dependencies: { maxHold: "3 seconds" }
      })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "held")
      assert.strictEqual(yield* gauge("jetworker.paused", "keyed"), 1, "paused while held")
      // The hold ends at maxHold with the database still down: the failure counts.
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 100))
      assert.deepStrictEqual(tags(t.outcomes), ["DeadLettered:AttemptsExhausted"])
      // The database comes back; its next check (every 500 ms) sees it.
      t.db.up = true
      yield* TestClock.adjust("2 seconds")
      assert.isTrue(t.lifecycle.readiness().components.find((c) => c.name === "db")?.up, "db is up on readiness")
      const pausedGauge = yield* gauge("jetworker.paused", "keyed")
      const resumedLines = t.events("consumer.resumed").length
      // The next outage: a second delivery held.
      t.db.up = false
      yield* t.broker.publish(JSON.stringify({ id: "e2" }))
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 2), "second hold")
      const pausedLines = t.events("consumer.paused").length
      t.db.up = true
      yield* t.until(() => t.outcomes.length >= 2, 100)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
      assert.deepStrictEqual(
        { pausedGauge, resumedLines, pausedLines },
        { pausedGauge: 0, resumedLines: 1, pausedLines: 2 },
        "paused gauge after the dependency came back, consumer.resumed lines by then, consumer.paused lines after a second outage"
      )
    }))

  it.effect("BE-JOB-003: a consumer stopped while paused leaves jetworker.paused at 0, not 1", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { name: "stop-paused", concurrency: 2 })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "held")
      assert.strictEqual(yield* gauge("jetworker.paused", "stop-paused"), 1, "paused while held")
      assert.isTrue(yield* t.stop(t.fiber), "the consumer stopped")
      yield* Scope.close(t.scope, Exit.void)
      assert.deepStrictEqual(tags(t.outcomes), ["Released:Interrupted"])
      assert.strictEqual(yield* gauge("jetworker.held", "stop-paused"), 0, "jetworker.held once stopped")
      assert.strictEqual(yield* gauge("jetworker.paused", "stop-paused"), 0, "jetworker.paused once stopped")
    }))

  it.effect("BE-JOB-003, BE-JOB-007: a batch of 4 failing while the database stays down: every element's failure counts within maxHold of the first hold (not 4 × maxHold)", () =>
    Effect.gen(function*() {
      const t = yield* withBatchConsumer(4, { name: "batch-hold", dependencies: { maxHold: "3 seconds" } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "an element held")
      const firstHold = yield* Clock.currentTimeMillis
      // Every element's outcome, within maxHold (3 s) of the first hold and a step to spare.
      yield* t.until(() => t.outcomes.length >= 4, 300)
      const settledAfterMs = (yield* Clock.currentTimeMillis) - firstHold
      const heldGauge = yield* gauge("jetworker.held", "batch-hold")
      const holds = t.events("delivery.held").length
      const holdsEnded = t.events("delivery.hold_ended").length
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
      assert.deepStrictEqual(
        { outcomes: tags(t.outcomes), heldGauge, holds, holdsEnded, settledInTime: settledAfterMs <= 3_500 },
        { outcomes: Array(4).fill("DeadLettered:AttemptsExhausted"), heldGauge: 0, holds: 1, holdsEnded: 4, settledInTime: true },
        `outcomes, jetworker.held after them, delivery.held and hold_ended lines, all settled within maxHold + 0.5 s of the first hold (took ${settledAfterMs} ms)`
      )
    }))

  it.effect("BE-JOB-003: under a worker's shutdown, a held delivery is released at once (Interrupted, not counted), and the drain stage completes instead of overrunning", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { name: "held-at-shutdown", concurrency: 1 })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "held")
      // The worker's shutdown: the lifecycle begins it, then the program (the consumer) is interrupted.
      yield* t.lifecycle.begin
      const begun = yield* Clock.currentTimeMillis
      assert.isTrue(yield* t.stop(t.fiber), "the consumer stopped")
      const stoppedAfterMs = (yield* Clock.currentTimeMillis) - begun
      const drainStage = t.log.lines.find((l) => l.message === "shutdown.stage" && l.annotations.stage === "drain")
      yield* Scope.close(t.scope, Exit.void)
      assert.deepStrictEqual(
        { outcomes: tags(t.outcomes), overran: t.lifecycle.overran(), drain: drainStage?.annotations.result, quick: stoppedAfterMs < 2_000 },
        { outcomes: ["Released:Interrupted"], overran: false, drain: "completed", quick: true },
        `outcome, lifecycle overran, drain stage result, stopped within 2 s (took ${stoppedAfterMs} ms)`
      )
    }))

  it.effect("BE-JOB-003: without an attempt store, a hold ended by a lost lease is not counted: the redelivery runs the handler again and commits once the database is back, no dead letter", () =>
    Effect.gen(function*() {
      // Every lease extension fails, as while NATS, the connection the lease lives on, is down.
      const t = yield* withConsumer(1, { name: "lease-lost-held", concurrency: 1, faults: { extendFails: 1 } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "held")
      // No extension is confirmed: the lease is lost at 90% of 30 s, which ends the hold.
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 400), "the hold ended")
      assert.deepStrictEqual(tags(t.outcomes), ["Released:LeaseLost"])
      // The database is back before the redelivery (due 30 s after the delivery).
      t.db.up = true
      yield* t.until(() => t.outcomes.length >= 2, 400)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
      assert.deepStrictEqual(
        { outcomes: tags(t.outcomes), runs: t.runs.map((r) => `${r.id}:${r.up ? "up" : "down"}`), deadLetters: t.broker.deadLetters().length },
        { outcomes: ["Released:LeaseLost", "Committed"], runs: ["e1:down", "e1:up"], deadLetters: 0 },
        "outcomes, handler runs, dead letters"
      )
    }))

  it.effect("BE-JOB-003: 20 transient failures with the database up, within 100 ms, share probes: at most a couple of checks, not one per failure", () =>
    Effect.gen(function*() {
      const t = yield* setup(20)
      const checksBefore = t.db.checks
      const fiber = yield* t.run(Consumer.make({
        ...t.base("busy", 1),
        prefetch: 1,
        handle: () => Effect.fail(new Busy({ message: "try again" })),
        classify: { Busy: "transient" }
      }))
      // Less than a check interval (500 ms): no periodic check runs meanwhile.
      yield* t.until(() => t.outcomes.length >= 20, 1)
      const failures = t.outcomes.length
      const checks = t.db.checks - checksBefore
      yield* Fiber.interrupt(fiber)
      yield* Scope.close(t.scope, Exit.void)
      assert.strictEqual(failures, 20)
      assert.isAtMost(checks, 2, `${checks} checks of the database for ${failures} failures while it was up`)
    }))

  it.effect("BE-JOB-003: pauseOn [\"postgres\"] where the dependency is \"db\": one WARN line at start says the name matches no dependency of the process, naming those it has, rather than silently never pausing", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { name: "typo", concurrency: 1, dependencies: { pauseOn: ["postgres"] } })
      yield* t.until(() => t.events("consumer.pause_on_unknown").length > 0, 50)
      const warned = t.events("consumer.pause_on_unknown")
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
      assert.lengthOf(warned, 1)
      assert.strictEqual(warned[0]!.level, "WARN")
      assert.include(String(warned[0]!.message), `dependencies.pauseOn names "postgres", which is no dependency of this process (its dependencies: db)`)
    }))
})

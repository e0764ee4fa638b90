/**
 * The JetStream intake's buffered messages while the consumer is paused on a dependency
 * (BE-JOB-003, INT-NATS-002): messages pulled before the pause wait in the intake's buffer, and
 * their ack wait runs there. The intake keeps their leases while the pause lasts, at most
 * `dependencies.maxHold`, so a pause several ack waits long hands none of them back to the
 * broker: each is handled once, on its first delivery, once the dependency is back. Past
 * `maxHold` it stops, and they come back as the broker redelivers them. Before the intake kept
 * them, the first case handled four of the five messages twice (on delivery 1 after the pause,
 * past their lease, their acks withheld, and on delivery 2). The keeping starts again with each
 * pause, so a second pause after a resumption hands nothing back either.
 *
 * When the pause ends, the intake renews each buffered message's lease once. Before, each started
 * with up to half of its lease spent (the extensions come a third of the way through one), and
 * nothing extended it while it waited for a handler: a consumer within the README's rule (prefetch
 * × handler time below the ack wait; here prefetch 1 and a handler of 75% of the ack wait, which
 * handles each message once when there is no pause) took a buffered message past its lease after
 * a pause, released it `LeaseLost`, and ran it on its redelivery. Where the pause ends in the
 * extension cycle varies, so that case runs four consumers whose cycles are staggered by 170 ms.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Lifecycle, type Outcome, Retry } from "@jetworker/core"
import { Eventually, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Logger } from "effect"
import { job, jobsOf, pausedLifecycle, runPaused } from "./support/pausedIntake.ts"
import { NatsLive } from "./support/services.ts"

/**
 * A pause of three ack waits over jobs `first` to `first + 4`: the database goes down (the pause
 * begins, with a worker at the gate or with the first message held), the jobs are published and
 * wait in the intake's buffer, and the database comes back three ack waits after all five are
 * delivered (the window the tests watch, not a wait for a result).
 */
const pauseOverFive = (test: TestStream.TestStream, db: { up: boolean }, first = 1) =>
  Effect.gen(function*() {
    db.up = false
    for (let n = first; n < first + 5; n++) yield* test.publish("a", job(n), `j${n}`)
    yield* Eventually.holds("all five delivered", Effect.map(test.info, (i) => i.num_ack_pending === 5), "10 seconds")
    yield* Effect.sleep("6 seconds")
    db.up = true
  })

/** One run of a handler of `spentLeases`: its consumer, message, delivery, and whether the database was up. */
interface Run {
  readonly stream: number
  readonly n: number
  readonly deliveryCount: number
  readonly up: boolean
}

/**
 * `pausedLifecycle` (checked every 100 ms) with `count` ready consumers, each of its own stream
 * (ack wait 2 s), concurrency 1 and prefetch 1, whose handler calls the database and then works
 * for 1.5 s (75% of the ack wait).
 */
const spentLeases = (count: number) =>
  Effect.gen(function*() {
    const { lifecycle, db, query } = yield* pausedLifecycle("100 millis")
    const runs: Array<Run> = []
    const outcomes: Array<Outcome.Outcome & { readonly stream: number }> = []
    const streams: Array<TestStream.TestStream> = []
    const fibers: Array<Fiber.Fiber<unknown, unknown>> = []
    for (let i = 0; i < count; i++) {
      const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
      streams.push(test)
      fibers.push(
        yield* Effect.forkChild(
          Consumer.run(Consumer.make({
            ...jobsOf(test),
            name: `${test.consumer}-${i}`,
            handle: (event) =>
              CurrentDelivery.CurrentDelivery.use((delivery) => {
                runs.push({ stream: i, n: event.data.n, deliveryCount: delivery.deliveryCount, up: db.up })
                return Effect.andThen(query, Effect.sleep("1500 millis"))
              }),
            classify: { DatabaseDown: "transient" },
            retry: Retry.exponential({ attempts: 5, base: "1 second", inProcessRetries: 0 }),
            concurrency: 1,
            prefetch: 1,
            dependencies: { maxHold: "5 minutes" },
            onOutcome: (outcome) => Effect.sync(() => void outcomes.push({ ...outcome, stream: i }))
          })).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(Logger.layer([])))
        )
      )
    }
    yield* Eventually.holds("the consumers ready", Effect.sync(() => lifecycle.readiness().ready), "15 seconds")
    return { db, runs, outcomes, streams, fibers }
  })

/** `spentLeases`' runs and outcomes, for assertion messages. */
const describeAll = (runs: ReadonlyArray<Run>, outcomes: ReadonlyArray<Outcome.Outcome & { readonly stream: number }>) =>
  `runs: ${runs.map((r) => `s${r.stream}:${r.n}@${r.deliveryCount}${r.up ? "" : "(down)"}`).join(", ")}; outcomes: ${
    outcomes.map((o) => `s${o.stream}:${o.message.sequence}@${o.message.deliveryCount}:${o._tag}${"reason" in o ? `/${o.reason}` : ""}`).join(", ")
  }`

describe("the intake's buffered messages during a dependency pause", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("a pause of three ack waits hands no buffered message back: each is handled once, on its first delivery, after the pause", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { db, handled, outcomes, fiber } = yield* runPaused(test, "5 minutes")
        yield* pauseOverFive(test, db)
        yield* Eventually.holds("all five committed", Effect.sync(() => outcomes.filter((o) => o._tag === "Committed").length === 5), "20 seconds")
        const info = yield* test.info
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Committed", "Committed", "Committed", "Committed"], JSON.stringify(outcomes))
        assert.deepStrictEqual(
          handled.filter((h) => h.up).map((h) => `${h.n}@${h.deliveryCount}`).sort(),
          ["1@1", "2@1", "3@1", "4@1", "5@1"],
          JSON.stringify(handled)
        )
        assert.strictEqual(info.num_redelivered, 0, JSON.stringify(info))
        assert.strictEqual(info.delivered.consumer_seq, 5, `deliveries: ${JSON.stringify(info.delivered)}`)
      }).pipe(Effect.scoped), 60_000)

    it.effect("the leases are kept at most dependencies.maxHold: past it the broker redelivers the buffered messages", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { db, handled, outcomes, fiber } = yield* runPaused(test, "1 second")
        // Three ack waits again, with a hold of half of one.
        yield* pauseOverFive(test, db)
        yield* Eventually.holds("all five committed", Effect.sync(() => new Set(outcomes.filter((o) => o._tag === "Committed").map((o) => o.message.sequence)).size === 5), "20 seconds")
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        const redelivered = handled.filter((h) => h.deliveryCount > 1)
        assert.isAbove(redelivered.length, 0, `no message was delivered again: ${JSON.stringify(handled)}`)
      }).pipe(Effect.scoped), 60_000)

    it.effect("after a resumption, a second pause of three ack waits hands no buffered message back either", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { db, handled, outcomes, fiber } = yield* runPaused(test, "5 minutes")
        for (const first of [1, 6]) {
          yield* pauseOverFive(test, db, first)
          yield* Eventually.holds(
            "committed",
            Effect.sync(() => outcomes.filter((o) => o._tag === "Committed").length === first + 4),
            "20 seconds"
          )
        }
        const info = yield* test.info
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.deepStrictEqual(
          handled.filter((h) => h.up).map((h) => `${h.n}@${h.deliveryCount}`).sort(),
          [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map((n) => `${n}@1`).sort(),
          JSON.stringify(handled)
        )
        assert.strictEqual(info.num_redelivered, 0, JSON.stringify(info))
      }).pipe(Effect.scoped), 90_000)

    it.effect("without a pause, prefetch 1 and a handler of 75% of the ack wait handle each message once, on its first delivery", () =>
      Effect.gen(function*() {
        const { outcomes, runs, streams, fibers } = yield* spentLeases(1)
        const test = streams[0]!
        yield* test.publish("a", job(1), "j1")
        yield* test.publish("a", job(2), "j2")
        yield* Eventually.holds("both committed", Effect.sync(() => outcomes.filter((o) => o._tag === "Committed").length === 2), "20 seconds")
        const info = yield* test.info
        for (const fiber of fibers) yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.deepStrictEqual(runs.map((r) => `${r.n}@${r.deliveryCount}`), ["1@1", "2@1"], describeAll(runs, outcomes))
        assert.strictEqual(info.num_redelivered, 0, JSON.stringify(info))
      }).pipe(Effect.scoped), 90_000)

    it.effect("with the same configuration, after a pause of three ack waits each buffered message runs once, on its first delivery: the pause's end renews their leases", () =>
      Effect.gen(function*() {
        const { db, outcomes, runs, streams, fibers } = yield* spentLeases(4)
        db.up = false
        // Each consumer: message 1 runs, fails, and is held (the pause begins); message 2 waits in
        // the intake's buffer. Staggered so that the consumers' extension cycles differ.
        for (const test of streams) {
          yield* test.publish("a", job(1), "j1")
          yield* test.publish("a", job(2), "j2")
          yield* Effect.sleep("170 millis")
        }
        yield* Eventually.holds(
          "every message delivered",
          Effect.map(Effect.forEach(streams, (test) => test.info), (infos) => infos.every((i) => i.num_ack_pending === 2)),
          "10 seconds"
        )
        // The pause (the window this test watches, not a wait for a result).
        yield* Effect.sleep("6 seconds")
        db.up = true
        yield* Eventually.holds(
          "all committed",
          Effect.sync(() => outcomes.filter((o) => o._tag === "Committed").length === 2 * streams.length),
          "30 seconds"
        )
        const infos = yield* Effect.forEach(streams, (test) => test.info)
        for (const fiber of fibers) yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        const afterPause = runs.filter((r) => r.up).map((r) => `s${r.stream}:${r.n}@${r.deliveryCount}`).sort()
        const expected = streams.flatMap((_, i) => [`s${i}:1@1`, `s${i}:2@1`]).sort()
        assert.deepStrictEqual(afterPause, expected, describeAll(runs, outcomes))
        assert.deepStrictEqual(outcomes.filter((o) => o._tag === "Released").map((o) => `s${o.stream}:${o.message.sequence}`), [], describeAll(runs, outcomes))
        assert.deepStrictEqual(infos.map((i) => i.num_redelivered), streams.map(() => 0), describeAll(runs, outcomes))
      }).pipe(Effect.scoped), 90_000)
  })
})

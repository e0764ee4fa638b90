/**
 * A delivery taken past its lease (INT-NATS-002): with prefetch above concurrency, a message can
 * wait in the JetStream intake's buffer longer than its ack wait while a slow handler runs. Such a
 * delivery may already belong to another consumer, and its ack would be withheld anyway, so the
 * engine releases it (`LeaseLost`, uncounted) without running its handler; the broker's
 * redelivery runs it once. Before, the handler ran on the stale delivery (its ack withheld) and
 * again on the redelivery: each waiting message was handled twice.
 *
 * A batch consumer's elements wait in the buffer the same way, and are released the same way,
 * without the batch handler running on them; before, only single deliveries were, and a batch
 * consumer handled each waiting message twice too. The release is not an attempt, even without an
 * attempt store: under a policy of one attempt the redelivery still runs and commits, where
 * counting it would dead-letter (`AttemptsExhausted`) a message whose handler never ran. And a
 * delivery that waits for its key's turn under per-key ordering is not taken past its lease: the
 * engine extends its lease while it waits and the check counts from the last confirmed extension,
 * so each such message runs once, on its first delivery, and none is released.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, type Outcome, Retry } from "@jetworker/core"
import { Eventually, TestStream } from "@jetworker/testing"
import { type Duration, Effect, Fiber, Logger, Result } from "effect"
import { job, jobsOf, summary } from "./support/pausedIntake.ts"
import { NatsLive } from "./support/services.ts"

/** Options of `runSlowFirst`. */
interface SlowFirst {
  /** How long message 1's handler works. */
  readonly slowFor: Duration.Input
  readonly prefetch: number
  readonly retry?: Retry.RetryPolicy | undefined
  /** Every message under one key of per-key ordering. */
  readonly oneKey?: boolean | undefined
}

/**
 * A consumer of `test` (concurrency 1) whose handler records each run as `n@deliveryCount` in
 * `handled`, and works `slowFor` on message 1 while the others wait (its own lease kept by the
 * engine's extensions); `outcomes` records each outcome.
 */
const runSlowFirst = (test: TestStream.TestStream, options: SlowFirst) =>
  Effect.gen(function*() {
    const handled: Array<string> = []
    const outcomes: Array<Outcome.Outcome> = []
    const fiber = yield* Effect.forkChild(
      Consumer.run(Consumer.make({
        ...jobsOf(test),
        handle: (event) =>
          CurrentDelivery.CurrentDelivery.use((delivery) =>
            Effect.andThen(
              Effect.sync(() => void handled.push(`${event.data.n}@${delivery.deliveryCount}`)),
              event.data.n === 1 ? Effect.sleep(options.slowFor) : Effect.void
            )
          ),
        classify: {},
        retry: options.retry,
        ordering: options.oneKey ? { perKey: () => "one-key", maxQueued: 4, maxQueuedPerKey: 4 } : undefined,
        concurrency: 1,
        prefetch: options.prefetch,
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })).pipe(Effect.provide(Logger.layer([])))
    )
    return { handled, outcomes, fiber }
  })

/**
 * Publishes jobs 1 to 5 and waits until the consumer has none pending or unacked; with `outcomes`,
 * also until all five are committed and acked.
 */
const publishFiveAndSettle = (test: TestStream.TestStream, outcomes?: ReadonlyArray<Outcome.Outcome>) =>
  Effect.gen(function*() {
    for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
    yield* Eventually.holds(
      outcomes === undefined ? "all five settled for good" : "all five committed and acked",
      Effect.map(test.info, (info) =>
        info.num_ack_pending === 0 && info.num_pending === 0 &&
        (outcomes === undefined ||
          new Set(outcomes.filter((o) => o._tag === "Committed" && o.confirmed).map((o) => o.message.sequence)).size === 5)),
      "30 seconds"
    )
  })

/** Asserts that each of messages 1 to 5 ran once (`handled` holds one entry per run, starting `<n>`). */
const assertEachRanOnce = (handled: ReadonlyArray<string>, outcomes: ReadonlyArray<Outcome.Outcome>) => {
  const runs = (n: number) => handled.filter((h) => h === `${n}` || h.startsWith(`${n}@`))
  for (let n = 1; n <= 5; n++) {
    assert.lengthOf(runs(n), 1, `message ${n} handled ${runs(n).length} times; handled: ${handled.join(", ")}; outcomes: ${summary(outcomes)}`)
  }
  // Every committed delivery was acked: none ran past its lease.
  for (const o of outcomes.filter((o) => o._tag === "Committed")) assert.isTrue(o.confirmed, JSON.stringify(o))
}

describe("a delivery taken past its lease", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("is released LeaseLost without running its handler, and its redelivery runs it once", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        // The first message's handler outlasts the others' leases while they wait in the buffer.
        const { handled, outcomes, fiber } = yield* runSlowFirst(test, { slowFor: "3 seconds", prefetch: 4 })
        yield* publishFiveAndSettle(test, outcomes)
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assertEachRanOnce(handled, outcomes)
        const released = outcomes.filter((o) => o._tag === "Released")
        assert.isAbove(released.length, 0, "no delivery was taken past its lease: the test did not make the case")
        for (const o of released) {
          assert.strictEqual(o._tag === "Released" && o.reason, "LeaseLost", JSON.stringify(o))
          assert.strictEqual(o._tag === "Released" && o.error?.tag, "LeaseLost", JSON.stringify(o))
        }
        assert.lengthOf(outcomes.filter((o) => o._tag === "Committed"), 5, JSON.stringify(outcomes))
      }).pipe(Effect.scoped), 60_000)

    it.effect("a batch element is released LeaseLost without running the batch handler on it, and its redelivery runs it once", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const handled: Array<string> = []
        const outcomes: Array<Outcome.Outcome> = []
        const fiber = yield* Effect.forkChild(
          Consumer.run(Consumer.makeBatch({
            ...jobsOf(test),
            // Batches of one, one at a time, four more waiting in the intake's buffer: as the
            // single consumer of the first case.
            batch: { maxSize: 1, maxWait: "10 millis" },
            concurrency: 1,
            prefetch: 4,
            // The first message's batch outlasts the others' leases while they wait in the buffer
            // (its own lease is kept by the engine's extensions).
            handleBatch: (events) =>
              Effect.andThen(
                Effect.sync(() => {
                  for (const event of events) handled.push(`${event.data.n}`)
                }),
                Effect.as(events.some((e) => e.data.n === 1) ? Effect.sleep("3 seconds") : Effect.void, events.map(() => Result.succeed(undefined)))
              ),
            classify: {},
            onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
          })).pipe(Effect.provide(Logger.layer([])))
        )
        yield* publishFiveAndSettle(test, outcomes)
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assertEachRanOnce(handled, outcomes)
      }).pipe(Effect.scoped), 60_000)

    it.effect("without an attempt store its release spends no attempt: with one attempt, each redelivery still runs and commits", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { outcomes, fiber } = yield* runSlowFirst(test, {
          slowFor: "3 seconds",
          prefetch: 4,
          retry: Retry.exponential({ attempts: 1, base: "1 second", inProcessRetries: 0 })
        })
        yield* publishFiveAndSettle(test)
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.isAbove(outcomes.filter((o) => o._tag === "Released").length, 0, `no delivery was taken past its lease: ${summary(outcomes)}`)
        assert.deepStrictEqual(outcomes.filter((o) => o._tag === "DeadLettered").map((o) => o.message.sequence), [], summary(outcomes))
        assert.strictEqual(new Set(outcomes.filter((o) => o._tag === "Committed").map((o) => o.message.sequence)).size, 5, summary(outcomes))
      }).pipe(Effect.scoped), 60_000)

    it.effect("deliveries that waited three ack waits for their key's turn keep their leases: they run once each, on their first delivery", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { handled, outcomes, fiber } = yield* runSlowFirst(test, { slowFor: "6 seconds", prefetch: 1, oneKey: true })
        yield* publishFiveAndSettle(test)
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.deepStrictEqual(handled, ["1@1", "2@1", "3@1", "4@1", "5@1"], summary(outcomes))
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Committed", "Committed", "Committed", "Committed"], summary(outcomes))
      }).pipe(Effect.scoped), 60_000)
  })
})

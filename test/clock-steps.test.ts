/**
 * Leases and handler timeouts across a step of the wall clock (an NTP step, a VM resumed after a
 * pause, an operator's `date -s`), against the real NATS: the server times the ack wait on its own
 * monotonic timers, so the engine must time what it owes the server the same way (BE-JOB-006).
 * The consumer runs under a `Clock` whose wall time the test moves while the handler runs; its
 * monotonic time and its sleeps are the real ones.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Lease, type Outcome } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, DateTime, Duration, Effect, Fiber, Schema } from "effect"
import { watchAcks } from "./support/acks.ts"
import { NatsLive } from "./support/services.ts"

const Job = Schema.Struct({ id: Schema.String, work: Schema.Number })

/** The live clock, with a wall time the test can step by `offset` milliseconds. */
const steppedClock = () => {
  const live = Clock.Clock.defaultValue()
  const state = { offset: 0 }
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: () => live.currentTimeMillisUnsafe() + state.offset,
    currentTimeMillis: Effect.sync(() => live.currentTimeMillisUnsafe() + state.offset),
    currentTimeNanosUnsafe: () => live.currentTimeNanosUnsafe() + BigInt(state.offset) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => live.currentTimeNanosUnsafe() + BigInt(state.offset) * 1_000_000n),
    monotonicTimeNanosUnsafe: () => live.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: live.monotonicTimeNanos,
    sleep: (duration) => live.sleep(duration)
  }
  return { clock, step: (millis: number) => Effect.sync(() => (state.offset += millis)) }
}

/**
 * One message through a consumer whose wall clock steps by `stepMillis` once its handler has
 * started; the handler's first run works `work` ms (a later run, none), then passes
 * `Lease.ensure` and does its irreversible step. Returns the steps done (delivery count and
 * run), the outcomes and the acks seen on the wire.
 */
const runAcrossStep = (options: {
  readonly stepMillis: number
  readonly work: number
  readonly ackWait: Duration.Input
  readonly handlerTimeout?: Duration.Input
}) =>
  Effect.gen(function*() {
    const stream = yield* TestStream.make({ ackWait: options.ackWait })
    const acks = yield* watchAcks(stream.stream, stream.consumer)
    const { clock, step } = steppedClock()
    const steps: Array<string> = []
    const log = yield* OutcomeLog.make
    let runs = 0
    const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
      name: stream.consumer,
      source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
      schema: Job,
      metadata: (job) => ({ id: job.id, time: DateTime.makeUnsafe(0) }),
      classify: {},
      // Room for a redelivery to run beside the first delivery, as on a second worker.
      concurrency: 2,
      ...(options.handlerTimeout === undefined ? {} : { handlerTimeout: options.handlerTimeout }),
      handle: (job) =>
        Effect.gen(function*() {
          // The first run steps the clock and does the work; any later run finishes at once.
          const run = ++runs
          if (run === 1) yield* step(options.stepMillis)
          yield* Effect.sleep(run === 1 ? job.work : 0)
          yield* Lease.ensure
          const delivery = yield* CurrentDelivery.CurrentDelivery
          steps.push(`${job.id}#${delivery.deliveryCount}/run${run}`)
        }),
      onOutcome: log.record
    })).pipe(Effect.provideService(Clock.Clock, clock)))
    yield* stream.publish("a", JSON.stringify({ id: "job", work: options.work }), "job")
    yield* Eventually.holds(
      "the message committed and settled on the server",
      Effect.zipWith(
        stream.info,
        log.all,
        (info, all: ReadonlyArray<Outcome.Outcome>) =>
          info.num_ack_pending === 0 && info.num_pending === 0 && all.some((o) => o._tag === "Committed")
      ),
      "30 seconds"
    )
    yield* Fiber.interrupt(fiber)
    const outcomes = yield* log.all
    return { steps, first: outcomes[0]!, outcomes, acks }
  })

describe("wall-clock steps (BE-JOB-006)", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-006: the wall clock stepping back an hour while a handler runs: its lease is still extended before the server's ack wait runs out, so the server never hands the message out again and the irreversible step runs once", () =>
      Effect.gen(function*() {
        // Ack wait 2 s, 3 s of work: only extensions keep the message with its first delivery.
        const { acks, outcomes, steps } = yield* runAcrossStep({ stepMillis: -3_600_000, work: 3_000, ackWait: "2 seconds" })
        assert.deepStrictEqual(steps, ["job#1/run1"], `the irreversible step once: ${steps.join(", ")}; outcomes ${JSON.stringify(outcomes)}`)
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
        assert.isTrue(acks.some((ack) => ack.deliveryCount === 1 && ack.body.startsWith("+WPI")), "extended")
      }))

    it.effect("BE-JOB-006: the wall clock stepping forward an hour while a handler runs: the lease is not taken as lost, the handler is not cut, and its delivery is committed and acked", () =>
      Effect.gen(function*() {
        const { first, steps } = yield* runAcrossStep({ stepMillis: 3_600_000, work: 500, ackWait: "2 seconds" })
        assert.deepStrictEqual(steps, ["job#1/run1"])
        assert.strictEqual(first._tag, "Committed", JSON.stringify(first))
        assert.isTrue(first._tag === "Committed" && first.ackWithheld === undefined && first.confirmed, JSON.stringify(first))
      }))

    it.effect("handlerTimeout across the wall clock stepping back an hour: the run is still cut when its time is up", () =>
      Effect.gen(function*() {
        // 3 s of work against a 1 s bound; the ack wait (30 s) plays no part.
        const { outcomes, steps } = yield* runAcrossStep({ stepMillis: -3_600_000, work: 3_000, ackWait: "30 seconds", handlerTimeout: "1 second" })
        // The first run is cut at 1 s; a second run (a retry) does the step.
        assert.strictEqual(steps.length, 1, `one step: ${steps.join(", ")}; outcomes ${JSON.stringify(outcomes)}`)
        assert.notInclude(steps[0], "/run1", `the first run was cut before its step: ${steps.join(", ")}`)
      }))
  })
})

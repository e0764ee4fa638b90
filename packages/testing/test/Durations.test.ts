import { assert, describe, it } from "@effect/vitest"
import type { Outcome } from "@jetworker/core"
import { Cause, Deferred, Duration, Effect, Exit, type Scope } from "effect"
import { fileURLToPath } from "node:url"
import { ChildWorker, Eventually, InMemoryBroker, NatsServer, OutcomeLog } from "../src/index.ts"

const ticker = fileURLToPath(new URL("./fixtures/ticker.ts", import.meta.url))

const banana = "banana" as Duration.Input

/** The typed failure of `effect`, or a description of what else happened (a success, a defect). */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const exit = yield* Effect.exit(Effect.suspend(() => effect))
    if (Exit.isSuccess(exit)) return `succeeded with ${String(exit.value)}`
    const failure = Cause.findErrorOption(exit.cause)
    return failure._tag === "Some" ? failure.value : `not a typed failure: ${Cause.pretty(exit.cause)}`
  })

/** The bad bounds each wait refuses, and how its message shows them. */
const badBounds: ReadonlyArray<readonly [Duration.Input, string]> = [
  [banana, `"banana"`],
  [Number.NaN, "NaN"],
  [{ seconds: Number.NaN }, "{ seconds: NaN }"],
  ["-1 second", `"-1 second"`],
  [Duration.infinity, "Infinity"]
]

describe("duration options of the test harness", () => {
  it.effect("Eventually's waits fail with a WaitTimeout naming a bound that is not a finite duration, instead of dying or waiting for ever", () =>
    Effect.gen(function*() {
      const signal = yield* Deferred.make<void>()
      for (const [bound, shown] of badBounds) {
        const timeout = `cannot wait for the thing: timeout must be a finite duration such as "15 seconds", 0 or more, got ${shown}`
        for (
          const wait of [
            Eventually.holds("the thing", Effect.succeed(true), bound),
            Eventually.poll("the thing", Effect.succeed(1), () => true, { timeout: bound }),
            Eventually.deferred("the thing", signal, bound)
          ]
        ) {
          const error = yield* failureOf(wait)
          assert.instanceOf(error, Eventually.WaitTimeout, String(error))
          assert.strictEqual((error as Eventually.WaitTimeout).message, timeout)
        }
      }
      // The interval too; 0 would probe in a hot loop.
      for (const [interval, shown] of [...badBounds, [0, "0"] as const]) {
        const error = yield* failureOf(Eventually.poll("the thing", Effect.succeed(1), () => true, { interval }))
        assert.instanceOf(error, Eventually.WaitTimeout, String(error))
        assert.strictEqual(
          (error as Eventually.WaitTimeout).message,
          `cannot wait for the thing: interval must be a finite duration above zero such as "20 millis", got ${shown}`
        )
      }
      // A zero bound is a bound: it runs out.
      const zero = yield* failureOf(Eventually.holds("the thing", Effect.succeed(false), 0))
      assert.instanceOf(zero, Eventually.WaitTimeout, String(zero))
      assert.strictEqual((zero as Eventually.WaitTimeout).message, "waited 0 for the thing")
    }))

  it.effect("OutcomeLog.waitUntil fails with a WaitTimeout naming a bound that is not a finite duration", () =>
    Effect.gen(function*() {
      const log = yield* OutcomeLog.make
      for (const [bound, shown] of badBounds) {
        const error = yield* failureOf(log.waitUntil((all: ReadonlyArray<Outcome.Outcome>) => all.length > 0, bound, "one outcome"))
        assert.instanceOf(error, OutcomeLog.WaitTimeout, String(error))
        assert.strictEqual(
          (error as OutcomeLog.WaitTimeout).message,
          `cannot wait for one outcome: timeout must be a finite duration such as "15 seconds", 0 or more, got ${shown}`
        )
      }
    }))

  it.live("ChildWorker's waits fail with an InvalidTimeout ChildWorkerError naming a bound that is not a finite duration", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker })
      yield* worker.waitForLine((line) => line === "ready", "10 seconds")
      for (const [bound, shown] of badBounds) {
        const waits: ReadonlyArray<Effect.Effect<unknown, ChildWorker.ChildWorkerError>> = [
          worker.waitForLine((line) => line === "ready", bound),
          worker.waitForExit(bound)
        ]
        for (const wait of waits) {
          const error = yield* failureOf(wait)
          assert.instanceOf(error, ChildWorker.ChildWorkerError, String(error))
          const { reason, message } = error as ChildWorker.ChildWorkerError
          assert.strictEqual(reason, "InvalidTimeout")
          assert.isTrue(
            message.startsWith(`timeout must be a finite duration such as "10 seconds", 0 or more, got ${shown}`),
            message
          )
        }
      }
    }).pipe(Effect.scoped))

  it.live("NatsServer refuses a readyTimeout or stopTimeout that is not a finite duration with a NatsServerError naming it, before it starts anything", () =>
    Effect.gen(function*() {
      // No such binary: a refusal must come before any process is started.
      const binary = "/nonexistent/nats-server"
      const cases: ReadonlyArray<readonly [NatsServer.Options, string]> = [
        [{ readyTimeout: banana }, `readyTimeout must be a finite duration above zero such as "15 seconds", got "banana"`],
        [{ readyTimeout: 0 }, `readyTimeout must be a finite duration above zero such as "15 seconds", got 0`],
        [{ readyTimeout: Duration.infinity }, `readyTimeout must be a finite duration above zero such as "15 seconds", got Infinity`],
        [{ stopTimeout: Number.NaN }, `stopTimeout must be a finite duration such as "10 seconds", 0 or more, got NaN`],
        [{ stopTimeout: "-1 second" }, `stopTimeout must be a finite duration such as "10 seconds", 0 or more, got "-1 second"`]
      ]
      for (const [options, message] of cases) {
        const starts: ReadonlyArray<Effect.Effect<unknown, NatsServer.NatsServerError, Scope.Scope>> = [
          NatsServer.make({ ...options, binary }),
          NatsServer.cluster({ ...options, binary, size: 1 })
        ]
        for (const start of starts) {
          const error = yield* failureOf(start)
          assert.instanceOf(error, NatsServer.NatsServerError, String(error))
          assert.strictEqual((error as NatsServer.NatsServerError).message, message)
        }
      }
    }).pipe(Effect.scoped))

  it.effect("InMemoryBroker.make never throws on a lease that is not a finite duration above zero: its source fails to open, naming it", () =>
    Effect.gen(function*() {
      for (const [lease, shown] of [...badBounds, [0, "0"] as const]) {
        let broker: InMemoryBroker.InMemoryBroker | undefined
        assert.doesNotThrow(() => {
          broker = InMemoryBroker.make({ lease })
        })
        if (broker === undefined) continue
        const error = yield* failureOf(broker.source.open({ consumer: "c", prefetch: 1, attempts: 3, ordering: "Unordered" }))
        assert.deepInclude(error, {
          _tag: "SourceError",
          reason: "ContractMismatch",
          message: `lease must be a finite duration above zero such as "30 seconds", got ${shown}`
        })
      }
      const good = InMemoryBroker.make({ lease: "30 seconds" })
      const intake = yield* good.source.open({ consumer: "c", prefetch: 1, attempts: 3, ordering: "Unordered" })
      assert.strictEqual(Duration.toMillis(intake.lease), 30_000)
    }).pipe(Effect.scoped))
})

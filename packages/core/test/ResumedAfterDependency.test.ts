/**
 * When a dependency comes back, an operator reads the cause before its effect: the dependency's
 * `dependency.up` line comes before the consumer's `consumer.resumed` line (the dependency's check
 * wakes the paused consumer from inside its own state change, before it writes its line).
 * Managed lifecycle, a dependency whose check reads a flag, in-memory broker, test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Lifecycle, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Exit, Fiber, Layer, Logger, Result, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })

class DatabaseDown extends Data.TaggedError("DatabaseDown")<{ readonly message: string }> {}

describe("a dependency back up", () => {
  it.effect("BE-JOB-003: dependency.up is logged before consumer.resumed", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.makeManaged({
        budget: Result.getOrThrow(Lifecycle.makeBudget({})),
        startupTimeout: "10 seconds",
        readyWhen: "started"
      })
      const events: Array<string> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => {
        const event = entry.annotations.event
        if (typeof event === "string") events.push(event)
      })
      const logs = Logger.layer([logger])
      const db = { up: true }
      const query = Effect.suspend(() => (db.up ? Effect.void : Effect.fail(new DatabaseDown({ message: "connection refused" }))))
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(Lifecycle.resource("db", Layer.empty, { check: query, checkInterval: "500 millis" }), scope).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle),
        Effect.provide(logs)
      )
      yield* lifecycle.started
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 20 })
      for (const id of ["e1", "e2", "e3"]) yield* broker.publish(JSON.stringify({ id }))
      const outcomes: Array<Outcome.Outcome> = []
      db.up = false
      const fiber = yield* Effect.forkChild(
        Consumer.run(Consumer.make({
          name: "paused",
          source: broker.source,
          schema: Event,
          metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(0) }),
          handle: () => query,
          classify: { DatabaseDown: "transient" },
          retry: Retry.exponential({ attempts: 1, base: "1 second", jitter: false, inProcessRetries: 0 }),
          concurrency: 1,
          prefetch: 1,
          onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
        })).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(logs))
      )
      const until = (done: () => boolean) =>
        Effect.gen(function*() {
          for (let i = 0; i < 600 && !done(); i++) yield* TestClock.adjust("100 millis")
          assert.isTrue(done(), events.join(", "))
        })
      yield* until(() => events.includes("consumer.paused"))
      db.up = true
      yield* until(() => outcomes.length === 3)
      yield* Fiber.interrupt(fiber)
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Committed", "Committed"])
      const changes = events.filter((e) => e === "dependency.down" || e === "dependency.up" || e.startsWith("consumer."))
      assert.deepStrictEqual(changes.filter((e) => e !== "consumer.progress"), [
        "dependency.down",
        "consumer.paused",
        "dependency.up",
        "consumer.resumed"
      ])
    }))
})

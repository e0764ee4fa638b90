/**
 * The JetStream intake's buffered messages while the consumer is paused on a dependency
 * (BE-JOB-003, INT-NATS-002): messages pulled before the pause wait in the intake's buffer, and
 * their ack wait runs there. The intake keeps their leases while the pause lasts, at most
 * `dependencies.maxHold`, so a pause several ack waits long hands none of them back to the
 * broker: each is handled once, on its first delivery, once the dependency is back. Past
 * `maxHold` it stops, and they come back as the broker redelivers them. Before the intake kept
 * them, the first case handled four of the five messages twice (on delivery 1 after the pause,
 * past their lease, their acks withheld, and on delivery 2).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Envelope, Lifecycle, type Outcome } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, TestStream } from "@jetworker/testing"
import { Data, type Duration, Effect, Fiber, Layer, Logger, Result, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (n: number) => JSON.stringify({ id: `j${n}`, type: "test.job", time: new Date().toISOString(), data: { n } })

class DatabaseDown extends Data.TaggedError("DatabaseDown")<{ readonly message: string }> {}

/**
 * A started managed lifecycle with dependency "db" (checked every 200 ms, up while `db.up`), and a
 * consumer of `test` under it (concurrency 1, prefetch 4) whose handler calls the database;
 * `handled` records each run's message number and delivery count, `outcomes` each outcome.
 */
const run = (test: TestStream.TestStream, maxHold: Duration.Input) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({
      budget: Result.getOrThrow(Lifecycle.makeBudget({})),
      startupTimeout: "10 seconds",
      readyWhen: "started"
    })
    const db = { up: true }
    const query = Effect.suspend(() => (db.up ? Effect.void : Effect.fail(new DatabaseDown({ message: "connection refused" }))))
    const scope = yield* Effect.scope
    yield* Layer.buildWithScope(Lifecycle.resource("db", Layer.empty, { check: query, checkInterval: "200 millis" }), scope).pipe(
      Effect.provideService(Lifecycle.Lifecycle, lifecycle),
      Effect.provide(Logger.layer([]))
    )
    yield* lifecycle.started
    const handled: Array<{ readonly n: number; readonly deliveryCount: number; readonly up: boolean }> = []
    const outcomes: Array<Outcome.Outcome> = []
    const fiber = yield* Effect.forkChild(
      Consumer.run(Consumer.make({
        name: test.consumer,
        source: JetStreamSource.make({ stream: test.stream, consumer: test.consumer, captureMaxDeliveries: false, pullExpires: "2 seconds" }),
        schema: Event,
        handle: (event) =>
          CurrentDelivery.CurrentDelivery.use((delivery) => {
            handled.push({ n: event.data.n, deliveryCount: delivery.deliveryCount, up: db.up })
            return query
          }),
        classify: { DatabaseDown: "transient" },
        concurrency: 1,
        prefetch: 4,
        dependencies: { maxHold },
        onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
      })).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(Logger.layer([])))
    )
    yield* Eventually.holds("the consumer ready", Effect.sync(() => lifecycle.readiness().ready), "15 seconds")
    return { db, handled, outcomes, fiber }
  })

describe("the intake's buffered messages during a dependency pause", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("a pause of three ack waits hands no buffered message back: each is handled once, on its first delivery, after the pause", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const { db, handled, outcomes, fiber } = yield* run(test, "5 minutes")
        db.up = false
        // The pause begins (with a worker at the gate, or with the first message held); the
        // messages wait in the intake's buffer.
        for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
        yield* Eventually.holds("all five delivered", Effect.map(test.info, (i) => i.num_ack_pending === 5), "10 seconds")
        // The pause lasts three ack waits (the window this test watches, not a wait for a result).
        yield* Effect.sleep("6 seconds")
        db.up = true
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
        const { db, handled, outcomes, fiber } = yield* run(test, "1 second")
        db.up = false
        for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
        yield* Eventually.holds("all five delivered", Effect.map(test.info, (i) => i.num_ack_pending === 5), "10 seconds")
        // Three ack waits again, with a hold of half of one.
        yield* Effect.sleep("6 seconds")
        db.up = true
        yield* Eventually.holds("all five committed", Effect.sync(() => new Set(outcomes.filter((o) => o._tag === "Committed").map((o) => o.message.sequence)).size === 5), "20 seconds")
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        const redelivered = handled.filter((h) => h.deliveryCount > 1)
        assert.isAbove(redelivered.length, 0, `no message was delivered again: ${JSON.stringify(handled)}`)
      }).pipe(Effect.scoped), 60_000)
  })
})

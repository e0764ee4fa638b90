/**
 * The "drained its backlog" line says the consumer is done with what the broker had: it is not
 * written while a delivery the consumer released (naked with a retry's backoff, or left to its
 * lease) waits for its redelivery, although the broker then counts nothing pending (JetStream's
 * pending count leaves out what it has delivered and not yet settled). It is written once that
 * redelivery settles; and a redelivery that never comes back here (taken by another process)
 * silences it for a lease past its due time at most. In-memory broker reporting pending counts as
 * JetStream does, test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Delivery, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Logger, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/**
 * `broker`'s source, each delivery with the count JetStream gives: the messages never delivered
 * yet (a naked one waiting for its redelivery is not pending). `skip` says which redeliveries
 * another process takes: acked there, never seen here.
 */
const withPending = (
  broker: InMemoryBroker.InMemoryBroker,
  skip: (delivery: Delivery.Delivery) => boolean = () => false
): Source.Source => ({
  name: broker.source.name,
  open: (options) =>
    Effect.map(broker.source.open(options), (intake) => ({
      ...intake,
      take: Effect.gen(function*() {
        while (true) {
          const delivery = yield* intake.take
          if (skip(delivery)) {
            yield* Effect.orDie(delivery.ack)
            continue
          }
          const pending = broker.messages().filter((m) => m.status === "pending" && m.deliveries === 0).length
          return { ...delivery, pending }
        }
      })
    }))
})

const idOf = (delivery: Delivery.Delivery) => (JSON.parse(new TextDecoder().decode(delivery.payload)) as { readonly id: string }).id

/** Runs a consumer of `source` whose handler fails once (transiently) for "e2"; collects outcomes and log lines. */
const start = (name: string, source: Source.Source) =>
  Effect.gen(function*() {
    const outcomes: Array<Outcome.Outcome> = []
    const lines: Array<string> = []
    const logger = Logger.map(Logger.formatStructured, (entry) => void lines.push(String(entry.message)))
    let failed = false
    const consumer = Consumer.make({
      name,
      source,
      schema: Event,
      metadata,
      handle: (event) =>
        Effect.suspend(() => {
          if (event.id !== "e2" || failed) return Effect.void
          failed = true
          return Effect.fail(new Flaky({ message: "lock timeout" }))
        }),
      classify: { Flaky: "transient" },
      retry: Retry.exponential({ attempts: 3, base: "1 second", jitter: false, inProcessRetries: 0 }),
      progressInterval: "100 millis",
      onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
    })
    const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(Logger.layer([logger]))))
    const until = (done: () => boolean) =>
      Effect.gen(function*() {
        for (let i = 0; i < 1_000 && !done(); i++) yield* TestClock.adjust("10 millis")
        assert.isTrue(done(), `${outcomes.map((o) => o._tag).join(", ")}\n${lines.join("\n")}`)
      })
    const drained = () => lines.filter((line) => line.includes("drained its backlog"))
    return { outcomes, lines, fiber, until, drained }
  })

describe("the drained line", () => {
  it.effect("is not written while a released delivery waits for its retry, and is written once it settles", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 5 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const t = yield* start("retrying", withPending(broker))
      yield* t.until(() => t.outcomes.some((o) => o._tag === "Released"))
      // The retry is 1 s away; nothing is pending on the broker, nothing runs.
      yield* TestClock.adjust("500 millis")
      assert.deepStrictEqual(t.drained(), [], "no drained line while the retry waits")
      yield* t.until(() => t.outcomes.length === 3)
      yield* TestClock.adjust("200 millis")
      yield* Fiber.interrupt(t.fiber)
      assert.deepStrictEqual(t.outcomes.map((o) => `${o._tag} ${o.message.eventId}`), ["Committed e1", "Released e2", "Committed e2"])
      assert.deepStrictEqual(t.drained(), ["consumer retrying drained its backlog (3 settled: 2 Committed, 1 Released)"])
      assert.isAbove(t.lines.indexOf(t.drained()[0]!), t.lines.findIndex((line) => line.startsWith("Released ")))
    }))

  it.effect("a retry another process takes holds it back for a lease past its due time at most", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 5 })
      yield* broker.publish(JSON.stringify({ id: "e1" }))
      yield* broker.publish(JSON.stringify({ id: "e2" }))
      const t = yield* start("elsewhere", withPending(broker, (d) => d.deliveryCount > 1 && idOf(d) === "e2"))
      yield* t.until(() => t.outcomes.some((o) => o._tag === "Released"))
      yield* TestClock.adjust("10 seconds")
      yield* broker.publish(JSON.stringify({ id: "e3" }))
      yield* t.until(() => t.outcomes.length === 3)
      yield* TestClock.adjust("200 millis")
      assert.deepStrictEqual(t.drained(), [], "e2 may still come back (1 s retry, 30 s lease)")
      yield* TestClock.adjust("30 seconds")
      yield* broker.publish(JSON.stringify({ id: "e4" }))
      yield* t.until(() => t.outcomes.length === 4)
      yield* TestClock.adjust("200 millis")
      yield* Fiber.interrupt(t.fiber)
      assert.deepStrictEqual(t.drained(), ["consumer elsewhere drained its backlog (4 settled: 3 Committed, 1 Released)"])
    }))
})

/**
 * `jetworker.in_flight` says how many deliveries are being processed at the moment it is read, and
 * once the consumer has stopped its series keeps the last count (0), so a scrape after the stop
 * still finds it. In-memory broker; handlers held until the test lets them go.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Context, DateTime, Deferred, Effect, Fiber, Metric, Schema } from "effect"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

/** The consumer `name`'s in-flight count in `registry`, or `undefined` when no series is served. */
const inFlight = (registry: Metric.MetricRegistry, name: string) => {
  const series = Metric.snapshotUnsafe(Context.make(Metric.MetricRegistry, registry))
    .find((s) => s.id === "jetworker.in_flight" && s.attributes?.consumer === name)
  return series === undefined ? undefined : (series.state as { readonly value: number }).value
}

describe("jetworker.in_flight", () => {
  it.live("counts the deliveries in flight when read, and keeps its last count once the consumer stops", () =>
    Effect.gen(function*() {
      const registry: Metric.MetricRegistry = new Map()
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      const release = yield* Deferred.make<void>()
      let started = 0
      const allStarted = yield* Deferred.make<void>()
      let settled = 0
      const allSettled = yield* Deferred.make<void>()
      const consumer = Consumer.make({
        name: "in-flight",
        source: broker.source,
        schema: Event,
        metadata,
        concurrency: 4,
        handle: () =>
          Effect.andThen(
            Effect.sync(() => {
              if (++started === 3) Deferred.doneUnsafe(allStarted, Effect.void)
            }),
            Deferred.await(release)
          ),
        classify: {},
        onOutcome: () =>
          Effect.sync(() => {
            if (++settled === 3) Deferred.doneUnsafe(allSettled, Effect.void)
          })
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provideService(Metric.MetricRegistry, registry)))
      for (const id of ["e1", "e2", "e3"]) yield* broker.publish(JSON.stringify({ id }))
      yield* Deferred.await(allStarted).pipe(Effect.timeout("5 seconds"))
      assert.strictEqual(inFlight(registry, "in-flight"), 3)
      yield* Deferred.succeed(release, undefined)
      yield* Deferred.await(allSettled).pipe(Effect.timeout("5 seconds"))
      assert.strictEqual(inFlight(registry, "in-flight"), 0)
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(inFlight(registry, "in-flight"), 0, "still served once the consumer has stopped")
    }))
})

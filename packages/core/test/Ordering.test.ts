import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Source } from "@jetworker/core"
import { Deferred, Effect, Fiber, Result, Schema } from "effect"
import * as Lanes from "../src/internal/lanes.ts"

const source: Source.Source = { name: "none", open: () => Effect.die("not opened in these tests") }
const Event = Schema.Struct({ id: Schema.String, key: Schema.String })
const base = {
  name: "c",
  source,
  schema: Event,
  metadata: (event: typeof Event.Type) => ({ id: event.id, time: undefined as never }),
  classify: {}
}

describe("Ordering", () => {
  it.effect("per-key limits are checked and resolved against the concurrency", () =>
    Effect.sync(() => {
      const fine = Consumer.make({ ...base, handle: () => Effect.void, concurrency: 4, ordering: { perKey: (e) => e.key } })
      assert.deepStrictEqual(fine.problems, [])
      assert.deepStrictEqual(
        fine.definition.ordering._tag === "PerKey" ? fine.definition.ordering.limits : undefined,
        { maxHeld: 4 + 8, maxKeys: 4 + 8, maxPerLane: 1 + 4 }
      )
      const zero = Consumer.make({ ...base, handle: () => Effect.void, ordering: { perKey: (e) => e.key, maxQueued: 0, maxQueuedPerKey: 0 } })
      assert.deepStrictEqual(zero.problems, [], "no waiting at all is a valid limit")
      const bad = Consumer.make({
        ...base,
        handle: () => Effect.void,
        ordering: { perKey: (e) => e.key, maxQueued: -1, maxQueuedPerKey: 1.5, maxKeys: 0 }
      })
      assert.deepStrictEqual(bad.problems.map((p) => p.option), ["ordering.maxQueued", "ordering.maxQueuedPerKey", "ordering.maxKeys"])
      const unknown = Consumer.make({ ...base, handle: () => Effect.void, ordering: "random" as never })
      assert.deepStrictEqual(unknown.problems.map((p) => p.option), ["ordering"])
      const sequential = Consumer.make({ ...base, handle: () => Effect.void, ordering: "sequential" })
      assert.deepStrictEqual([sequential.problems, sequential.definition.concurrency, sequential.definition.prefetch], [[], 1, 1])
    }))

  it.effect("batch options are checked: a batch needs a size", () =>
    Effect.sync(() => {
      const handleBatch = (events: ReadonlyArray<typeof Event.Type>) => Effect.succeed(events.map(() => Result.succeed(undefined)))
      const fine = Consumer.makeBatch({ ...base, batch: { maxSize: 10 }, handleBatch })
      assert.deepStrictEqual([fine.problems, fine.definition.batch?.maxSize, fine.definition.concurrency, fine.definition.prefetch], [[], 10, 2, 10])
      const bad = Consumer.makeBatch({ ...base, batch: { maxSize: 0, maxWait: "-1 millis" }, handleBatch })
      assert.deepStrictEqual(bad.problems.map((p) => p.option), ["batch.maxSize", "batch.maxWait"])
    }))

  it.effect("BE-JOB-004: a batch consumer given an ordering (options spread from a single consumer's, which the type cannot catch) refuses it instead of dropping it", () =>
    Effect.sync(() => {
      const handleBatch = (events: ReadonlyArray<typeof Event.Type>) => Effect.succeed(events.map(() => Result.succeed(undefined)))
      for (const ordering of [{ perKey: (event: typeof Event.Type) => event.id }, "sequential"] as const) {
        const shared = { ...base, ordering }
        const consumer = Consumer.makeBatch({ ...shared, batch: { maxSize: 10 }, handleBatch })
        assert.deepStrictEqual(consumer.problems.map((p) => p.option), ["ordering"], JSON.stringify(ordering))
        assert.include(consumer.problems[0]!.problem, "not supported by a batch consumer")
      }
      const unordered = Consumer.makeBatch({ ...{ ...base, ordering: "unordered" as const }, batch: { maxSize: 10 }, handleBatch })
      assert.deepStrictEqual(unordered.problems, [])
    }))

  it.effect("lanes: a key's deliveries take turns in order; one that leaves before its turn passes the wait on", () =>
    Effect.gen(function*() {
      const lanes = Lanes.make({ maxHeld: 10, maxKeys: 10, maxPerLane: 3 })
      const places: Array<Lanes.Place> = []
      for (let i = 0; i < 3; i++) yield* lanes.join("k", (place) => places.push(place))
      const [first, second, third] = places as [Lanes.Place, Lanes.Place, Lanes.Place]
      const thirdRuns = yield* Deferred.make<void>()
      const waiting = yield* Effect.forkChild(Effect.andThen(lanes.turn(third), Deferred.succeed(thirdRuns, undefined)))
      // The second leaves before its turn (interrupted while it waited): the third still waits for the first.
      lanes.leave(second)
      yield* Effect.yieldNow
      assert.isFalse(yield* Deferred.isDone(thirdRuns), "the third waits while the first runs")
      lanes.leave(first)
      yield* Fiber.join(waiting)
      assert.isTrue(yield* Deferred.isDone(thirdRuns))
      lanes.leave(third)
      assert.deepStrictEqual(lanes.size(), { held: 0, keys: 0 })
    }))

  it.effect("lanes: a full lane and a full set of keys make joining wait until a delivery leaves", () =>
    Effect.gen(function*() {
      const lanes = Lanes.make({ maxHeld: 10, maxKeys: 1, maxPerLane: 1 })
      let a: Lanes.Place | undefined
      yield* lanes.join("a", (place) => {
        a = place
      })
      const sameKey = yield* Effect.forkChild(lanes.join("a", () => undefined))
      const otherKey = yield* Effect.forkChild(lanes.join("b", () => undefined))
      yield* Effect.yieldNow
      assert.isUndefined(sameKey.pollUnsafe(), "the lane of a is full")
      assert.isUndefined(otherKey.pollUnsafe(), "no room for a second key")
      lanes.leave(a!)
      // One of them gets in; the other waits for it to leave.
      yield* Effect.yieldNow
      assert.strictEqual([sameKey.pollUnsafe(), otherKey.pollUnsafe()].filter((exit) => exit !== undefined).length, 1)
      yield* Fiber.interrupt(sameKey)
      yield* Fiber.interrupt(otherKey)
    }))

  it.effect("lanes: the intake waits for room among the held deliveries", () =>
    Effect.gen(function*() {
      const lanes = Lanes.make({ maxHeld: 2, maxKeys: 10, maxPerLane: 10 })
      lanes.hold()
      lanes.hold()
      const room = yield* Effect.forkChild(lanes.awaitRoom)
      yield* Effect.yieldNow
      assert.isUndefined(room.pollUnsafe())
      lanes.unhold()
      yield* Fiber.join(room)
      assert.strictEqual(lanes.size().held, 1)
    }))
})

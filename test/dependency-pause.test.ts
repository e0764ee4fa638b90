/**
 * BE-JOB-003 with a dependency outage: under a managed lifecycle, while a dependency the consumer
 * pauses on is down (`Lifecycle.resource` with a failing `check`), a delivery whose handler fails
 * transiently is held (lease kept, failure not counted) and runs again once the dependency is
 * back, and the workers take nothing new meanwhile. Without the pause (`pauseOn: "none"`) the same
 * outage spends the attempts and dead-letters; a hold is bounded by `maxHold`, and a shutdown ends
 * it with a release. In-memory broker, test clock, a dependency whose check reads a flag.
 */
import { assert, describe, it } from "@effect/vitest"
import { type Classification, Consumer, Lifecycle, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Exit, Fiber, Layer, Logger, Metric, Result, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class DatabaseDown extends Data.TaggedError("DatabaseDown")<{ readonly message: string }> {}

// One attempt: any failure that counts dead-letters the message at once.
const policy = Retry.exponential({ attempts: 1, base: "1 second", jitter: false, inProcessRetries: 0 })

/** Collects log lines as `{ level, message, annotations }`. */
const collecting = () => {
  const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]) }
}

/**
 * A started managed lifecycle with dependency "db" (checked every 500 ms: its check passes while
 * `db.up`), an in-memory broker with `count` messages, and `run`, which runs a consumer of them
 * under the lifecycle, collecting its outcomes and log lines.
 */
const setup = (count: number) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({
      budget: Result.getOrThrow(Lifecycle.makeBudget({})),
      startupTimeout: "10 seconds",
      readyWhen: "started"
    })
    const log = collecting()
    const db = { up: true }
    const databaseDown = () => new DatabaseDown({ message: "connection refused" })
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Lifecycle.resource("db", Layer.empty, {
        check: Effect.suspend(() => (db.up ? Effect.void : Effect.fail(databaseDown()))),
        checkInterval: "500 millis"
      }),
      scope
    ).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(log.layer))
    yield* lifecycle.started
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 20 })
    for (let i = 1; i <= count; i++) yield* broker.publish(JSON.stringify({ id: `e${i}` }))
    const outcomes: Array<Outcome.Outcome> = []
    const onOutcome = (outcome: Outcome.Outcome) => Effect.sync(() => void outcomes.push(outcome))
    const run = <A, E extends Classification.Tagged>(consumer: Consumer.Consumer<A, E, never>) =>
      Effect.forkChild(Consumer.run(consumer).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(log.layer)))
    /** Steps the test clock 100 ms at a time until `done` (at most `limit` steps). */
    const until = (done: () => boolean, limit = 600) =>
      Effect.gen(function*() {
        for (let i = 0; i < limit && !done(); i++) yield* TestClock.adjust("100 millis")
        return done()
      })
    const events = (event: string) => log.lines.filter((l) => l.annotations.event === event)
    return { lifecycle, db, databaseDown, broker, outcomes, onOutcome, run, until, events, scope }
  })

/** `setup` with a consumer whose handler fails with `DatabaseDown` while the database is down. */
const withConsumer = (count: number, options: { readonly concurrency: number; readonly dependencies?: Consumer.Options<{ readonly id: string }, DatabaseDown, never>["dependencies"] }) =>
  Effect.gen(function*() {
    const t = yield* setup(count)
    const runs: Array<string> = []
    const fiber = yield* t.run(Consumer.make({
      name: "paused",
      source: t.broker.source,
      schema: Event,
      metadata,
      handle: (event) =>
        Effect.suspend(() => {
          runs.push(event.id)
          return t.db.up ? Effect.void : Effect.fail(t.databaseDown())
        }),
      classify: { DatabaseDown: "transient" },
      retry: policy,
      concurrency: options.concurrency,
      prefetch: 1,
      ...(options.dependencies === undefined ? {} : { dependencies: options.dependencies }),
      onOutcome: t.onOutcome
    }))
    return { ...t, runs, fiber }
  })

/** `setup` with a batch consumer (batches of up to 4) whose whole batch fails while the database is down. */
const withBatchConsumer = (count: number) =>
  Effect.gen(function*() {
    const t = yield* setup(count)
    const fiber = yield* t.run(Consumer.makeBatch({
      name: "paused-batch",
      source: t.broker.source,
      schema: Event,
      metadata,
      batch: { maxSize: 4, maxWait: "10 millis" },
      handleBatch: (events) =>
        Effect.suspend(() => (t.db.up ? Effect.succeed(events.map(() => Result.succeed(undefined))) : Effect.fail(t.databaseDown()))),
      classify: { DatabaseDown: "transient" },
      retry: policy,
      concurrency: 1,
      onOutcome: t.onOutcome
    }))
    return { ...t, fiber }
  })

/** Gauge `id` (`jetworker.held`, `jetworker.paused`) of consumer `name`. */
const gauge = (id: string, name: string) =>
  Effect.map(Metric.snapshot, (snapshots) => {
    const found = snapshots.find((m) => m.id === id && m.attributes?.consumer === name)
    return found === undefined ? undefined : Number((found.state as { readonly value: number | bigint }).value)
  })

const tags = (outcomes: ReadonlyArray<Outcome.Outcome>) => outcomes.map((o) => `${o._tag}${"reason" in o ? `:${o.reason}` : ""}`)

describe("pausing on a dependency that is down", () => {
  it.effect("BE-JOB-003: handlers failing while the database is down are held, not counted (1 attempt would dead-letter them), the intake takes nothing new, and every message commits once the database is back", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(6, { concurrency: 2 })
      t.db.up = false
      // The check still passes (its next probe is 500 ms away): the first failure probes it at once.
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "a delivery held")
      assert.deepStrictEqual(t.outcomes, [], `no outcome while the database is down: ${JSON.stringify(tags(t.outcomes))}`)
      // Paused for 5 s: the held deliveries (one per worker at most) are all that ran, and no new one is taken.
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(t.outcomes, [])
      const held = new Set(t.events("delivery.held").map((l) => l.annotations.eventId))
      assert.isAtMost(held.size, 2)
      assert.deepStrictEqual([...new Set(t.runs)].sort(), [...held].sort(), "only the held deliveries ran")
      assert.lengthOf(t.events("consumer.paused"), 1, "the pause is logged once")
      assert.strictEqual(yield* gauge("jetworker.paused", "paused"), 1, "jetworker.paused is 1 while paused")
      assert.strictEqual(yield* gauge("jetworker.held", "paused"), held.size, "jetworker.held counts the held deliveries")
      const status = t.lifecycle.readiness().components.find((c) => c.name === "db")
      assert.isFalse(status?.up, "the dependency is down on the readiness probe")
      t.db.up = true
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 6), "every message settled once the database is back")
      assert.deepStrictEqual(tags(t.outcomes), Array(6).fill("Committed"))
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      assert.lengthOf(t.events("consumer.resumed"), 1, "the resumption is logged once")
      assert.strictEqual(yield* gauge("jetworker.paused", "paused"), 0)
      assert.strictEqual(yield* gauge("jetworker.held", "paused"), 0)
      const line = t.events("delivery.held")[0]!
      assert.strictEqual(line.annotations.dependencies, "db")
      assert.include(String(line.message), "db (connection refused)")
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003, BE-JOB-007: a batch that fails as a whole while the database is down: its elements, run alone, are held, not counted, and all commit once it is back", () =>
    Effect.gen(function*() {
      const t = yield* withBatchConsumer(4)
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1), "an element held")
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(t.outcomes, [], `no outcome while the database is down: ${JSON.stringify(tags(t.outcomes))}`)
      t.db.up = true
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 4), "every element settled once the database is back")
      assert.deepStrictEqual(tags(t.outcomes), Array(4).fill("Committed"))
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: with pauseOn \"none\" the same outage counts the failure: dead-lettered AttemptsExhausted", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1, dependencies: { pauseOn: "none" } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1))
      assert.deepStrictEqual(tags(t.outcomes), ["DeadLettered:AttemptsExhausted"])
      assert.lengthOf(t.events("delivery.held"), 0)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: a hold lasts at most maxHold; then the failure counts as usual (logged delivery.hold_ended)", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1, dependencies: { maxHold: "3 seconds" } })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1))
      // The hold began within the last 100 ms step.
      yield* TestClock.adjust("2800 millis")
      assert.deepStrictEqual(t.outcomes, [], "still held within maxHold")
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 10))
      assert.deepStrictEqual(tags(t.outcomes), ["DeadLettered:AttemptsExhausted"])
      assert.lengthOf(t.events("delivery.hold_ended"), 1)
      yield* Fiber.interrupt(t.fiber)
      yield* Scope.close(t.scope, Exit.void)
    }))

  it.effect("BE-JOB-003: a shutdown ends a hold: the delivery is released (Interrupted), not counted", () =>
    Effect.gen(function*() {
      const t = yield* withConsumer(1, { concurrency: 1 })
      t.db.up = false
      assert.isTrue(yield* t.until(() => t.events("delivery.held").length >= 1))
      // Interrupting the run drains for `drainTimeout` (10 s), then interrupts the held delivery.
      const stopping = yield* Effect.forkChild(Fiber.interrupt(t.fiber))
      assert.isTrue(yield* t.until(() => t.outcomes.length >= 1, 200))
      yield* Fiber.join(stopping)
      assert.deepStrictEqual(tags(t.outcomes), ["Released:Interrupted"])
      assert.deepStrictEqual(t.broker.deadLetters(), [])
      yield* Scope.close(t.scope, Exit.void)
    }))
})

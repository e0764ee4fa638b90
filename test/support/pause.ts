/**
 * Set-up shared by the dependency-pause tests (BE-JOB-003): a started managed lifecycle with one
 * checked dependency, "db", whose check reads a flag; an in-memory broker; consumers run under the
 * lifecycle with their outcomes and log lines collected; and readers for gauges and outcomes.
 * Everything runs on the test clock, stepped by `until` in bounded steps.
 */
import { type Classification, Consumer, Lifecycle, type Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, type Duration, Effect, Fiber, Layer, Logger, Metric, Result, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"

/** The messages' payload. */
export const Event = Schema.Struct({ id: Schema.String })

/** Metadata of an `Event`: its id, and a time far from any expiry question. */
export const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

/** What the dependency "db" and the handlers fail with while it is down. */
export class DatabaseDown extends Data.TaggedError("DatabaseDown")<{ readonly message: string }> {}

/** One attempt: any failure that counts dead-letters the message at once. */
export const policy = Retry.exponential({ attempts: 1, base: "1 second", jitter: false, inProcessRetries: 0 })

/** One collected log line. */
export interface LogLine {
  readonly level: string
  readonly message: unknown
  readonly annotations: Readonly<Record<string, unknown>>
}

/** A logger layer that collects every log line into `lines`. */
export const collecting = () => {
  const lines: Array<LogLine> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]) }
}

/** Gauge `id` (`jetworker.held`, `jetworker.paused`) of consumer `name`; `undefined` before it is set. */
export const gauge = (id: string, name: string) =>
  Effect.map(Metric.snapshot, (snapshots) => {
    const found = snapshots.find((m) => m.id === id && m.attributes?.consumer === name)
    return found === undefined ? undefined : Number((found.state as { readonly value: number | bigint }).value)
  })

/** Outcomes as `Tag` or `Tag:reason`, easy to compare. */
export const tags = (outcomes: ReadonlyArray<Outcome.Outcome>) => outcomes.map((o) => `${o._tag}${"reason" in o ? `:${o.reason}` : ""}`)

/**
 * A started managed lifecycle with dependency "db" (checked every 500 ms: its check passes while
 * `db.up`; `db.checks` counts its runs), an in-memory broker (30 s lease, optional `faults`) with
 * `count` messages `e1`..`e<count>`, and `run`, which runs a consumer of them under the lifecycle,
 * collecting its outcomes and log lines. Close `scope` at the end of the test.
 */
export const setup = (count: number, options: { readonly faults?: InMemoryBroker.Faults | undefined } = {}) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({
      budget: Result.getOrThrow(Lifecycle.makeBudget({})),
      startupTimeout: "10 seconds",
      readyWhen: "started"
    })
    const log = collecting()
    const db = { up: true, checks: 0 }
    const databaseDown = () => new DatabaseDown({ message: "connection refused" })
    /** A call to the database: fails with `DatabaseDown` while it is down. */
    const query = Effect.suspend(() => (db.up ? Effect.void : Effect.fail(databaseDown())))
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Lifecycle.resource("db", Layer.empty, {
        check: Effect.suspend(() => {
          db.checks++
          return query
        }),
        checkInterval: "500 millis"
      }),
      scope
    ).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(log.layer))
    yield* lifecycle.started
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 20, faults: options.faults })
    for (let i = 1; i <= count; i++) yield* broker.publish(JSON.stringify({ id: `e${i}` }))
    const outcomes: Array<Outcome.Outcome> = []
    const onOutcome = (outcome: Outcome.Outcome) => Effect.sync(() => void outcomes.push(outcome))
    /** The options every consumer of these tests shares (add `prefetch`, `handle`, `classify`...). */
    const base = (name: string, concurrency: number) => ({
      name,
      source: broker.source,
      schema: Event,
      metadata,
      retry: policy,
      concurrency,
      onOutcome
    })
    const run = <A, E extends Classification.Tagged>(consumer: Consumer.Consumer<A, E, never>) =>
      Effect.forkChild(Consumer.run(consumer).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provide(log.layer)))
    /** Steps the test clock 100 ms at a time until `done` (at most `limit` steps). */
    const until = (done: () => boolean, limit = 600) =>
      Effect.gen(function*() {
        for (let i = 0; i < limit && !done(); i++) yield* TestClock.adjust("100 millis")
        return done()
      })
    /** Interrupts `fiber` in the background, stepping the clock until it has stopped (at most `limit` steps). */
    const stop = (fiber: Fiber.Fiber<unknown, unknown>, limit = 300) =>
      Effect.gen(function*() {
        let stopped = false
        yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
          stopped = true
        })))
        return yield* until(() => stopped, limit)
      })
    const events = (event: string) => log.lines.filter((l) => l.annotations.event === event)
    return { lifecycle, db, databaseDown, query, broker, outcomes, onOutcome, base, run, until, stop, events, scope, log }
  })

/** Options of `withConsumer`. */
export interface ConsumerOptions {
  /** Default: "paused". */
  readonly name?: string | undefined
  readonly concurrency: number
  readonly dependencies?: Consumer.Options<{ readonly id: string }, DatabaseDown, never>["dependencies"]
  readonly ordering?: Consumer.Options<{ readonly id: string }, DatabaseDown, never>["ordering"]
  /** How far into a run the handler calls the database. Default: at once. */
  readonly callAfter?: Duration.Input | undefined
  /** Broker faults (see `setup`). */
  readonly faults?: InMemoryBroker.Faults | undefined
}

/**
 * `setup` with a running consumer (prefetch 1) whose handler calls the database, so fails with
 * `DatabaseDown` while it is down; `runs` records each call: the event's id, and whether the
 * database was up.
 */
export const withConsumer = (count: number, options: ConsumerOptions) =>
  Effect.gen(function*() {
    const t = yield* setup(count, { faults: options.faults })
    const runs: Array<{ readonly id: string; readonly up: boolean }> = []
    const call = (event: { readonly id: string }) =>
      Effect.suspend(() => {
        runs.push({ id: event.id, up: t.db.up })
        return t.query
      })
    const callAfter = options.callAfter
    const fiber = yield* t.run(Consumer.make({
      ...t.base(options.name ?? "paused", options.concurrency),
      prefetch: 1,
      ordering: options.ordering,
      handle: callAfter === undefined ? call : (event) => Effect.andThen(Effect.sleep(callAfter), call(event)),
      classify: { DatabaseDown: "transient" },
      dependencies: options.dependencies
    }))
    return { ...t, runs, fiber }
  })

/**
 * `setup` with a running batch consumer (batches of up to 4, concurrency 1) whose whole batch
 * fails with `DatabaseDown` while the database is down.
 */
export const withBatchConsumer = (
  count: number,
  options: Pick<ConsumerOptions, "name" | "dependencies"> = {}
) =>
  Effect.gen(function*() {
    const t = yield* setup(count)
    const fiber = yield* t.run(Consumer.makeBatch({
      ...t.base(options.name ?? "paused-batch", 1),
      batch: { maxSize: 4, maxWait: "10 millis" },
      handleBatch: (events) => Effect.as(t.query, events.map(() => Result.succeed(undefined))),
      classify: { DatabaseDown: "transient" },
      dependencies: options.dependencies
    }))
    return { ...t, fiber }
  })

/**
 * Set-up shared by the tests of the JetStream intake's buffered messages (INT-NATS-002): jobs on a
 * throw-away stream, a started managed lifecycle with one checked dependency, "db", whose check
 * reads a flag, and a consumer paused on it whose handler calls the database. Logs are silenced.
 */
import { Consumer, CurrentDelivery, Envelope, Lifecycle, type Outcome } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, type TestStream } from "@jetworker/testing"
import { Data, type Duration, Effect, Layer, Logger, Result, Schema } from "effect"

/** The jobs' envelope: a `test.job` event carrying its number. */
export const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))

/** Job `n` as published (id `j<n>`), to go with message id `j<n>`. */
export const job = (n: number) => JSON.stringify({ id: `j${n}`, type: "test.job", time: new Date().toISOString(), data: { n } })

/**
 * What every consumer of `test`'s jobs starts from: the durable's name, its source (pulls expire
 * every 2 s, so the intake pulls again soon) and the jobs' schema.
 */
export const jobsOf = (test: TestStream.TestStream) => ({
  name: test.consumer,
  source: JetStreamSource.make({ stream: test.stream, consumer: test.consumer, captureMaxDeliveries: false, pullExpires: "2 seconds" }),
  schema: Event
})

/** What dependency "db" and the handlers fail with while it is down. */
export class DatabaseDown extends Data.TaggedError("DatabaseDown")<{ readonly message: string }> {}

/**
 * A started managed lifecycle with dependency "db", checked every `checkInterval`: its check, and
 * `query` (a call to the database), fail with `DatabaseDown` while `db.up` is false. The check
 * stops with the scope.
 */
export const pausedLifecycle = (checkInterval: Duration.Input = "200 millis") =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({
      budget: Result.getOrThrow(Lifecycle.makeBudget({})),
      startupTimeout: "10 seconds",
      readyWhen: "started"
    })
    const db = { up: true }
    const query = Effect.suspend(() => (db.up ? Effect.void : Effect.fail(new DatabaseDown({ message: "connection refused" }))))
    const scope = yield* Effect.scope
    yield* Layer.buildWithScope(Lifecycle.resource("db", Layer.empty, { check: query, checkInterval }), scope).pipe(
      Effect.provideService(Lifecycle.Lifecycle, lifecycle),
      Effect.provide(Logger.layer([]))
    )
    yield* lifecycle.started
    return { lifecycle, db, query }
  })

/**
 * `pausedLifecycle` with a ready consumer of `test` under it (concurrency 1, prefetch 4: four
 * messages wait in the intake's buffer behind the one taken) whose handler calls the database;
 * `handled` records each run (message number, delivery count, whether the database was up),
 * `outcomes` each outcome. The consumer uses the NATS connection in context.
 */
export const runPaused = (test: TestStream.TestStream, maxHold: Duration.Input) =>
  Effect.gen(function*() {
    const { lifecycle, db, query } = yield* pausedLifecycle()
    const handled: Array<{ readonly n: number; readonly deliveryCount: number; readonly up: boolean }> = []
    const outcomes: Array<Outcome.Outcome> = []
    const fiber = yield* Effect.forkChild(
      Consumer.run(Consumer.make({
        ...jobsOf(test),
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

/** Each outcome as `sequence@deliveryCount:Tag/reason` (`/ackWithheld` if so), for assertion messages. */
export const summary = (outcomes: ReadonlyArray<Outcome.Outcome>) =>
  outcomes.map((o) =>
    `${o.message.sequence}@${o.message.deliveryCount}:${o._tag}${"reason" in o ? `/${o.reason}` : ""}${o._tag === "Committed" && o.ackWithheld ? "/ackWithheld" : ""}`
  ).join(", ")

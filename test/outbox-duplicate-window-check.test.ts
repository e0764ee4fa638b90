/**
 * INT-NATS-007, "the republish horizon compared with the dedup setting", for the outbox: a relay
 * may publish a row again up to its `roundBudget` plus the publisher's republish horizon after its
 * first publish, and the stream stores that copy twice when its duplicate window is shorter.
 * `Publisher.checkHorizon` existed, but neither the relay nor the worker called it, so a short
 * window went unnoticed (a reviewer's note). Now a relay whose publisher names its stream compares
 * the two once at start and warns, naming both figures, when the window is shorter; it never fails.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgOutbox } from "@jetworker/sql-pg"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Context, Duration, Effect, Fiber, Layer, Logger, References, Result } from "effect"
import { SqlClient } from "effect/sql"
import { NatsLive } from "./support/services.ts"

const Live = PgOutbox.layer().pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer()),
  Layer.provideMerge(NatsLive)
)

/** A stream of this test with `duplicateWindow`, deleted with the scope; the outbox emptied. */
const streamWithWindow = (duplicateWindow: Duration.Input) =>
  Effect.gen(function*() {
    yield* SqlClient.SqlClient.use((sql) => sql`DELETE FROM jetworker_outbox`)
    const suffix = crypto.randomUUID().slice(0, 8)
    const name = `OUTBOX_WIN_${suffix.toUpperCase()}`
    const { manager } = yield* NatsConnection.NatsConnection
    yield* Topology.ensureStream({ name, subjects: [`outbox-win-${suffix}.>`], duplicateWindow })
    yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
    return name
  })

/** A logger keeping each line's level, text and `event` annotation. */
const captureLines = () => {
  const lines: Array<{ readonly level: string; readonly text: string; readonly event: unknown }> = []
  const layer = Logger.layer([Logger.make(({ fiber, logLevel, message }) => {
    const parts = Array.isArray(message) ? message : [message]
    lines.push({ level: String(logLevel), text: String(parts[0]), event: fiber.getRef(References.CurrentLogAnnotations)["event"] })
  })])
  return { lines, layer, short: () => lines.filter((line) => line.event === "outbox.duplicate_window_short") }
}

/** The outbox publisher built with `options`, as a relay gets it. */
const publisherOf = (options: Parameters<typeof Publisher.outboxPublisher>[0]) =>
  Effect.map(Layer.build(Publisher.outboxPublisher(options)), (context) => Context.get(context, Outbox.OutboxPublisher))

describe("outbox: the relay's duplicate window check", () => {
  layer(Live, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("INT-NATS-007: a relay whose stream deduplicates for less than roundBudget + the publisher's republish horizon says so at start (WARN outbox.duplicate_window_short naming both figures) and goes on running", () =>
      Effect.gen(function*() {
        const stream = yield* streamWithWindow("10 seconds")
        const retry = { attempts: 2, timeout: "1 second" } as const
        const horizon = Result.getOrThrow(Publisher.republishHorizon(retry))
        const publisher = yield* publisherOf({ stream, ...retry })
        const { layer: logger, short } = captureLines()
        const relay = yield* Effect.forkChild(PgOutbox.relay({ roundBudget: "30 seconds" }).pipe(
          Effect.provideService(Outbox.OutboxPublisher, publisher),
          Effect.provide(logger)
        ))
        yield* Eventually.poll("the relay's start warning", Effect.sync(short), (found) => found.length > 0, { timeout: "10 seconds" })
        // It goes on running: a warning, not a failure.
        assert.isUndefined(relay.pollUnsafe())
        yield* Fiber.interrupt(relay)
        const [warning] = short()
        assert.strictEqual(warning?.level, "Warn")
        const period = Duration.sum(Duration.seconds(30), horizon)
        assert.include(warning?.text, `stream ${stream} deduplicates publishes for ${Duration.format(Duration.seconds(10))}`)
        assert.include(warning?.text, `up to ${Duration.format(period)} after its first publish`)
        assert.include(warning?.text, `roundBudget ${Duration.format(Duration.seconds(30))} + republish horizon ${Duration.format(horizon)}`)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a window that covers the period (the defaults against the default 2 minutes), or a publisher naming no stream, gives no warning", () =>
      Effect.gen(function*() {
        const stream = yield* streamWithWindow("2 minutes")
        const { layer: logger, lines, short } = captureLines()
        const relay = { maxMessageBytes: Outbox.defaultMaxMessageBytes, roundBudget: Duration.seconds(30) }
        for (const options of [{ stream }, {}]) {
          const publisher = yield* publisherOf(options)
          yield* publisher.checkRelay!(relay).pipe(Effect.provide(logger))
        }
        assert.deepStrictEqual(short(), [], JSON.stringify(lines))
        // The same window against a longer round budget does warn: the check ran above.
        const publisher = yield* publisherOf({ stream })
        yield* publisher.checkRelay!({ ...relay, roundBudget: Duration.minutes(2) }).pipe(Effect.provide(logger))
        assert.lengthOf(short(), 1)
      }).pipe(Effect.scoped))
  })
})

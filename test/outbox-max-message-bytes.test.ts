/**
 * INT-NATS-007, the outbox's rule "a message that could never be published is refused when it is
 * recorded", for its size: the NATS server refuses, for good, a message (payload and headers)
 * larger than its `max_payload` (1 MiB by default, and on the server under test). Before
 * `maxMessageBytes`, `Outbox.record` took such an event without a word; every relay round then
 * failed on it (non-retryable "max_payload size exceeded") and the rows recorded after it waited
 * until someone deleted it by hand (a reviewer's reproduction, the first test here). Now `record`
 * refuses it with `OutboxError` naming its size and the limit, and the relay warns at start when
 * the server takes less than the outbox's limit.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgOutbox } from "@jetworker/sql-pg"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect, Fiber, Layer, Logger, References } from "effect"
import { SqlClient } from "effect/sql"
import { NatsLive } from "./support/services.ts"

const Live = Layer.mergeAll(PgOutbox.layer(), Publisher.outboxPublisher()).pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer()),
  Layer.provideMerge(NatsLive)
)

/** A stream of this test capturing `<prefix>.>`, deleted with the scope; the outbox emptied (the tests share a schema). */
const freshStream = Effect.gen(function*() {
  yield* SqlClient.SqlClient.use((sql) => sql`DELETE FROM jetworker_outbox`)
  const suffix = crypto.randomUUID().slice(0, 8)
  const name = `OUTBOX_BIG_${suffix.toUpperCase()}`
  const prefix = `outbox-big-${suffix}`
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Topology.ensureStream({ name, subjects: [`${prefix}.>`], duplicateWindow: "2 minutes" })
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, prefix, suffix }
})

const pendingIds = SqlClient.SqlClient.use((sql) =>
  Effect.map(sql<{ readonly id: string }>`SELECT id FROM jetworker_outbox WHERE sent_at IS NULL ORDER BY seq`, (rows) => rows.map((r) => r.id))
)

/** The server's `max_payload`, as it said when the connection opened. */
const serverMaxPayload = NatsConnection.NatsConnection.useSync(({ connection }) => connection.info?.max_payload ?? 1024 * 1024)

/** A message whose size as published (`Outbox.messageBytes`) is exactly `bytes`, with a header. */
const sized = (subject: string, id: string, bytes: number): Outbox.OutboxMessage => {
  const headers: ReadonlyArray<readonly [string, string]> = [["X-Tenant", "t1"]]
  const overhead = Outbox.messageBytes({ subject, id, payload: new Uint8Array(0), headers })
  return { subject, id, payload: new Uint8Array(bytes - overhead).fill(120), headers }
}

/** The error `effect` fails with; a test failure saying what was expected when it succeeds. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>, expected: string) =>
  Effect.flip(Effect.andThen(effect, Effect.die(new Error(`it succeeded; expected a failure: ${expected}`))))

describe("outbox: maxMessageBytes", () => {
  layer(Live, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("INT-NATS-007: an event larger than the server's max_payload is refused when recorded (OutboxError naming its size and the limit), so the events recorded after it are published", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { prefix, suffix } = yield* freshStream
        const maxPayload = yield* serverMaxPayload
        assert.strictEqual(maxPayload, 1024 * 1024, "the server under test has NATS's default max_payload")
        const big = new Uint8Array(maxPayload + 1024)
        const refused = yield* failureOf(
          sql.withTransaction(Outbox.record({ subject: `${prefix}.big`, id: `${suffix}-big`, payload: big })),
          "an event over max_payload refused"
        )
        assert.strictEqual(refused._tag, "OutboxError")
        const size = Outbox.messageBytes({ subject: `${prefix}.big`, id: `${suffix}-big`, payload: big })
        assert.include(refused.message, `${size} bytes`)
        assert.include(refused.message, `more than the ${maxPayload} bytes of maxMessageBytes`)
        yield* sql.withTransaction(Outbox.record({ subject: `${prefix}.small`, id: `${suffix}-small`, payload: new Uint8Array([1]) }))

        const round = yield* PgOutbox.relayRound()
        assert.deepStrictEqual(round, { locked: true, published: 1, full: false })
        assert.deepStrictEqual(yield* pendingIds, [], "the event recorded after it is published")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: an event of exactly maxMessageBytes as Outbox.messageBytes counts it (= the server's max_payload) is recorded and published with the headers the publisher adds; one byte more is refused", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix, suffix } = yield* freshStream
        const maxPayload = yield* serverMaxPayload
        const fits = sized(`${prefix}.fits`, `${suffix}-fits`, maxPayload)
        assert.strictEqual(Outbox.messageBytes(fits), maxPayload)
        assert.deepStrictEqual(Outbox.problems(fits), [])
        // Recorded in a trace: the published message carries a traceparent too.
        yield* sql.withTransaction(Outbox.record(fits)).pipe(Effect.withSpan("handler"))
        const over = sized(`${prefix}.over`, `${suffix}-over`, maxPayload + 1)
        assert.lengthOf(Outbox.problems(over), 1)
        const refused = yield* failureOf(sql.withTransaction(Outbox.record(over)), "one byte over refused")
        assert.include(refused.message, `${maxPayload + 1} bytes`)

        // Published with every header counted: its own, Nats-Msg-Id, Nats-Expected-Stream, traceparent.
        const round = yield* PgOutbox.relayRound().pipe(Effect.provide(Publisher.outboxPublisher({ stream: name })))
        assert.deepStrictEqual(round, { locked: true, published: 1, full: false })
        const { manager } = yield* NatsConnection.NatsConnection
        const stored = yield* Effect.promise(() => manager.streams.getMessage(name, { last_by_subj: `${prefix}.fits` }))
        assert.strictEqual(stored?.data.byteLength, fits.payload.byteLength)
        assert.isDefined(stored?.header.get("traceparent"))
        assert.strictEqual(stored?.header.get("Nats-Expected-Stream"), name)
      }).pipe(Effect.scoped))

    it.effect("a smaller maxMessageBytes refuses what is over it; one that is not a positive integer fails PgOutbox.make, layer, relay and layerRelay naming it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { prefix, suffix } = yield* freshStream
        const outbox = yield* PgOutbox.make({ maxMessageBytes: 2_000 })
        yield* sql.withTransaction(outbox.record(sized(`${prefix}.a`, `${suffix}-a`, 2_000)))
        const refused = yield* failureOf(sql.withTransaction(outbox.record(sized(`${prefix}.b`, `${suffix}-b`, 2_001))), "2001 > 2000")
        assert.include(refused.message, "2001 bytes")
        assert.include(refused.message, "more than the 2000 bytes of maxMessageBytes")
        assert.deepStrictEqual(yield* pendingIds, [`${suffix}-a`])

        for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
          const expected = `maxMessageBytes must be a positive integer (bytes), got ${bad}`
          const builds: ReadonlyArray<Effect.Effect<void, { readonly _tag: string; readonly message: string }, SqlClient.SqlClient | Outbox.OutboxPublisher>> = [
            Effect.asVoid(PgOutbox.make({ maxMessageBytes: bad })),
            Effect.asVoid(Effect.scoped(Layer.build(PgOutbox.layer({ maxMessageBytes: bad })))),
            // Bounded: an accepted relay runs until interrupted.
            Effect.asVoid(PgOutbox.relay({ maxMessageBytes: bad }).pipe(Effect.timeout("5 seconds"))),
            Effect.asVoid(Effect.scoped(Layer.build(PgOutbox.layerRelay({ maxMessageBytes: bad }))))
          ]
          for (const build of builds) {
            const error = yield* failureOf(build, expected)
            assert.strictEqual(error._tag, "OutboxError")
            assert.strictEqual(error.message, expected)
          }
        }
      }).pipe(Effect.scoped))

    it.effect("a relay whose maxMessageBytes exceeds the server's max_payload says so at start (WARN outbox.max_payload_exceeded naming both); one within it does not", () =>
      Effect.gen(function*() {
        yield* freshStream
        const maxPayload = yield* serverMaxPayload
        const lines: Array<{ readonly level: string; readonly text: string; readonly event: unknown }> = []
        const logger = Logger.layer([Logger.make(({ fiber, logLevel, message }) => {
          const parts = Array.isArray(message) ? message : [message]
          lines.push({ level: String(logLevel), text: String(parts[0]), event: fiber.getRef(References.CurrentLogAnnotations)["event"] })
        })])
        const warned = () => lines.filter((line) => line.event === "outbox.max_payload_exceeded")
        const relay = yield* Effect.forkChild(PgOutbox.relay({ maxMessageBytes: maxPayload * 8 }).pipe(Effect.provide(logger)))
        yield* Eventually.poll("the relay's start warning", Effect.sync(warned), (found) => found.length > 0, { timeout: "10 seconds" })
        yield* Fiber.interrupt(relay)
        const [warning] = warned()
        assert.strictEqual(warning?.level, "Warn")
        assert.include(warning?.text, `maxMessageBytes is ${maxPayload * 8} bytes`)
        assert.include(warning?.text, `at most ${maxPayload} (max_payload)`)

        // The check itself, run to its end: no warning at or under max_payload.
        lines.length = 0
        const publisher = yield* Outbox.OutboxPublisher
        for (const maxMessageBytes of [maxPayload, 1_000]) {
          yield* publisher.checkRelay!({ maxMessageBytes, roundBudget: Duration.seconds(30) }).pipe(Effect.provide(logger))
        }
        assert.deepStrictEqual(warned(), [])
      }).pipe(Effect.scoped))
  })
})

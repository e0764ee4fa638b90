/**
 * The transactional outbox (INT-NATS-007) against the real PostgreSQL and NATS: events recorded in
 * a transaction are published after it commits, in order, once each, with their id as
 * `Nats-Msg-Id`; a relay killed for real between a publish and marking its row sent leaves the
 * row for the next round, whose republish the stream deduplicates.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox, Telemetry } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgOutbox } from "@jetworker/sql-pg"
import { ChildWorker, Eventually, TestDatabase } from "@jetworker/testing"
import { Deferred, Duration, Effect, Fiber, Layer, Logger, Redacted, References, Stream } from "effect"
import { SqlClient } from "effect/sql"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const relayFixture = fileURLToPath(new URL("./fixtures/outbox-relay.ts", import.meta.url))

const Live = Layer.mergeAll(
  PgOutbox.layer(),
  Publisher.outboxPublisher()
).pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer()),
  Layer.provideMerge(NatsLive)
)

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A stream of this test capturing `<prefix>.>`, deleted with the scope; the outbox emptied (the tests share a schema). */
const freshStream = Effect.gen(function*() {
  yield* SqlClient.SqlClient.use((sql) => sql`DELETE FROM jetworker_outbox`)
  const suffix = crypto.randomUUID().slice(0, 8)
  const name = `OUTBOX_${suffix.toUpperCase()}`
  const prefix = `outbox-${suffix}`
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Topology.ensureStream({ name, subjects: [`${prefix}.>`], duplicateWindow: "2 minutes" })
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, prefix }
})

/** Every message of `stream`, in stream order: its subject, `Nats-Msg-Id`, payload and traceparent. */
const stored = (stream: string) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    const info = yield* Effect.promise(() => manager.streams.info(stream))
    const messages = []
    for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
      const m = yield* Effect.promise(() => manager.streams.getMessage(stream, { seq }))
      if (m === null) continue
      messages.push({
        subject: m.subject,
        msgId: m.header.get("Nats-Msg-Id"),
        payload: decoder.decode(m.data),
        traceparent: m.header.get(Telemetry.traceparentHeader)
      })
    }
    return messages
  })

const message = (prefix: string, id: string): Outbox.OutboxMessage => ({
  subject: `${prefix}.${id}`,
  id,
  payload: encoder.encode(JSON.stringify({ id }))
})

/** A logger that keeps each line's level, text and `event` annotation, for a relay's log lines. */
const captureLines = () => {
  const lines: Array<{ readonly level: string; readonly text: string; readonly event: unknown }> = []
  const logger = Logger.make(({ fiber, logLevel, message }) => {
    const parts = Array.isArray(message) ? message : [message]
    const event = fiber.getRef(References.CurrentLogAnnotations)["event"]
    lines.push({ level: String(logLevel), text: String(parts[0]), event })
  })
  return { lines, layer: Logger.layer([logger]) }
}

/** The error `effect` fails with; a test failure saying what was expected when it succeeds. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>, expected: string) =>
  Effect.flip(Effect.andThen(effect, Effect.die(new Error(`it succeeded; expected a failure: ${expected}`))))

const pendingCount = SqlClient.SqlClient.use((sql) =>
  Effect.map(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox WHERE sent_at IS NULL`, (rows) => rows[0]!.n)
)

describe("outbox", () => {
  layer(Live, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("INT-NATS-007: events recorded in a committed transaction are published after it, in order, once each, with their id as Nats-Msg-Id; a rolled-back transaction publishes nothing", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        // Sequence numbers 8 to 11: their text order (10 < 8) is not their order.
        yield* sql`ALTER SEQUENCE jetworker_outbox_seq_seq RESTART WITH 8`
        yield* sql.withTransaction(Effect.forEach(["e1", "e2", "e3"], (id) => Outbox.record(message(prefix, id)), { discard: true }))
        const rolledBack = yield* Effect.flip(sql.withTransaction(Effect.andThen(
          Outbox.record(message(prefix, "never")),
          Effect.fail("the handler failed" as const)
        )))
        assert.strictEqual(rolledBack, "the handler failed")
        yield* sql.withTransaction(Outbox.record({ ...message(prefix, "e4"), headers: [["X-Tenant", "t1"]] }))
        assert.deepStrictEqual(yield* stored(name), [], "nothing is published before the relay runs")

        const round = yield* PgOutbox.relayRound()
        assert.deepStrictEqual(round, { locked: true, published: 4, full: false })
        const messages = yield* stored(name)
        assert.deepStrictEqual(messages.map((m) => [m.subject, m.msgId, m.payload]), [
          [`${prefix}.e1`, "e1", `{"id":"e1"}`],
          [`${prefix}.e2`, "e2", `{"id":"e2"}`],
          [`${prefix}.e3`, "e3", `{"id":"e3"}`],
          [`${prefix}.e4`, "e4", `{"id":"e4"}`]
        ])
        assert.strictEqual(yield* pendingCount, 0)
        assert.deepStrictEqual(yield* PgOutbox.relayRound(), { locked: true, published: 0, full: false })
        assert.strictEqual((yield* stored(name)).length, 4, "a sent row is not published again")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: the outbox relay crashing between publish and mark: a relay process SIGKILLed after two confirmed publishes, before its commit; the next round republishes the same ids and the stream stores each once", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const schema = yield* TestDatabase.TestSchema
        const { name, prefix } = yield* freshStream
        const ids = ["a1", "a2", "a3", "a4", "a5"]
        yield* sql.withTransaction(Effect.forEach(ids, (id) => Outbox.record(message(prefix, id)), { discard: true }))
        const child = yield* ChildWorker.spawn({
          script: relayFixture,
          env: {
            DATABASE_URL: Redacted.value(schema.url) as string,
            DATABASE_SCHEMA: schema.name,
            NATS_URL: natsUrl,
            JW_KILL_AFTER: "2"
          }
        })
        yield* child.waitForLine((line) => line === "killed after a2", "30 seconds")
        const exit = yield* child.waitForExit("10 seconds")
        assert.strictEqual(exit.signal, "SIGKILL")
        // Two messages are in the stream, but their rows are still pending (the mark rolled back).
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["a1", "a2"])
        assert.strictEqual(yield* pendingCount, 5)

        const round = yield* PgOutbox.relayRound()
        assert.strictEqual(round.published, 5)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ids, "each id stored once, in order")
        assert.strictEqual(yield* pendingCount, 0)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: one relay at a time per outbox: a second relay finds the lock held and publishes nothing; a failed publish ends the round after marking the ones before it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        yield* sql.withTransaction(Effect.forEach(["b1", "b2", "b3"], (id) => Outbox.record(message(prefix, id)), { discard: true }))
        const real = yield* Outbox.OutboxPublisher
        const holding = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        // The first relay holds its round open after its first publish.
        const slow = Outbox.OutboxPublisher.of({
          publish: (m, tp) =>
            Effect.andThen(real.publish(m, tp), m.id === "b1" ? Effect.andThen(Deferred.succeed(holding, undefined), Deferred.await(release)) : Effect.void)
        })
        const first = yield* Effect.forkChild(Effect.provideService(PgOutbox.relayRound(), Outbox.OutboxPublisher, slow))
        yield* Deferred.await(holding).pipe(Effect.timeout("20 seconds"))
        assert.deepStrictEqual(yield* PgOutbox.relayRound(), { locked: false, published: 0, full: false })
        yield* Deferred.succeed(release, undefined)
        assert.strictEqual((yield* Fiber.join(first)).published, 3)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["b1", "b2", "b3"])

        // A publish to a subject no stream captures fails: the rows before it are marked sent.
        yield* sql.withTransaction(Effect.forEach(
          [message(prefix, "c1"), { ...message(prefix, "c2"), subject: `nowhere-${prefix}.c2` }, message(prefix, "c3")],
          (m) => Outbox.record(m),
          { discard: true }
        ))
        const failed = yield* Effect.flip(PgOutbox.relayRound())
        assert.strictEqual(failed._tag, "PublishFailed")
        assert.include(failed.message, `no stream captures subject nowhere-${prefix}.c2`)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["b1", "b2", "b3", "c1"])
        assert.strictEqual(yield* pendingCount, 2)
      }).pipe(Effect.scoped))

    it.effect("the outboxes of two schemas (the same table name on two search paths) have relays of their own: one holding its round does not stop the other", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        const other = yield* Layer.build(Layer.provideMerge(Layer.effectDiscard(Migrations.run), TestDatabase.layer()))
        const inOther = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provideContext(effect, other)
        yield* inOther(SqlClient.SqlClient.use((otherSql) => otherSql.withTransaction(Outbox.record(message(prefix, "o1"))).pipe(
          Effect.provideService(Outbox.Outbox, Outbox.Outbox.of({
            record: (m) => Effect.orDie(otherSql`INSERT INTO jetworker_outbox (id, subject, payload) VALUES (${m.id}, ${m.subject}, ${m.payload})`)
          }))
        )))
        const real = yield* Outbox.OutboxPublisher
        const holding = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const slow = Outbox.OutboxPublisher.of({
          publish: (m, tp) => Effect.andThen(real.publish(m, tp), Effect.andThen(Deferred.succeed(holding, undefined), Deferred.await(release)))
        })
        const otherRelay = yield* Effect.forkChild(inOther(Effect.provideService(PgOutbox.relayRound(), Outbox.OutboxPublisher, slow)))
        yield* Deferred.await(holding).pipe(Effect.timeout("20 seconds"))
        yield* sql.withTransaction(Outbox.record(message(prefix, "m1")))
        assert.deepStrictEqual(yield* PgOutbox.relayRound(), { locked: true, published: 1, full: false })
        yield* Deferred.succeed(release, undefined)
        assert.strictEqual((yield* Fiber.join(otherRelay)).published, 1)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["o1", "m1"])
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a row keeps the trace context of the transaction that wrote it: the published message continues that trace", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        const traceId = yield* sql.withTransaction(Effect.gen(function*() {
          yield* Outbox.record(message(prefix, "t1"))
          return (yield* Effect.currentSpan).traceId
        })).pipe(Effect.withSpan("handler"))
        yield* PgOutbox.relayRound()
        const [published] = yield* stored(name)
        assert.isDefined(published?.traceparent)
        assert.strictEqual(published!.traceparent!.split("-")[1], traceId)
      }).pipe(Effect.scoped))

    it.effect("a relay that starts before its table exists says so once (INFO, no warning), keeps trying, and publishes once the migrations have run", () =>
      Effect.gen(function*() {
        const { name, prefix } = yield* freshStream
        const { lines, layer: capture } = captureLines()
        // A schema of its own, without the migrations: the start-up of a worker whose migrations run later.
        yield* Effect.gen(function*() {
          const relay = yield* Effect.forkChild(
            PgOutbox.relay({ pollInterval: "20 millis", backoff: "20 millis", maxBackoff: "50 millis" }).pipe(
              Effect.provide(capture),
              Effect.provideService(References.MinimumLogLevel, "Debug")
            )
          )
          yield* Eventually.holds(
            "the relay tried again after saying it waits",
            Effect.sync(() => lines.some((line) => line.text === "outbox relay: still waiting for its table"))
          )
          yield* Migrations.run
          const sql = yield* SqlClient.SqlClient
          // The outbox on this schema, built now that its table exists (its layer refuses to build before).
          yield* sql.withTransaction(Outbox.record(message(prefix, "late"))).pipe(Effect.provide(PgOutbox.layer()))
          yield* Eventually.holds("the event is published", Effect.map(stored(name), (messages) => messages.length === 1))
          yield* Fiber.interrupt(relay)
        }).pipe(Effect.provide(TestDatabase.layer()))
        const waiting = lines.filter((line) => line.text.includes("does not exist yet; waiting for the migrations"))
        assert.strictEqual(waiting.length, 1, JSON.stringify(lines))
        assert.strictEqual(waiting[0]!.level, "Info")
        assert.deepStrictEqual(lines.filter((line) => line.level === "Warn" || line.level === "Error"), [])
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["late"])
      }).pipe(Effect.scoped))

    it.effect("a message that could never be published is refused when recorded (its transaction rolls back), and so is a record outside a transaction", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { prefix } = yield* freshStream
        const refused = [
          { ...message(prefix, "ok"), id: "order 42" },
          { ...message(prefix, "ok"), id: "x".repeat(201) },
          { ...message(prefix, "ok"), subject: `${prefix}.*` },
          { ...message(prefix, "ok"), subject: `${prefix}..double` },
          { ...message(prefix, "ok"), subject: `${prefix}.with space` },
          { ...message(prefix, "ok"), headers: [["X-Nats-Msg-Id-Copy", "1"]] as const },
          { ...message(prefix, "ok"), headers: [["X-Note", "two\nlines"]] as const }
        ]
        for (const bad of refused) {
          const error = yield* Effect.flip(sql.withTransaction(Effect.andThen(
            Outbox.record(message(prefix, "before")),
            Outbox.record(bad)
          )))
          assert.strictEqual(error._tag, "OutboxError")
          assert.include(error.message, "cannot record")
        }
        assert.strictEqual(yield* pendingCount, 0, "each transaction rolled back, the row before the bad one too")
        // What NATS publishes is taken: UTF-8 tokens, long subjects.
        assert.deepStrictEqual(Outbox.problems({ ...message(prefix, "ok"), subject: `${prefix}.münchen.${"x".repeat(1100)}` }), [])
        const outside = yield* Effect.flip(Outbox.record(message(prefix, "alone")))
        assert.include(outside.message, "runs outside a transaction")
        assert.strictEqual(yield* pendingCount, 0)
      }).pipe(Effect.scoped))

    it.effect("a round stops publishing at its budget and commits what it published; the next round goes on from there", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        const ids = Array.from({ length: 100 }, (_, n) => `r${n}`)
        yield* sql.withTransaction(Effect.forEach(ids, (id) => Outbox.record(message(prefix, id)), { discard: true }))
        // 100 confirmed publishes take far more than a millisecond: the round stops early.
        const first = yield* PgOutbox.relayRound({ roundBudget: "1 millis" })
        assert.isAtLeast(first.published, 1)
        assert.isBelow(first.published, ids.length)
        assert.isTrue(first.full, "a round cut by its budget says more may be pending")
        assert.strictEqual(yield* pendingCount, ids.length - first.published)
        while ((yield* pendingCount) > 0) yield* PgOutbox.relayRound()
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ids, "in order, once each")
        const bad = yield* Effect.flip(PgOutbox.relayRound({ roundBudget: "soon" as never }))
        assert.include(bad.message, "roundBudget must be a duration")
      }).pipe(Effect.scoped))

    it.effect("a publish that fails for good blocks the rows after it and says so as an ERROR naming the row; the clean-up keeps up with a full batch; a defect is a failed round, not the end of the relay", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        // 2500 sent rows past their retention: more than two full clean-up batches.
        yield* sql`INSERT INTO jetworker_outbox (id, subject, payload, sent_at)
                   SELECT 'old' || n, ${`${prefix}.old`}, '\\x00'::bytea, now() - interval '2 hours' FROM generate_series(1, 2500) AS n`
        const oldRows = SqlClient.SqlClient.use((sql) =>
          Effect.map(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox WHERE sent_at IS NOT NULL`, (rows) => rows[0]!.n)
        )
        yield* sql.withTransaction(Effect.forEach(
          [message(prefix, "g1"), { ...message(prefix, "g2"), subject: `nowhere-${prefix}.g2` }, message(prefix, "g3")],
          (m) => Outbox.record(m),
          { discard: true }
        ))
        const { lines, layer: capture } = captureLines()
        // The real publisher, but the first call dies (a bug in a publisher): the relay goes on.
        const real = yield* Outbox.OutboxPublisher
        let calls = 0
        const flaky = Outbox.OutboxPublisher.of({
          publish: (m, traceparent) => ++calls === 1 ? Effect.die(new Error("publisher bug")) : real.publish(m, traceparent)
        })
        const relay = yield* Effect.forkChild(
          PgOutbox.relay({ pollInterval: "20 millis", backoff: "20 millis", maxBackoff: "50 millis", cleanupBatch: 1000 }).pipe(
            Effect.provideService(Outbox.OutboxPublisher, flaky),
            Effect.provide(capture)
          )
        )
        yield* Eventually.holds(
          "the blocked row is reported",
          Effect.sync(() => lines.some((line) => line.level === "Error" && line.text.startsWith("outbox relay blocked:")))
        )
        yield* Eventually.holds("the clean-up caught up", Effect.map(oldRows, (n) => n === 1))
        yield* Fiber.interrupt(relay)
        const blocked = lines.find((line) => line.level === "Error")!
        assert.include(blocked.text, `(id g2, subject nowhere-${prefix}.g2)`)
        assert.include(blocked.text, "the rows recorded after it wait")
        assert.isTrue(lines.some((line) => line.level === "Warn" && line.text.includes("unexpected defect: publisher bug")), JSON.stringify(lines))
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["g1"], "g3 waits behind g2: nothing is skipped")
        assert.strictEqual(yield* pendingCount, 2)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a row the publisher dies on (or whose headers column is not an array of pairs) fails alone: the rows the stream confirmed before it in the round stay marked sent and are never published again", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        yield* sql.withTransaction(Effect.forEach(
          [message(prefix, "d1"), { ...message(prefix, "d2"), headers: [["X-Tenant", "t1"]] as const }],
          (m) => Outbox.record(m),
          { discard: true }
        ))
        // Written by other means (SQL, a trigger): headers as a JSON object.
        yield* sql`INSERT INTO jetworker_outbox (id, subject, payload, headers) VALUES ('d3', ${`${prefix}.d3`}, '\\x7b7d'::bytea, '{"X-Tenant":"t2"}'::jsonb)`
        yield* sql.withTransaction(Outbox.record(message(prefix, "d4")))
        const { lines, layer: capture } = captureLines()
        // The real publisher, counting its calls per id; it dies on d4 (a bug in a publisher).
        const real = yield* Outbox.OutboxPublisher
        const calls = new Map<string, number>()
        const counting = Outbox.OutboxPublisher.of({
          publish: (m, traceparent) => {
            calls.set(m.id, (calls.get(m.id) ?? 0) + 1)
            return m.id === "d4" ? Effect.die(new Error("publisher bug")) : real.publish(m, traceparent)
          }
        })
        const relay = yield* Effect.forkChild(
          PgOutbox.relay({ pollInterval: "20 millis", backoff: "20 millis", maxBackoff: "50 millis" }).pipe(
            Effect.provideService(Outbox.OutboxPublisher, counting),
            Effect.provide(capture)
          )
        )
        // Three failed rounds: before the fix, each of them published d1 and d2 again.
        yield* Eventually.holds(
          "three failed rounds",
          Effect.sync(() => lines.filter((line) => line.level === "Error" || line.level === "Warn").length >= 3)
        )
        yield* Fiber.interrupt(relay)
        assert.deepStrictEqual([calls.get("d1"), calls.get("d2"), calls.get("d4")], [1, 1, undefined], JSON.stringify([...calls]))
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["d1", "d2"])
        assert.strictEqual(yield* pendingCount, 2)
        const blocked = lines.find((line) => line.level === "Error")!
        assert.include(blocked.text, "its headers column holds {\"X-Tenant\":\"t2\"}, not a JSON array of [name, value] string pairs")

        // The defect on d4, once d3 is mended: d3 is marked, d4 is a failed round (retried), not the end.
        yield* sql`UPDATE jetworker_outbox SET headers = '[["X-Tenant","t2"]]'::jsonb WHERE id = 'd3'`
        const again = yield* Effect.flip(PgOutbox.relayRound().pipe(Effect.provideService(Outbox.OutboxPublisher, counting)))
        assert.strictEqual(again._tag, "PublishFailed")
        assert.include(again.message, "(id d4,")
        assert.include(again.message, "unexpected defect: publisher bug")
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["d1", "d2", "d3"])
        assert.strictEqual(yield* pendingCount, 1)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: roundBudget bounds a round's publishing, a publish under way included (but the round's first, which its own attempts bound): the rows confirmed before it are marked when the budget runs out", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        yield* sql.withTransaction(Effect.forEach(["h1", "h2", "h3"], (id) => Outbox.record(message(prefix, id)), { discard: true }))
        // The real publisher, but h2's publish never gets an answer (a stalled JetStream).
        const real = yield* Outbox.OutboxPublisher
        const stalling = Outbox.OutboxPublisher.of({ publish: (m, tp) => (m.id === "h2" ? Effect.never : real.publish(m, tp)) })
        const round = yield* PgOutbox.relayRound({ roundBudget: "300 millis" }).pipe(
          Effect.provideService(Outbox.OutboxPublisher, stalling),
          // Without the cut, the round would wait for h2 for ever.
          Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.die(new Error("the round outlived its budget")) })
        )
        assert.deepStrictEqual(round, { locked: true, published: 1, full: true })
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["h1"])
        assert.strictEqual(yield* pendingCount, 2)
        // The real publisher goes on from there.
        assert.strictEqual((yield* PgOutbox.relayRound()).published, 2)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["h1", "h2", "h3"])
        const zero = yield* Effect.flip(PgOutbox.relayRound({ roundBudget: 0 }))
        assert.include(zero.message, "roundBudget must be longer than zero")
      }).pipe(Effect.scoped))

    it.effect("the clean-up deletes sent rows past their retention, at most a batch at a time, never a pending one, and none with an infinite retention", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { prefix } = yield* freshStream
        yield* sql.withTransaction(Effect.forEach(["d1", "d2", "d3", "d4"], (id) => Outbox.record(message(prefix, id)), { discard: true }))
        yield* PgOutbox.relayRound()
        yield* sql.withTransaction(Outbox.record(message(prefix, "d5")))
        yield* sql`UPDATE jetworker_outbox SET sent_at = now() - interval '2 hours' WHERE sent_at IS NOT NULL`
        // Kept for ever: nothing is deleted (and the clean-up does not fail).
        assert.strictEqual(yield* PgOutbox.cleanup({ retention: Duration.infinity }), 0)
        assert.strictEqual(yield* PgOutbox.cleanup({ cleanupBatch: 3 }), 3)
        assert.strictEqual(yield* PgOutbox.cleanup({ cleanupBatch: 3 }), 1)
        assert.strictEqual(yield* PgOutbox.cleanup({ cleanupBatch: 3 }), 0)
        assert.strictEqual(yield* pendingCount, 1)
        const bad = yield* Effect.flip(PgOutbox.cleanup({ cleanupBatch: 0 }))
        assert.include(bad.message, "cleanupBatch must be an integer from 1 to 10000")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a subject longer than a NATS control line takes (Outbox.maxSubjectBytes) is refused when recorded; such a row written by other means blocks the relay (not retryable) and the shared connection stays up", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { prefix } = yield* freshStream
        // 4096 bytes is the server's default control line: this one would make it close the connection.
        const subject = `${prefix}.${"x".repeat(4200)}`
        const refused = yield* failureOf(sql.withTransaction(Outbox.record({ ...message(prefix, "long-1"), subject })), "a 4200-byte subject refused")
        assert.strictEqual(refused._tag, "OutboxError")
        assert.include(refused.message, `bytes, more than the ${Outbox.maxSubjectBytes} that fit a NATS control line`)
        // The bound counts UTF-8 bytes: "ü" is two.
        const fits = `${prefix}.${"x".repeat(Outbox.maxSubjectBytes - prefix.length - 1)}`
        assert.deepStrictEqual(Outbox.problems({ ...message(prefix, "ok"), subject: fits }), [])
        assert.lengthOf(Outbox.problems({ ...message(prefix, "ok"), subject: `${fits.slice(0, -1)}ü` }), 1)
        assert.strictEqual(yield* pendingCount, 0)

        // Written by other means (SQL, a trigger): the publisher refuses it before sending.
        yield* sql`INSERT INTO jetworker_outbox (id, subject, payload) VALUES ('long-2', ${subject}, '\\x7b7d'::bytea)`
        const { connection } = yield* NatsConnection.NatsConnection
        // Every status the client reports from now on (a disconnect, a reconnect).
        const events: Array<string> = []
        yield* Stream.fromAsyncIterable(connection.status(), (error) => error).pipe(
          Stream.runForEach((status) => Effect.sync(() => events.push(status.type))),
          Effect.ignore,
          Effect.forkScoped
        )
        const failed = yield* Effect.flip(PgOutbox.relayRound().pipe(
          Effect.provide(Publisher.outboxPublisher({ attempts: 1, timeout: "2 seconds" }))
        ))
        // A round trip after the round: a connection the server closed would have said so by now.
        yield* Effect.promise(() => connection.flush())
        assert.strictEqual(failed._tag, "PublishFailed")
        assert.deepStrictEqual(
          { retryable: (failed as Outbox.PublishFailed).retryable, events, closed: connection.isClosed() },
          { retryable: false, events: [], closed: false },
          failed.message.replace(/x{20,}/, "x…x")
        )
        assert.include(failed.message, `more than the ${Outbox.maxSubjectBytes} that fit a NATS control line`)
        assert.strictEqual(yield* pendingCount, 1)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a row no stream captures blocks the relay as outbox.relay_blocked (ERROR) also when the publisher names its stream (as the reference worker does), the rows after it waiting", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { name, prefix } = yield* freshStream
        yield* sql.withTransaction(Effect.forEach(
          [message(prefix, "n1"), { ...message(prefix, "n2"), subject: `nowhere-${prefix}.n2` }, message(prefix, "n3")],
          (m) => Outbox.record(m),
          { discard: true }
        ))
        const { lines, layer: capture } = captureLines()
        const relay = yield* Effect.forkChild(
          PgOutbox.relay({ pollInterval: "20 millis", backoff: "20 millis", maxBackoff: "50 millis" }).pipe(
            Effect.provide(Publisher.outboxPublisher({ stream: name, attempts: 2, timeout: "500 millis" })),
            Effect.provide(capture)
          )
        )
        const failures = () => lines.filter((line) => line.level === "Warn" || line.level === "Error")
        yield* Eventually.holds("three failed rounds are logged", Effect.sync(() => failures().length >= 3), "20 seconds")
        yield* Fiber.interrupt(relay)
        assert.deepStrictEqual(
          failures().map((line) => [line.level, line.event]),
          failures().map(() => ["Error", "outbox.relay_blocked"]),
          failures()[0]?.text
        )
        assert.include(failures()[0]!.text, `(id n2, subject nowhere-${prefix}.n2): no stream captures subject nowhere-${prefix}.n2 (expected stream ${name}`)
        assert.deepStrictEqual((yield* stored(name)).map((m) => m.msgId), ["n1"], "n3 waits behind n2: nothing is skipped")
        assert.strictEqual(yield* pendingCount, 2)
      }).pipe(Effect.scoped))

    it.effect("a relay whose pauses could be zero (backoff, maxBackoff, pollInterval) or whose maxBackoff is below its backoff is refused at start, naming the setting, rather than spinning on a blocked row", () =>
      Effect.gen(function*() {
        yield* freshStream
        const refused: Array<readonly [PgOutbox.RelayOptions, string]> = [
          [{ backoff: "0 millis" }, "backoff must be longer than zero"],
          [{ maxBackoff: "0 millis" }, "maxBackoff must be longer than zero"],
          [{ pollInterval: 0 }, "pollInterval must be longer than zero"],
          [{ backoff: "2 seconds", maxBackoff: "1 second" }, "maxBackoff must be at least backoff"]
        ]
        for (const [options, expected] of refused) {
          const error = yield* failureOf(Layer.build(PgOutbox.layerRelay(options)), `${JSON.stringify(options)} refused: ${expected}`)
          assert.include(error.message, expected)
        }
        // The relay itself refuses before its first round (bounded: an accepted one runs until interrupted).
        const error = yield* Effect.flip(PgOutbox.relay({ backoff: "0 millis", maxBackoff: "0 millis" }).pipe(Effect.timeout("5 seconds")))
        assert.strictEqual(error._tag, "OutboxError")
        assert.include(error.message, "backoff must be longer than zero")
      }).pipe(Effect.scoped))
  })
})

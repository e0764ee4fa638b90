/**
 * Outbox ids are unique per event, against the real PostgreSQL and NATS: the relay publishes each
 * row with its id as `Nats-Msg-Id`, and the stream keeps one message per id within its duplicate
 * window, so a second event recorded under an id still in the outbox would be marked sent while
 * the stream dropped it. `Outbox.record` refuses it instead, failing its transaction.
 */
import { assert, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import * as TestStream from "../../testing/src/TestStream.ts"
import * as PgOutbox from "../src/PgOutbox.ts"
import { awaitLockWaiters, backendPid, database } from "./support.ts"

const Live = Layer.mergeAll(
  Layer.provideMerge(PgOutbox.layer(), database()),
  Publisher.outboxPublisher()
).pipe(Layer.provideMerge(NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222", name: "sql-pg-outbox-unique-id" })))

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** One event of the test stream's subjects: `payload` tells two events apart. */
const event = (stream: TestStream.TestStream, id: string, payload: string): Outbox.OutboxMessage => ({
  subject: stream.subject(id),
  id,
  payload: encoder.encode(payload)
})

/** Every message the stream stores, in stream order, as `[Nats-Msg-Id, payload]`. */
const storedMessages = (stream: TestStream.TestStream) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    const info = yield* Effect.promise(() => manager.streams.info(stream.stream))
    const messages: Array<readonly [string | undefined, string]> = []
    for (let seq = info.state.first_seq; info.state.messages > 0 && seq <= info.state.last_seq; seq++) {
      const m = yield* Effect.promise(() => manager.streams.getMessage(stream.stream, { seq }))
      if (m !== null) messages.push([m.header.get("Nats-Msg-Id"), decoder.decode(m.data)])
    }
    return messages
  })

/** The outbox rows the relay marked sent, in order, as `[id, payload]`. */
const sentRows = SqlClient.SqlClient.use((sql) =>
  Effect.map(
    sql<{ readonly id: string; readonly payload: Uint8Array }>`SELECT id, payload FROM jetworker_outbox WHERE sent_at IS NOT NULL ORDER BY seq`,
    (rows) => rows.map((row) => [row.id, decoder.decode(row.payload)] as const)
  )
)

/** The error `effect` fails with; a test failure saying what was expected when it succeeds. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>, expected: string) =>
  Effect.flip(Effect.andThen(effect, Effect.die(new Error(`it succeeded; expected a failure: ${expected}`))))

const emptyOutbox = SqlClient.SqlClient.use((sql) => Effect.asVoid(sql`DELETE FROM jetworker_outbox`))

layer(Live, { excludeTestServices: true, timeout: 60_000 })("PgOutbox ids unique per event", (it) => {
  it.effect("INT-NATS-007: a second event recorded under an id already in the outbox fails its transaction with OutboxError naming the id; every row marked sent is in the stream, none silently dropped as a duplicate", () =>
    Effect.gen(function*() {
      yield* emptyOutbox
      const sql = yield* SqlClient.SqlClient
      const stream = yield* TestStream.make({ prefix: "OUTBOX_UNIQ" })
      // An id derived from the aggregate (the order) instead of the event: two events share it.
      yield* sql.withTransaction(Outbox.record(event(stream, "order-7", "order-7 placed")))
      const second = yield* Effect.result(sql.withTransaction(Outbox.record(event(stream, "order-7", "order-7 shipped"))))
      yield* sql.withTransaction(Outbox.record(event(stream, "order-8", "order-8 placed")))
      const round = yield* PgOutbox.relayRound()

      // What the relay marked sent is what the stream holds: nothing marked sent was dropped.
      assert.deepStrictEqual(
        yield* storedMessages(stream),
        yield* sentRows,
        "every row marked sent reached the stream"
      )
      assert.deepStrictEqual(yield* storedMessages(stream), [["order-7", "order-7 placed"], ["order-8", "order-8 placed"]])
      assert.strictEqual(round.published, 2)
      // The mistake is loud: the second record failed, and its transaction rolled back.
      assert.strictEqual(second._tag, "Failure", "recording a second event under order-7 must fail")
      if (second._tag === "Failure") {
        const error = second.failure
        assert.strictEqual(error._tag, "OutboxError")
        assert.include(error.message, `"order-7"`)
        assert.include(error.message, "ids must be unique per event")
      }
    }).pipe(Effect.scoped))

  it.effect("INT-NATS-007: two records with one id in one transaction fail it as a whole: neither event is recorded", () =>
    Effect.gen(function*() {
      yield* emptyOutbox
      const sql = yield* SqlClient.SqlClient
      const stream = yield* TestStream.make({ prefix: "OUTBOX_UNIQ" })
      const error = yield* failureOf(sql.withTransaction(Effect.andThen(
        Outbox.record(event(stream, "twice", "first")),
        Outbox.record(event(stream, "twice", "second"))
      )), "the second record of \"twice\" refused")
      assert.strictEqual(error._tag, "OutboxError")
      assert.include(error.message, `"twice"`)
      assert.include(error.message, "ids must be unique per event")
      const [rows] = yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox`
      assert.strictEqual(rows?.n, 0, "the transaction rolled back, the first record with it")
    }).pipe(Effect.scoped))

  it.effect("INT-NATS-007: of two concurrent transactions recording one id, the second waits for the first and fails once it commits; once the first rolls back instead, the id is free", () =>
    Effect.gen(function*() {
      yield* emptyOutbox
      const sql = yield* SqlClient.SqlClient
      const stream = yield* TestStream.make({ prefix: "OUTBOX_UNIQ" })
      const run = (outcome: "commit" | "rollback", id: string) =>
        Effect.gen(function*() {
          const recorded = yield* Deferred.make<number>()
          const release = yield* Deferred.make<void>()
          const first = yield* Effect.forkChild(Effect.result(sql.withTransaction(Effect.gen(function*() {
            yield* Outbox.record(event(stream, id, "first"))
            yield* Deferred.succeed(recorded, yield* backendPid)
            yield* Deferred.await(release)
            if (outcome === "rollback") return yield* Effect.fail("rolled back" as const)
          }))))
          const holder = yield* Deferred.await(recorded).pipe(Effect.timeout("10 seconds"))
          const second = yield* Effect.forkChild(Effect.result(sql.withTransaction(Outbox.record(event(stream, id, "second")))))
          // The second insert waits on the first's uncommitted row, as PostgreSQL reports.
          yield* awaitLockWaiters(holder)
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(first).pipe(Effect.timeout("10 seconds"))
          return yield* Fiber.join(second).pipe(Effect.timeout("10 seconds"))
        })
      const afterCommit = yield* run("commit", "race-1")
      assert.strictEqual(afterCommit._tag, "Failure")
      if (afterCommit._tag === "Failure") assert.include(afterCommit.failure.message, "ids must be unique per event")
      const afterRollback = yield* run("rollback", "race-2")
      assert.strictEqual(afterRollback._tag, "Success", String(afterRollback))
      const rows = yield* sql<{ readonly id: string; readonly payload: Uint8Array }>`SELECT id, payload FROM jetworker_outbox ORDER BY seq`
      assert.deepStrictEqual(rows.map((row) => [row.id, decoder.decode(row.payload)]), [["race-1", "first"], ["race-2", "second"]])
    }).pipe(Effect.scoped))

  it.effect("INT-NATS-007: a row the clean-up deleted (past its retention) frees its id for a new record", () =>
    Effect.gen(function*() {
      yield* emptyOutbox
      const sql = yield* SqlClient.SqlClient
      const stream = yield* TestStream.make({ prefix: "OUTBOX_UNIQ" })
      yield* sql.withTransaction(Outbox.record(event(stream, "reused", "long ago")))
      assert.strictEqual((yield* PgOutbox.relayRound()).published, 1)
      // Sent two hours ago: past the default retention (one hour), and any sane duplicate window.
      yield* sql`UPDATE jetworker_outbox SET sent_at = now() - interval '2 hours'`
      const refused = yield* failureOf(
        sql.withTransaction(Outbox.record(event(stream, "reused", "now"))),
        "a sent row still in the table keeps its id"
      )
      assert.include(refused.message, "ids must be unique per event", "a sent row still in the table keeps its id")
      assert.strictEqual(yield* PgOutbox.cleanup(), 1)
      yield* sql.withTransaction(Outbox.record(event(stream, "reused", "now")))
      const [pending] = yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_outbox WHERE sent_at IS NULL AND id = 'reused'`
      assert.strictEqual(pending?.n, 1)
    }).pipe(Effect.scoped))
})

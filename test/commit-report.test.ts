/**
 * The outcome tells what happened to the effect, not what the handler returned: the idempotency
 * store reports "already committed" and "committed" to the engine through the delivery's context
 * (BE-JOB-002), so a handler that maps or discards `commit`'s result still ends `Duplicate`, and
 * an interruption that lands while `COMMIT` is in flight, by a shutdown or by `handlerTimeout`, ends
 * `Committed` (the ack withheld), not "rolled back" nor a failed attempt. Against the real NATS
 * server and PostgreSQL.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, IdempotencyStore, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { DateTime, Effect, Fiber, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })
const payload = (id: string) => JSON.stringify({ id })

const effects = Effect.fnUntraced(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS report_effects (id text PRIMARY KEY)`
  return (id: string) => sql`INSERT INTO report_effects (id) VALUES (${id})`.pipe(Effect.asVoid)
})

/** A deferred constraint trigger runs at COMMIT: it holds each COMMIT with a new row for 2 s of work. */
const slowCommits = SqlClient.SqlClient.use((sql) =>
  Effect.gen(function*() {
    yield* sql.unsafe(`
      CREATE OR REPLACE FUNCTION report_slow_commit() RETURNS trigger AS $$
      BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$ LANGUAGE plpgsql`)
    yield* sql.unsafe(`DROP TRIGGER IF EXISTS report_slow_commit ON report_effects`)
    yield* sql.unsafe(`
      CREATE CONSTRAINT TRIGGER report_slow_commit AFTER INSERT ON report_effects
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION report_slow_commit()`)
  }))

const effectCount = (id: string) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM report_effects WHERE id = ${id}`.pipe(
      Effect.map((rows) => rows[0]?.n ?? 0)
    ))

/** What every consumer here shares: the stream's durable, the event, its id, and the outcomes logged. */
const consumerOf = (stream: TestStream.TestStream, log: OutcomeLog.OutcomeLog) => ({
  name: stream.consumer,
  source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
  schema: Event,
  metadata,
  classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" } as const,
  onOutcome: log.record
})

/** A 500 ms handler bound and two attempts without in-process retries: a timeout counted as a failure shows. */
const cutAfterHalfASecond = {
  handlerTimeout: "500 millis",
  retry: Retry.exponential({ attempts: 2, base: "10 millis", inProcessRetries: 0 })
} as const

describe("the store reports to the engine", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-002: sequential redelivery of an event whose handler discards commit's result still ends Duplicate", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream, log),
          // The handler maps the result away: the engine cannot learn "duplicate" from it.
          handle: (event) => IdempotencyStore.commit(event.id, insert(event.id)).pipe(Effect.asVoid),
          // One at a time: the republish runs after the first delivery has committed.
          concurrency: 1
        })))
        const id = `report-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), `${id}.1`)
        yield* stream.publish("a", payload(id), `${id}.2`) // a republish past the stream's window
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds", "two outcomes")
        yield* Fiber.interrupt(fiber)
        // By stream sequence: outcomes are recorded as their acks are confirmed, in either order.
        assert.deepStrictEqual(
          [...outcomes].sort((a, b) => a.message.sequence - b.message.sequence).map((o) => o._tag),
          ["Committed", "Duplicate"]
        )
        assert.strictEqual(yield* effectCount(id), 1)
      }))

    it.effect("BE-JOB-002: an interruption that lands during COMMIT reports Committed with the ack withheld, and the redelivery is a Duplicate", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        const sql = yield* SqlClient.SqlClient
        yield* slowCommits
        const options = consumerOf(stream, log)
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...options,
          handle: (event) => IdempotencyStore.commit(event.id, insert(event.id)),
          drainTimeout: "0 millis" // shutdown interrupts running handlers at once
        })))
        const id = `commit-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), id)
        // Wait for this COMMIT to be running on the server (sleeping in the deferred trigger: other
        // test files commit on the same database), then shut the consumer down.
        yield* Eventually.holds(
          "the COMMIT is in flight",
          sql<{ readonly n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE state = 'active' AND query = 'COMMIT' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()`.pipe(Effect.map((rows) => (rows[0]?.n ?? 0) > 0)),
          "10 seconds"
        )
        yield* Fiber.interrupt(fiber)
        const [outcome] = yield* log.all
        assert.strictEqual(outcome?._tag, "Committed", JSON.stringify(outcome))
        assert.strictEqual(outcome?._tag === "Committed" ? outcome.ackWithheld : undefined, "Interrupted")
        assert.isFalse(outcome!.confirmed, "no ack was sent")
        assert.strictEqual(yield* effectCount(id), 1, "the effect is committed")
        // Redelivered (never acked), it settles as a duplicate.
        const again = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...options,
          handle: (event) => IdempotencyStore.commit(event.id, insert(event.id))
        })))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds", "the redelivery")
        yield* Fiber.interrupt(again)
        assert.strictEqual(outcomes[1]!._tag, "Duplicate")
        assert.strictEqual(yield* effectCount(id), 1)
      }))

    it.effect("BE-JOB-002: a handler timeout that lands during COMMIT reports Committed with the ack withheld, not a failed attempt, and the redelivery is a Duplicate", () =>
      Effect.gen(function*() {
        // Each COMMIT takes 2 s, the handler's bound is 500 ms, and there are no in-process retries:
        // a timeout counted as a failed attempt would end Released ("rolled back", retrying) for a
        // committed effect, and on the last attempt dead-letter it. (Two attempts: without an attempt
        // store the engine counts the redelivery itself as a failed attempt.)
        const stream = yield* TestStream.make({ ackWait: "4 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        yield* slowCommits
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream, log),
          ...cutAfterHalfASecond,
          handle: (event) => IdempotencyStore.commit(event.id, insert(event.id))
        })))
        const id = `timeout-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), id)
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "20 seconds", "the outcome and the redelivery's")
        yield* Fiber.interrupt(fiber)
        const [first, second] = outcomes
        assert.strictEqual(first?._tag, "Committed", JSON.stringify(first))
        assert.strictEqual(first?._tag === "Committed" ? first.ackWithheld : undefined, "HandlerTimeout")
        assert.isFalse(first!.confirmed, "no ack was sent")
        assert.strictEqual(second?._tag, "Duplicate", JSON.stringify(second))
        assert.strictEqual(yield* effectCount(id), 1, "the effect is committed once")
      }))

    it.effect("BE-JOB-003: a handler timeout in work after a commit that already returned is a failed attempt (the redelivery runs that work again)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        yield* sql.unsafe(`DROP TRIGGER IF EXISTS report_slow_commit ON report_effects`)
        const stream = yield* TestStream.make({ ackWait: "4 seconds" })
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream, log),
          ...cutAfterHalfASecond,
          // The commit returns at once; the work after it outlives the bound.
          handle: (event) => Effect.andThen(IdempotencyStore.commit(event.id, insert(event.id)), Effect.sleep("5 seconds"))
        })))
        const id = `after-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), id)
        const [first] = yield* log.waitUntil((all) => all.length >= 1, "10 seconds", "the outcome")
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(first?._tag, "Released", JSON.stringify(first))
        assert.strictEqual(first?._tag === "Released" ? first.error?.tag : undefined, "HandlerTimeout")
        assert.strictEqual(yield* effectCount(id), 1, "the effect is committed")
      }))
  })
})

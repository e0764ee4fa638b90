/**
 * What the engine makes of a batch handler's run (BE-JOB-007), against the real NATS server and
 * PostgreSQL: a result array that is not one `Result` per element (a hole, a value that throws
 * when read) still gives every element an outcome; an element that interrupts itself fails alone
 * instead of passing for a shutdown of the whole batch; and a handler that maps
 * `commitBatch`'s values still ends an already-committed event `Duplicate`, because the store's
 * reports decide as they do for a single delivery. The engine's own cuts (a shutdown past its
 * drain, a lost lease) still release the whole batch.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, InMemoryBroker, InMemoryIdempotencyStore, OutcomeLog, TestStream } from "@jetworker/testing"
import { DateTime, Deferred, Effect, Fiber, Logger, Result, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })
const payload = (id: string) => JSON.stringify({ id })

const effects = Effect.fnUntraced(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS batch_result_effects (id text PRIMARY KEY)`
  return (id: string) => sql`INSERT INTO batch_result_effects (id) VALUES (${id})`.pipe(Effect.asVoid)
})

const effectRows = (prefix: string) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly id: string }>`SELECT id FROM batch_result_effects WHERE id LIKE ${`${prefix}%`} ORDER BY id`.pipe(
      Effect.map((rows) => rows.map((row) => row.id))
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

const tagsOf = (outcomes: ReadonlyArray<Outcome.Outcome>, id: string) =>
  outcomes.filter((o) => o.message.eventId === id).map((o) => o._tag)

/** Warning lines, captured. */
const warnings = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const parts = Array.isArray(message) ? message : [message]
    if (logLevel === "Warn") lines.push(parts.map((part) => (typeof part === "string" ? part : JSON.stringify(part))).join(" "))
  })
  return { lines, layer: Logger.layer([logger]) }
}

describe("batch results", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-JOB-007: a result array with a hole fails the batch as a whole: each element runs alone and gets its outcome", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "2 seconds" })
        const log = yield* OutcomeLog.make
        const captured = warnings()
        const p = `hole-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(`${p}.1`), `${p}.1`)
        yield* stream.publish("a", payload(`${p}.2`), `${p}.2`)
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          classify: {},
          batch: { maxSize: 2, maxWait: "500 millis" },
          // The right length, but only the first entry set: a hole where the second result should be.
          handleBatch: (events) =>
            Effect.sync(() => {
              const results = new Array<Result.Result<unknown, never>>(events.length)
              results[0] = Result.succeed(undefined)
              return results
            })
        })).pipe(Effect.provide(captured.layer)))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "10 seconds", "an outcome for both elements")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual([tagsOf(outcomes, `${p}.1`), tagsOf(outcomes, `${p}.2`)], [["Committed"], ["Committed"]])
        assert.isTrue(outcomes.every((o) => o.confirmed && o.message.deliveryCount === 1), JSON.stringify(outcomes))
        assert.isTrue(
          captured.lines.some((line) => line.includes("failed as a whole") && line.includes("BatchResultInvalid")),
          captured.lines.join("\n")
        )
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
        assert.strictEqual(info.num_redelivered, 0)
      }))

    it.effect("BE-JOB-007: a defect while the engine reads the batch's results dead-letters every element with the cause (Defect), none is left hanging", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "2 seconds" })
        const log = yield* OutcomeLog.make
        const p = `proxy-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(`${p}.1`), `${p}.1`)
        yield* stream.publish("a", payload(`${p}.2`), `${p}.2`)
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          classify: {},
          batch: { maxSize: 2, maxWait: "500 millis" },
          // An array (for `Array.isArray`) whose entries throw when read: user code that dies in the engine's hands.
          handleBatch: (events) =>
            Effect.sync(() =>
              new Proxy(events.map(() => Result.succeed(undefined)), {
                get: (target, key, receiver) => {
                  if (typeof key === "string" && /^\d+$/.test(key)) throw new Error(`result ${key} is unreadable`)
                  return Reflect.get(target, key, receiver)
                }
              })
            )
        })))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "10 seconds", "an outcome for both elements")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(
          outcomes.map((o) => [o.message.eventId, o._tag, o._tag === "DeadLettered" ? o.reason : ""]).sort(),
          [[`${p}.1`, "DeadLettered", "Defect"], [`${p}.2`, "DeadLettered", "Defect"]]
        )
        const first = outcomes[0]!
        assert.match(first._tag === "DeadLettered" ? first.error.message : "", /unreadable/)
        yield* Eventually.holds("nothing pending on the broker", Effect.map(stream.info, (info) => info.num_ack_pending === 0), "5 seconds")
      }))

    it.effect("BE-JOB-007: an element that interrupts itself fails alone; its siblings commit on their first delivery", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        const p = `self-${crypto.randomUUID()}`
        const [ok1, poison, ok3] = [`${p}.ok1`, `${p}.poison`, `${p}.ok3`]
        for (const id of [ok1, poison, ok3]) yield* stream.publish("a", payload(id), id)
        // Joins a child fiber it interrupted: the element's own interruption, not the engine's.
        const selfInterrupt = Effect.andThen(Effect.forkChild(Effect.never), (child) => Effect.andThen(Fiber.interrupt(child), Fiber.join(child)))
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          batch: { maxSize: 3, maxWait: "500 millis" },
          retry: Retry.exponential({ attempts: 2, base: "50 millis" }),
          handleBatch: (events) =>
            IdempotencyStore.commitBatch(events.map((e) => ({ id: e.id, effect: e.id === poison ? selfInterrupt : insert(e.id) })))
        })))
        const outcomes = yield* log.waitUntil(
          (all) => tagsOf(all, ok1).length > 0 && tagsOf(all, ok3).length > 0 && tagsOf(all, poison).length > 0,
          "15 seconds",
          "an outcome for each element"
        )
        yield* Fiber.interrupt(fiber)
        const firstOf = (id: string) => outcomes.find((o) => o.message.eventId === id)!
        assert.deepStrictEqual([firstOf(ok1)._tag, firstOf(ok3)._tag], ["Committed", "Committed"], JSON.stringify(outcomes))
        assert.deepStrictEqual([firstOf(ok1).message.deliveryCount, firstOf(ok3).message.deliveryCount], [1, 1])
        // Alone, the poison ends as a single delivery's self-interruption does: a failed attempt,
        // released for a retry under the policy (not at once, without spending one).
        const poisoned = firstOf(poison)
        assert.deepStrictEqual([poisoned._tag, poisoned._tag === "Released" ? poisoned.reason : ""], ["Released", "Retrying"])
        assert.include(poisoned._tag === "Released" ? poisoned.error?.message : "", "interrupted by itself")
        assert.deepStrictEqual(yield* effectRows(p), [ok1, ok3])
      }))

    it.effect("BE-JOB-002: a batch handler that maps commitBatch's values still ends a redelivered committed event Duplicate", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        const id = `mapped-${crypto.randomUUID()}`
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          batch: { maxSize: 2, maxWait: "50 millis" },
          // The values are mapped away: the engine cannot learn "already committed" from them.
          handleBatch: (events) =>
            Effect.map(
              IdempotencyStore.commitBatch(events.map((e) => ({ id: e.id, effect: insert(e.id) }))),
              (results) => results.map(Result.map(() => "applied"))
            )
        })))
        yield* stream.publish("a", payload(id), `${id}-first`)
        yield* log.waitUntil((all) => all.length >= 1, "10 seconds", "the first outcome")
        yield* stream.publish("a", payload(id), `${id}-again`) // the same event, a new message
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "10 seconds", "the second outcome")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Duplicate"])
        assert.deepStrictEqual(yield* effectRows(id), [id])
      }))

    it.effect("BE-JOB-002: the same event twice in one batch, values mapped: one Committed, one Duplicate, one effect", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        const id = `twice-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), `${id}-first`)
        yield* stream.publish("a", payload(id), `${id}-again`)
        const sizes: Array<number> = []
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          batch: { maxSize: 2, maxWait: "500 millis" },
          handleBatch: (events) =>
            Effect.andThen(
              Effect.sync(() => sizes.push(events.length)),
              Effect.map(
                IdempotencyStore.commitBatch(events.map((e) => ({ id: e.id, effect: insert(e.id) }))),
                (results) => results.map(Result.map(() => "applied"))
              )
            )
        })))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "10 seconds", "both outcomes")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(sizes, [2], "both copies in one batch")
        assert.deepStrictEqual(outcomes.map((o) => [o.message.sequence, o._tag]).sort(), [[1, "Committed"], [2, "Duplicate"]])
        assert.deepStrictEqual(yield* effectRows(id), [id])
      }))
  })
})

describe("batch results: the engine's own cuts", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-007: a shutdown past its drain releases every element of a running batch (Interrupted), none runs alone", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const started = yield* Deferred.make<void>()
        const p = `cut-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(`${p}.1`), `${p}.1`)
        yield* stream.publish("a", payload(`${p}.2`), `${p}.2`)
        const sizes: Array<number> = []
        const captured = warnings()
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          ...consumerOf(stream, log),
          classify: {},
          batch: { maxSize: 2, maxWait: "500 millis" },
          drainTimeout: "0 millis", // shutdown interrupts the running batch at once
          handleBatch: (events) =>
            Effect.andThen(Effect.sync(() => sizes.push(events.length)), Effect.andThen(Deferred.succeed(started, undefined), Effect.never))
        })).pipe(Effect.provide(captured.layer)))
        yield* Eventually.deferred("the batch handler to run", started, "10 seconds")
        yield* Fiber.interrupt(fiber)
        const outcomes = yield* log.all
        assert.deepStrictEqual(sizes, [2], "no element ran alone after the cut")
        assert.isFalse(captured.lines.some((line) => line.includes("failed as a whole")), captured.lines.join("\n"))
        assert.deepStrictEqual(
          outcomes.map((o) => [o.message.eventId, o._tag, o._tag === "Released" ? o.reason : ""]).sort(),
          [[`${p}.1`, "Released", "Interrupted"], [`${p}.2`, "Released", "Interrupted"]]
        )
      }))
  })

  it.effect("BE-JOB-006: a batch whose lease is lost is released as a whole (LeaseLost), none runs alone; the redelivery commits", () =>
    Effect.gen(function*() {
      // Every extension fails: the first run (2 s) outlives its 600 ms lease and is cut.
      const broker = InMemoryBroker.make({ lease: "600 millis", faults: { extendFails: 1 } })
      const store = InMemoryIdempotencyStore.make()
      for (const id of ["e1", "e2"]) yield* broker.publish(JSON.stringify({ id }))
      const outcomes: Array<Outcome.Outcome> = []
      const sizes: Array<number> = []
      let runs = 0
      const consumer = Consumer.makeBatch({
        name: "lease-cut",
        source: broker.source,
        schema: Event,
        metadata,
        batch: { maxSize: 2, maxWait: "100 millis" },
        handleBatch: (events) =>
          Effect.andThen(
            Effect.sync(() => sizes.push(events.length)),
            Effect.andThen(
              runs++ === 0 ? Effect.sleep("2 seconds") : Effect.void,
              IdempotencyStore.commitBatch(events.map((e) => ({ id: e.id, effect: Effect.void })))
            )
          ),
        classify: { IdempotencyError: "isRetryable" },
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
      for (let i = 0; i < 100 && outcomes.length < 4; i++) yield* TestClock.adjust("50 millis")
      yield* Fiber.interrupt(fiber)
      const first = outcomes.filter((o) => o.message.deliveryCount === 1)
      // Released, not run alone: the element whose lease the keeper found lost first says LeaseLost
      // (the keeper marks each lease as its own time runs out).
      assert.deepStrictEqual(first.map((o) => [o.message.eventId, o._tag]).sort(), [["e1", "Released"], ["e2", "Released"]], JSON.stringify(outcomes))
      assert.isTrue(first.some((o) => o._tag === "Released" && o.reason === "LeaseLost"), JSON.stringify(first))
      assert.deepStrictEqual(
        outcomes.filter((o) => o.message.deliveryCount === 2).map((o) => [o.message.eventId, o._tag]).sort(),
        [["e1", "Committed"], ["e2", "Committed"]]
      )
      assert.strictEqual(sizes[0], 2)
      assert.isTrue(sizes.every((size) => size === 2), `no element ran alone: ${JSON.stringify(sizes)}`)
    }))
})

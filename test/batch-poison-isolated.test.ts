/**
 * BE-JOB-007: a batch that fails as a whole runs each element alone, "so a poison element fails by
 * itself and cannot hold the others back". Before, the elements ran alone one after another, each
 * with all its in-process retries, and none was settled until the last had its verdict: a poison
 * that hung held every sibling's ack for its whole alone run (its attempt and its retries, each up
 * to `handlerTimeout`: 4.6 s here, about two minutes per batch with the defaults), and an element
 * behind it did not even run until the poison's retries were over. Now every element's first run
 * alone comes before any element's in-process retries, and each element is settled as soon as its
 * verdict is reached; a shutdown during the poison's retries still releases it (Interrupted),
 * unacked, while the siblings settled before stay acked.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { InMemoryBroker, OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, Data, DateTime, Duration, Effect, Fiber, Result, Schema } from "effect"
import { TestClock } from "effect/testing"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })
const payload = (id: string) => JSON.stringify({ id })

describe("a poison element of a batch (real NATS and PostgreSQL)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-007: a poison element that hangs does not hold its siblings back: they are committed and acked within the batch's timeout and the poison's first run alone, not after the poison's in-process retries", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "10 seconds" })
        const log = yield* OutcomeLog.make
        const p = `hang-${crypto.randomUUID()}`
        const [ok1, poison, ok3] = [`${p}.ok1`, `${p}.poison`, `${p}.ok3`]
        // When each outcome was settled, in ms from the first run of the batch handler.
        const settledAt = new Map<string, number>()
        let startedAt: number | undefined
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.makeBatch({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata,
          classify: { IdempotencyError: "isRetryable" },
          // The batch's run and each element's run alone are cut at 1 s; the default retry policy
          // gives an element run alone 2 in-process retries.
          handlerTimeout: "1 second",
          batch: { maxSize: 3, maxWait: "500 millis" },
          handleBatch: (events) =>
            Effect.andThen(
              Clock.currentTimeMillis.pipe(Effect.map((now) => {
                startedAt ??= now
              })),
              IdempotencyStore.commitBatch(events.map((e) => ({ id: e.id, effect: e.id === poison ? Effect.never : Effect.void })))
            ),
          onOutcome: (outcome: Outcome.Outcome) =>
            Effect.andThen(
              Clock.currentTimeMillis.pipe(Effect.map((now) => {
                if (!settledAt.has(outcome.message.eventId ?? "")) settledAt.set(outcome.message.eventId ?? "", now - (startedAt ?? now))
              })),
              log.record(outcome)
            )
        })))
        for (const id of [ok1, poison, ok3]) yield* stream.publish("a", payload(id), id)
        const has = (all: ReadonlyArray<Outcome.Outcome>, id: string) => all.some((o) => o.message.eventId === id)
        yield* log.waitUntil((all) => has(all, ok1) && has(all, ok3), "30 seconds", "an outcome for each sibling")
        // The siblings' acks are on the broker while the poison's retries still run (about 3 s more).
        const whileRetried = yield* stream.info
        const outcomes = yield* log.waitUntil((all) => has(all, poison), "30 seconds", "an outcome for the poison")
        yield* Fiber.interrupt(fiber)
        const first = (id: string) => outcomes.find((o) => o.message.eventId === id)!
        assert.deepStrictEqual(
          [first(ok1)._tag, first(ok3)._tag, first(ok1).confirmed, first(ok3).confirmed],
          ["Committed", "Committed", true, true],
          JSON.stringify(outcomes)
        )
        const timing = JSON.stringify(Object.fromEntries(settledAt))
        assert.isFalse(has(outcomes.slice(0, outcomes.indexOf(first(ok3))), poison), `the siblings settled first (${timing})`)
        assert.strictEqual(whileRetried.num_ack_pending, 1, `only the poison unacked while it was retried (${timing})`)
        // The whole run is cut at 1 s; a sibling's own run alone is instant, and ok3 runs after the
        // poison's first run alone (cut at 1 s): ok1 at about 1 s, ok3 at about 2 s. The bounds
        // leave room for a loaded machine and are well short of the poison's runs alone: 3 of 1 s
        // plus their delays (before, every element settled with the poison, at about 4.6 s).
        assert.isBelow(settledAt.get(ok1)!, 2_000, `ok1 settled ${settledAt.get(ok1)} ms after the batch started (${timing})`)
        assert.isBelow(settledAt.get(ok3)!, 3_000, `ok3 settled ${settledAt.get(ok3)} ms after the batch started (${timing})`)
        assert.isAtLeast(settledAt.get(poison)!, 3_500, `the poison settled after its runs alone (${timing})`)
      }))
  })
})

/** A dependency that is down for the poison element, whatever it is asked: transient. */
class Unavailable extends Data.TaggedError("Unavailable")<{}> {}

/**
 * A batch consumer over `broker` in batches of three, whose handler fails the whole run when the
 * batch holds `poison` and fails `poison` alone every time; `runs` records each run's events and
 * `outcomes` each outcome with the test clock's time.
 */
const poisonedBatches = (broker: InMemoryBroker.InMemoryBroker, poison: string) => {
  const runs: Array<string> = []
  const outcomes: Array<{ readonly at: number; readonly outcome: Outcome.Outcome }> = []
  const consumer = Consumer.makeBatch({
    name: "poisoned",
    source: broker.source,
    schema: Event,
    metadata,
    classify: { Unavailable: "transient" },
    // In-process retries after 1 s and 2 s: the poison's alone run takes 3 s of the test clock.
    retry: Retry.exponential({ attempts: 5, base: "1 second", jitter: false, inProcessRetries: 2, inProcessMaxDelay: "2 seconds" }),
    drainTimeout: "0 millis",
    batch: { maxSize: 3, maxWait: "100 millis" },
    handleBatch: (events) =>
      Effect.suspend(() => {
        runs.push(events.map((e) => e.id).join(","))
        return events.some((e) => e.id === poison)
          ? Effect.fail(new Unavailable())
          : Effect.succeed(events.map(() => Result.succeed(undefined)))
      }),
    onOutcome: (outcome) =>
      Effect.flatMap(Clock.currentTimeMillis, (at) => Effect.sync(() => void outcomes.push({ at, outcome })))
  })
  return { consumer, runs, outcomes }
}

const ids = (outcomes: ReadonlyArray<{ readonly outcome: Outcome.Outcome }>) => outcomes.map(({ outcome }) => outcome.message.eventId)

describe("a poison element of a batch (in memory, test clock)", () => {
  it.effect("BE-JOB-007: every element runs alone once before the poison's in-process retries, and each is settled as soon as its verdict is reached", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      for (const id of ["e1", "e2", "e3"]) yield* broker.publish(payload(id))
      const t = poisonedBatches(broker, "e2")
      const fiber = yield* Effect.forkChild(Consumer.run(t.consumer))
      const start = yield* Clock.currentTimeMillis
      for (let i = 0; i < 100 && t.outcomes.length < 3; i++) yield* TestClock.adjust("100 millis")
      yield* Fiber.interrupt(fiber)
      // Before, e3 ran alone only after the poison's two retries: e1, e2, e2, e2, e3.
      assert.deepStrictEqual(t.runs, ["e1,e2,e3", "e1", "e2", "e3", "e2", "e2"])
      assert.deepStrictEqual(ids(t.outcomes), ["e1", "e3", "e2"], "the siblings settled before the poison's retries")
      const [e1, e3, e2] = t.outcomes
      assert.deepStrictEqual([e1!.outcome._tag, e3!.outcome._tag, e1!.outcome.confirmed, e3!.outcome.confirmed], ["Committed", "Committed", true, true])
      assert.isBelow(e3!.at - start, 1_000, "e3 settled without waiting for the poison's retry delays")
      assert.deepStrictEqual(
        [e2!.outcome._tag, e2!.outcome._tag === "Released" ? e2!.outcome.reason : undefined],
        ["Released", "Retrying"],
        "the poison alone fails, its attempt spent"
      )
      assert.isAtLeast(e2!.at - e3!.at, Duration.toMillis("3 seconds"), "the poison's retries ran after e3 settled")
      const acked = broker.events().filter((event) => event._tag === "Acked").map((event) => event.sequence)
      assert.deepStrictEqual(acked, [1, 3])
    }))

  it.effect("BE-JOB-007, BE-SHUT-002: a shutdown during the poison's in-process retries releases it (Interrupted), unacked; the siblings settled before stay acked", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      for (const id of ["e1", "e2", "e3"]) yield* broker.publish(payload(id))
      const t = poisonedBatches(broker, "e2")
      const fiber = yield* Effect.forkChild(Consumer.run(t.consumer))
      for (let i = 0; i < 100 && t.outcomes.length < 2; i++) yield* TestClock.adjust("100 millis")
      assert.deepStrictEqual(ids(t.outcomes), ["e1", "e3"], "the siblings settled while the poison waits for its retry")
      let stopped = false
      yield* Effect.forkChild(Effect.ensuring(Fiber.interrupt(fiber), Effect.sync(() => {
        stopped = true
      })))
      for (let i = 0; i < 100 && !stopped; i++) yield* TestClock.adjust("10 millis")
      assert.isTrue(stopped, "the consumer stopped")
      assert.deepStrictEqual(ids(t.outcomes), ["e1", "e3", "e2"])
      const poisoned = t.outcomes[2]!.outcome
      assert.deepStrictEqual([poisoned._tag, poisoned._tag === "Released" ? poisoned.reason : undefined], ["Released", "Interrupted"])
      assert.deepStrictEqual(t.runs, ["e1,e2,e3", "e1", "e2", "e3"], "no retry ran after the cut")
      const settledOn = (tag: "Acked" | "Naked") => broker.events().filter((event) => event._tag === tag).map((event) => event.sequence)
      assert.deepStrictEqual([settledOn("Acked"), settledOn("Naked")], [[1, 3], [2]])
    }))
})

/**
 * Ordering and concurrency (BE-JOB-004) against the real NATS and PostgreSQL: per-key ordering
 * (same-key handlers never overlap and run in the order received, other keys in parallel; the
 * ledger's per-account ordering reaches the balances of the sequential order from an interleaved,
 * parallel delivery) and the declared sequential model (one at a time, in stream order across a
 * redelivery, refused without `max_ack_pending` 1). The load test of the limits is in
 * limits.test.ts.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Envelope, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, Duration, Effect, Fiber, Schema } from "effect"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import * as RiskCheck from "../examples/ledger/src/RiskCheck.ts"
import { balances, ledgerStream, openAccount, transfer, uniquePrefix } from "./support/ledger.ts"
import { generator } from "./support/random.ts"
import { LedgerTestLive } from "./support/services.ts"

const Job = Envelope.schema("test.job", Schema.Struct({ key: Schema.String, n: Schema.Number }))
const job = (id: string, key: string, n: number) =>
  JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { key, n } })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/** `items` in an order drawn from `seed`. */
const shuffled = <A>(items: ReadonlyArray<A>, seed: number): Array<A> => {
  const random = generator(seed)
  const out = [...items]
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

describe("ordering (BE-JOB-004)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-JOB-004: two messages with the same key: their handlers never overlap and run in the order received, while other keys run in parallel", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const keys = ["k0", "k1", "k2", "k3"]
        // Five jobs per key, interleaved across keys in a seeded random order.
        const jobs = shuffled(keys.flatMap((key) => [1, 2, 3, 4, 5].map((n) => ({ key, n }))), 4)
        for (const [i, j] of jobs.entries()) yield* stream.publish(j.key, job(`j${i}`, j.key, j.n), `j${i}`)
        let running = 0
        let maxRunning = 0
        const runningByKey = new Map<string, number>()
        const overlaps: Array<string> = []
        const doneByKey = new Map<string, Array<number>>()
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: { perKey: (event) => event.data.key, maxQueuedPerKey: 2 },
          handle: (event) => {
            const key = event.data.key
            return Effect.gen(function*() {
              running++
              maxRunning = Math.max(maxRunning, running)
              const same = (runningByKey.get(key) ?? 0) + 1
              runningByKey.set(key, same)
              if (same > 1) overlaps.push(`${same} handlers of ${key} at once (job ${event.data.n})`)
              // The work itself: long enough that an overlap or a reorder would show.
              yield* Effect.sleep("25 millis")
              doneByKey.set(key, [...(doneByKey.get(key) ?? []), event.data.n])
            }).pipe(Effect.ensuring(Effect.sync(() => {
              running--
              runningByKey.set(key, runningByKey.get(key)! - 1)
            })))
          },
          classify: {},
          concurrency: 8,
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const outcomes = yield* log.waitUntil((all) => all.length >= jobs.length, "30 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => o._tag).filter((t) => t !== "Committed"), [])
        assert.deepStrictEqual(overlaps, [])
        for (const key of keys) {
          const published = jobs.filter((j) => j.key === key).map((j) => j.n)
          assert.deepStrictEqual(doneByKey.get(key), published, `order of ${key}`)
        }
        assert.isAbove(maxRunning, 1, "different keys ran in parallel")
      }))

    it.effect("BE-JOB-004: permuted and parallel delivery: with per-account ordering the ledger ends with the balances (and the refusals) of the sequential order", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(30), concurrency: 8, ordering: "per-account" })
        const p = uniquePrefix("ordered")
        const payers = [0, 1, 2, 3].map((i) => `${p}.payer${i}`)
        const sink = `${p}.sink`
        for (const payer of payers) yield* openAccount(payer, "EUR", 100_00)
        yield* openAccount(sink, "EUR", 0)
        // Six debits per payer, more than its balance in all: which ones are refused depends on
        // their order. Interleaved across payers, published in one seeded order.
        const random = generator(41)
        const transfers = shuffled(
          payers.flatMap((payer, i) =>
            [1, 2, 3, 4, 5, 6].map((k) => ({ id: `${p}.t${i}.${k}`, from: payer, amount: (10 + Math.floor(random() * 40)) * 100 }))
          ),
          42
        )
        // The sequential order: the publish order, one transfer at a time.
        const expected: Record<string, bigint> = Object.fromEntries([...payers.map((a) => [a, 100_00n]), [sink, 0n]])
        const refused: Array<string> = []
        for (const t of transfers) {
          if (expected[t.from]! >= BigInt(t.amount)) {
            expected[t.from] = expected[t.from]! - BigInt(t.amount)
            expected[sink] = expected[sink]! + BigInt(t.amount)
          } else refused.push(t.id)
        }
        assert.isNotEmpty(refused, "the workload has refusals that depend on the order")
        for (const t of transfers) yield* stream.publish("eur", transfer(t.id, t.from, sink, t.amount), t.id)
        const log = yield* OutcomeLog.make
        // A risk check that answers after 0 to 30 ms: without per-account ordering, a later debit
        // of the same payer would often overtake an earlier one.
        const jitter = generator(43)
        const slowRisk = Effect.provideService(RiskCheck.RiskCheck, { check: () => Effect.sleep(Math.floor(jitter() * 30)) })
        const fiber = yield* Effect.forkChild(Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(slowRisk))
        const outcomes = yield* log.waitUntil((all) => all.length >= transfers.length, "30 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(yield* balances([...payers, sink]), expected)
        const deadLettered = outcomes.filter((o) => o._tag === "DeadLettered").map((o) => o.message.eventId).sort()
        assert.deepStrictEqual(deadLettered, [...refused].sort(), "refused exactly the transfers the sequential order refuses")
      }))

    it.effect("BE-JOB-004: sequential processing as a declared model: one at a time in stream order, also across a redelivery", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds", maxAckPending: 1 })
        const log = yield* OutcomeLog.make
        for (let n = 1; n <= 5; n++) yield* stream.publish("a", job(`s${n}`, "all", n), `s${n}`)
        const order: Array<string> = []
        let running = 0
        let maxRunning = 0
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: "sequential",
          handle: (event) =>
            Effect.gen(function*() {
              running++
              maxRunning = Math.max(maxRunning, running)
              const { deliveryCount } = yield* CurrentDelivery.CurrentDelivery
              order.push(`${event.data.n}#${deliveryCount}`)
              // Job 2 fails its first delivery: naked with a delay, redelivered before job 3.
              if (event.data.n === 2 && deliveryCount === 1) return yield* new Flaky({ message: "first delivery fails" })
            }).pipe(Effect.ensuring(Effect.sync(() => running--))),
          classify: { Flaky: "transient" },
          retry: Retry.exponential({ attempts: 3, base: "300 millis", cap: "1 second", inProcessRetries: 0 }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* log.waitUntil((all) => all.filter((o) => o._tag === "Committed").length >= 5, "20 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(order, ["1#1", "2#1", "2#2", "3#1", "4#1", "5#1"])
        assert.strictEqual(maxRunning, 1)
      }))

    it.effect("BE-JOB-004: sequential processing is refused without max_ack_pending 1, and with a concurrency above 1", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ maxAckPending: 100 })
        const options = {
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: "sequential" as const,
          handle: () => Effect.void,
          classify: {}
        }
        const failure = yield* Effect.flip(Consumer.run(Consumer.make(options))).pipe(Effect.timeout("10 seconds"))
        assert.strictEqual(failure._tag, "SourceError")
        assert.match(failure.message, /max_ack_pending 100; sequential ordering needs 1/)
        const tooMany = Consumer.make({ ...options, concurrency: 4 })
        assert.deepStrictEqual(tooMany.problems.map((p) => p.option), ["concurrency"])
      }))
  })
})

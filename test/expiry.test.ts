/**
 * Work expiry (BE-JOB-005) against the real NATS and PostgreSQL: an event past its deadline has
 * no business effect and is counted apart; a handler that waited on a dependency (a row lock held
 * by another transaction) past the deadline stops before its effect; the producer's clock is
 * compared with the broker's, and expiry is judged on the consumer's clock with its allowance.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Expiry, IdempotencyStore, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog } from "@jetworker/testing"
import { Clock, DateTime, Deferred, Effect, Fiber, Metric } from "effect"
import { SqlClient } from "effect/sql"
import { applyTransfer } from "../examples/ledger/src/Ledger.ts"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { metadata, toJson, TransferEvent } from "../examples/ledger/src/TransferEvent.ts"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts } from "./support/ledger.ts"
import { LedgerTestLive } from "./support/services.ts"

/** The sum of a metric of consumer `name` whose other attributes match `where`. */
const metricValue = (id: string, name: string, where: Record<string, string> = {}) =>
  Effect.map(Metric.snapshot, (snapshots) =>
    snapshots
      .filter((m) =>
        m.id === id && m.attributes?.consumer === name &&
        Object.entries(where).every(([k, v]) => m.attributes?.[k] === v)
      )
      .reduce((sum, m) => {
        const state = m.state as { readonly count?: number | bigint; readonly value?: number | bigint }
        return sum + Number(state.count ?? state.value ?? 0)
      }, 0))

/** How the tests' own transfer handlers (the ledger's effect, without its risk check) classify errors. */
const transferErrors = {
  UnknownAccount: "permanent",
  InsufficientFunds: "permanent",
  CurrencyMismatch: "permanent",
  SqlError: "isRetryable",
  IdempotencyError: "isRetryable"
} as const

describe("expiry (BE-JOB-005)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-005: delivery before and after expiry: the fresh transfer applies; the expired one has no business effect, is acked, and counts in its own expiry metric", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const { p, a, b } = yield* twoAccounts("expiry")
        const log = yield* OutcomeLog.make
        const before = yield* metricValue("jetworker.expired", settings.consumer, { stage: "BeforeHandler" })
        const now = DateTime.makeUnsafe(Date.now())
        const fresh = `${p}.fresh`
        const stale = `${p}.stale`
        yield* stream.publish("eur", transfer(fresh, a, b, 1_00, { expiresAt: DateTime.add(now, { hours: 1 }) }), fresh)
        yield* stream.publish("eur", transfer(stale, a, b, 1_00, { expiresAt: DateTime.subtract(now, { minutes: 1 }) }), stale)
        const fiber = yield* Effect.forkChild(Consumer.run(LedgerWorker.consumer(settings, log.record)))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds")
        yield* Fiber.interrupt(fiber)
        const tagOf = (id: string) => outcomes.find((o) => o.message.eventId === id)?._tag
        assert.deepStrictEqual([tagOf(fresh), tagOf(stale)], ["Committed", "Expired"])
        const expired = outcomes.find((o) => o.message.eventId === stale)!
        assert.strictEqual(expired._tag === "Expired" ? expired.stage : undefined, "BeforeHandler")
        assert.isTrue(expired.confirmed, "acked: the contract's default for expired work")
        assert.deepStrictEqual(Object.fromEntries(yield* transferCounts([fresh, stale])), { [fresh]: 1 })
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
        assert.strictEqual((yield* metricValue("jetworker.expired", settings.consumer, { stage: "BeforeHandler" })) - before, 1)
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
      }))

    it.effect("BE-JOB-005: expiry while waiting for a dependency: a handler blocked on a row lock past the deadline checks Expiry.ensure and stops before its effect", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const { p, a, b } = yield* twoAccounts("lockwait")
        const log = yield* OutcomeLog.make
        const sql = yield* SqlClient.SqlClient
        const id = `${p}.t1`
        const expiresAt = DateTime.makeUnsafe(Date.now() + 1_500)
        // Another transaction holds the payer's row until the test lets it go.
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* Effect.forkChild(sql.withTransaction(Effect.gen(function*() {
          yield* sql`SELECT 1 FROM accounts WHERE id = ${a} FOR UPDATE`
          yield* Deferred.succeed(locked, undefined)
          yield* Deferred.await(release)
        })))
        yield* Eventually.deferred("the row lock", locked)
        const consumer = Consumer.make({
          name: settings.consumer,
          source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
          schema: TransferEvent,
          metadata,
          handle: (event) =>
            IdempotencyStore.commit(
              event.id,
              Effect.gen(function*() {
                // The dependency: the payer's row, locked elsewhere; then the deadline check.
                yield* sql`SELECT 1 FROM accounts WHERE id = ${event.from} FOR UPDATE`
                yield* Expiry.ensure
                yield* applyTransfer(event)
              })
            ),
          classify: transferErrors,
          retry: Retry.exponential({ attempts: 3 }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* stream.publish("eur", transfer(id, a, b, 1_00, { expiresAt }), id)
        // The handler waits on the lock; once the deadline has passed, the lock goes.
        yield* Eventually.holds(
          "the handler waiting on the lock",
          sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%' AND pid <> pg_backend_pid()`.pipe(
            Effect.map((rows) => (rows[0]?.n ?? 0) > 0)
          )
        )
        yield* Eventually.holds(
          "the deadline to pass",
          Effect.map(Clock.currentTimeMillis, (now) => now > expiresAt.epochMilliseconds)
        )
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        const outcomes = yield* log.waitUntil((all) => all.length >= 1, "15 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => [o._tag, o._tag === "Expired" ? o.stage : ""]), [["Expired", "AfterWait"]])
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [], "no business effect")
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n, [b]: 0n })
      }))

    it.effect("BE-JOB-005: producer/consumer clock consistency: a producer clock 10 minutes ahead shows in the skew metric; expiry is judged on the consumer's clock with its skew allowance", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const { p, a, b } = yield* twoAccounts("skew")
        const log = yield* OutcomeLog.make
        const ahead = `${p}.ahead`
        const recent = `${p}.recent`
        const producerNow = DateTime.makeUnsafe(Date.now() + 10 * 60_000) // the producer's clock
        yield* stream.publish(
          "eur",
          toJson({ id: ahead, from: a, to: b, amount: 1_00, currency: "EUR", createdAt: producerNow }),
          ahead
        )
        const consumer = Consumer.make({
          name: settings.consumer,
          source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
          schema: TransferEvent,
          metadata,
          handle: (event) => IdempotencyStore.commit(event.id, applyTransfer(event)),
          classify: transferErrors,
          concurrency: 1,
          expiry: { skew: "5 seconds" },
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const first = yield* log.waitUntil((all) => all.length >= 1, "15 seconds")
        // The last skew seen is the first message's: about ten minutes, negative (producer ahead).
        const skew = yield* metricValue("jetworker.producer.clock_skew", settings.consumer)
        assert.strictEqual(first[0]!.message.eventId, ahead)
        assert.isBelow(Math.abs(skew + 10 * 60_000), 5_000, `skew ${skew} ms`)
        // Expired 2 s ago on the consumer's clock, inside the 5 s allowance: still applied.
        yield* stream.publish(
          "eur",
          transfer(recent, a, b, 1_00, { expiresAt: DateTime.makeUnsafe(Date.now() - 2_000) }),
          recent
        )
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Committed"])
        assert.deepStrictEqual(Object.fromEntries(yield* transferCounts([ahead, recent])), { [ahead]: 1, [recent]: 1 })
      }))
  })
})

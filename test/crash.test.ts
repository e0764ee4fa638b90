/**
 * Crash tests (BE-JOB-001, BE-JOB-002): the ledger worker runs as a child process
 * (`test/fixtures/ledger-worker.ts`) against the real NATS and PostgreSQL, kills itself with
 * SIGKILL at a named probe point, and is started again without the crash. The tests then read
 * the database and the consumer's state on the server: every transfer applied exactly once,
 * money unchanged, nothing left unacked.
 */
import { assert, describe, layer } from "@effect/vitest"
import * as Probe from "@jetworker/core/Probe"
import { DeadLetter } from "@jetworker/nats"
import { ChildWorker, Eventually, TestDatabase, TestStream } from "@jetworker/testing"
import { Duration, Effect } from "effect"
import { SqlClient } from "effect/sql"
import { fileURLToPath } from "node:url"
import {
  balances,
  dedupRowExists,
  openAccount,
  settingsFor,
  totalBalance,
  transfer,
  transferCounts,
  twoAccounts,
  uniquePrefix,
  workerEnv
} from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"

const fixture = fileURLToPath(new URL("./fixtures/ledger-worker.ts", import.meta.url))

/** One `outcome <json>` line of the fixture. */
interface OutcomeLine {
  readonly tag: string
  readonly sequence: number
  readonly deliveryCount: number
  readonly eventId: string | undefined
  readonly confirmed: boolean
}

const parseOutcome = (line: string): OutcomeLine | undefined =>
  line.startsWith("outcome ") ? JSON.parse(line.slice("outcome ".length)) as OutcomeLine : undefined

const outcomesOf = (child: ChildWorker.ChildWorker) =>
  Effect.map(child.lines, (lines) => lines.flatMap((line) => parseOutcome(line) ?? []))

/**
 * The tags of the outcomes `child` printed for `eventId`, in order. A delivery that stalls past
 * the lease (a loaded machine) may be delivered once more and settle as a harmless `Duplicate`,
 * so tests check the tags that are not `Duplicate` exactly and allow extra `Duplicate`s.
 */
const tagsFor = (child: ChildWorker.ChildWorker, eventId: string) =>
  Effect.map(outcomesOf(child), (outcomes) => outcomes.filter((o) => o.eventId === eventId).map((o) => o.tag))

const notDuplicate = (tags: ReadonlyArray<string>) => tags.filter((tag) => tag !== "Duplicate")

/** Re-reads `probe` every 100 ms until `done` holds, at most `timeout`. */
const eventually = <A, E, R>(probe: Effect.Effect<A, E, R>, done: (a: A) => boolean, timeout: Duration.Input, what: string) =>
  Eventually.poll(what, probe, done, { timeout, interval: "100 millis" })

interface Crash {
  readonly point: Probe.Point
  readonly onHit?: number
}

/** Starts the fixture on `stream` and the test's schema (crashing as `crash` says) and waits until intake is open. */
const startWorker = (stream: TestStream.TestStream, crash?: Crash) =>
  Effect.gen(function*() {
    const schema = yield* TestDatabase.TestSchema
    const settings = settingsFor(stream, { ackWait: Duration.seconds(2) })
    const child = yield* ChildWorker.spawn({
      script: fixture,
      env: {
        ...workerEnv(settings, schema.name, databaseUrl, natsUrl),
        ...(crash === undefined
          ? {}
          : { JW_CRASH_AT: crash.point, JW_CRASH_ON_HIT: String(crash.onHit ?? 1) })
      }
    })
    yield* child.waitForLine((line) => line.includes("started on"), "20 seconds")
    return child
  })

/** Waits for the child's crash line and its death by SIGKILL; returns the line. */
const crashed = (child: ChildWorker.ChildWorker, point: Probe.Point) =>
  Effect.gen(function*() {
    const line = yield* child.waitForLine((line) => line.startsWith("crash at "), "30 seconds")
    const status = yield* child.waitForExit("10 seconds")
    assert.deepStrictEqual(status, { code: null, signal: "SIGKILL" }, "the worker died by SIGKILL")
    assert.isTrue(line.startsWith(`crash at ${point} `), line)
    return line
  })

/** Waits for the first outcome the child prints for `eventId`. */
const outcomeFor = (child: ChildWorker.ChildWorker, eventId: string) =>
  child.waitForLine((line) => parseOutcome(line)?.eventId === eventId, "20 seconds").pipe(
    Effect.map((line) => parseOutcome(line)!)
  )


/** Waits (bounded) until the consumer has nothing left to deliver and nothing waiting for an ack. */
const drained = (stream: TestStream.TestStream) =>
  eventually(
    stream.info,
    (info) => info.num_ack_pending === 0 && info.num_pending === 0,
    "20 seconds",
    `consumer ${stream.stream}/${stream.consumer} to have nothing pending`
  )

describe("crash", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect(
      "BE-JOB-001: crash before the commit: the killed attempt's transaction rolls back (no effect, no dedup row) and after restart the transfer is applied exactly once",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make()
          const { p, a, b } = yield* twoAccounts("before-commit")
          const id = `${p}.t1`

          const first = yield* startWorker(stream, { point: "before-commit" })
          const seq = yield* stream.publish("eur", transfer(id, a, b, 30_00), id)
          const line = yield* crashed(first, "before-commit")
          assert.strictEqual(line, `crash at before-commit seq=${seq} event=${id}`)
          assert.deepStrictEqual(yield* outcomesOf(first), [], "the killed worker settled nothing")
          // Killed inside the open transaction: nothing of it is committed.
          assert.isFalse(yield* dedupRowExists(stream.consumer, id), "no dedup row after the killed attempt")
          assert.strictEqual((yield* transferCounts([id])).get(id), undefined)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n, [b]: 0n })
          assert.strictEqual((yield* stream.info).num_ack_pending, 1, "the message was not acked")

          const second = yield* startWorker(stream)
          const outcome = yield* outcomeFor(second, id)
          // Committed, not Duplicate: the killed attempt left no dedup row behind.
          assert.deepInclude(outcome, { tag: "Committed", sequence: seq, confirmed: true })
          assert.isAtLeast(outcome.deliveryCount, 2, "it was a redelivery")
          yield* drained(stream)
          assert.isTrue(yield* dedupRowExists(stream.consumer, id))
          assert.strictEqual((yield* transferCounts([id])).get(id), 1)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
          assert.strictEqual(yield* totalBalance([a, b]), 100_00n)
          assert.deepStrictEqual(notDuplicate(yield* tagsFor(second, id)), ["Committed"], "committed once")
        })
    )

    it.effect(
      "BE-JOB-001: crash after the commit: a worker killed between the commit and the ack is redelivered after restart as a Duplicate, applied exactly once",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make()
          const { p, a, b } = yield* twoAccounts("after-commit")
          const id = `${p}.t1`

          const first = yield* startWorker(stream, { point: "after-commit" })
          const seq = yield* stream.publish("eur", transfer(id, a, b, 30_00), id)
          const line = yield* crashed(first, "after-commit")
          assert.strictEqual(line, `crash at after-commit seq=${seq} event=${id}`)
          assert.deepStrictEqual(yield* outcomesOf(first), [])
          // Committed but not acked.
          assert.isTrue(yield* dedupRowExists(stream.consumer, id))
          assert.strictEqual((yield* transferCounts([id])).get(id), 1)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
          assert.strictEqual((yield* stream.info).num_ack_pending, 1, "the message was not acked")

          const second = yield* startWorker(stream)
          const outcome = yield* outcomeFor(second, id)
          assert.deepInclude(outcome, { tag: "Duplicate", sequence: seq, confirmed: true })
          assert.isAtLeast(outcome.deliveryCount, 2)
          yield* drained(stream)
          assert.strictEqual((yield* transferCounts([id])).get(id), 1)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
          assert.strictEqual(yield* totalBalance([a, b]), 100_00n)
        })
    )

    it.effect(
      "BE-JOB-002: restart between the effect and the ack: the redelivered message ends Duplicate, the effect is not repeated and nothing stays ack-pending",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make()
          const p = uniquePrefix("effect-ack")
          const [a, b, id] = [`${p}.a`, `${p}.b`, `${p}.t1`]
          yield* openAccount(a, "EUR", 50_00)
          yield* openAccount(b, "EUR", 10_00)

          const first = yield* startWorker(stream, { point: "after-commit" })
          const seq = yield* stream.publish("eur", transfer(id, a, b, 50_00), id)
          yield* crashed(first, "after-commit")
          // The effect is done (it emptied `a`: a repeat would fail on funds, not just on the dedup row).
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 0n, [b]: 60_00n })
          const before = yield* stream.info
          assert.strictEqual(before.num_ack_pending, 1, "the effect is committed but the message is not acked")

          const second = yield* startWorker(stream)
          const outcome = yield* outcomeFor(second, id)
          assert.deepInclude(outcome, { tag: "Duplicate", sequence: seq, confirmed: true })
          assert.isAtLeast(outcome.deliveryCount, 2)
          const after = yield* drained(stream)
          assert.strictEqual(after.num_ack_pending, 0)
          assert.strictEqual(after.num_pending, 0)
          // Every delivery after the restart was a Duplicate: the effect was not repeated.
          assert.deepStrictEqual(notDuplicate(yield* tagsFor(second, id)), [])
          assert.strictEqual((yield* transferCounts([id])).get(id), 1)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 0n, [b]: 60_00n })
        })
    )

    it.effect(
      "BE-JOB-003: crash after a refused transfer's dead letter is stored, before its term: the account funded meanwhile, the restarted worker dead-letters the redelivery again without running the handler, and the transfer is never applied",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make()
          const { p, a, b } = yield* twoAccounts("after-dead-letter")
          const id = `${p}.t1`
          // How many times a worker's handler was about to run for the transfer (the fixture's `received` lines).
          const runsIn = (child: ChildWorker.ChildWorker) =>
            Effect.map(child.lines, (lines) => lines.filter((line) => line.startsWith("received ") && line.includes(`"${id}"`)).length)
          const letters = Effect.map(DeadLetter.list(stream.deadLetterStream), (all) => all.map((l) => [l.eventId, l.reason]))

          const first = yield* startWorker(stream, { point: "after-dead-letter" })
          // 150.00 from an account holding 100.00: refused (InsufficientFunds, permanent).
          const seq = yield* stream.publish("eur", transfer(id, a, b, 150_00), id)
          const line = yield* crashed(first, "after-dead-letter")
          assert.strictEqual(line, `crash at after-dead-letter seq=${seq} event=${id}`)
          assert.deepStrictEqual(yield* outcomesOf(first), [], "the killed worker settled nothing")
          assert.strictEqual(yield* runsIn(first), 1)
          assert.deepStrictEqual(yield* letters, [[id, "PermanentError"]], "the dead letter is stored")
          assert.strictEqual((yield* stream.info).num_ack_pending, 1, "the original was not terminated")

          // The world changes: the account is funded; a second run of the handler would now apply the transfer.
          const sql = yield* SqlClient.SqlClient
          yield* sql`UPDATE accounts SET balance = balance + ${100_00} WHERE id = ${a}`
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 200_00n, [b]: 0n })

          const second = yield* startWorker(stream)
          const outcome = yield* outcomeFor(second, id)
          assert.deepInclude(outcome, { tag: "DeadLettered", sequence: seq, confirmed: true })
          assert.isAtLeast(outcome.deliveryCount, 2, "it was a redelivery")
          yield* drained(stream)
          assert.strictEqual(yield* runsIn(second), 0, "the restarted worker did not run the handler")
          assert.deepStrictEqual(yield* tagsFor(second, id), ["DeadLettered"])
          assert.strictEqual((yield* transferCounts([id])).get(id), undefined, "the refused transfer is never applied")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 200_00n, [b]: 0n })
          assert.deepStrictEqual(yield* letters, [[id, "PermanentError"]], "the dead letter is stored once")
        })
    )

    for (const point of Probe.points) {
      it.effect(
        `BE-JOB-001: a worker killed with SIGKILL at any crash point and restarted applies every transfer exactly once: at ${point}`,
        () =>
          Effect.gen(function*() {
            const stream = yield* TestStream.make()
            const p = uniquePrefix(point)
            const accounts = [0, 1, 2, 3].map((i) => `${p}.acc${i}`)
            const opening = 1_000_00
            for (const account of accounts) yield* openAccount(account, "EUR", opening)
            // 20 transfers among 4 accounts: many share an account (their transactions contend
            // on its row lock). Every account holds more than it could ever pay out, so every
            // transfer is valid in any order and must be applied.
            const transfers = Array.from({ length: 20 }, (_, i) => ({
              id: `${p}.t${i}`,
              from: accounts[i % 4]!,
              to: accounts[(i + 1 + (i % 3)) % 4]!,
              amount: (i + 1) * 100
            }))
            const expected: Record<string, bigint> = Object.fromEntries(accounts.map((acc) => [acc, BigInt(opening)]))
            for (const t of transfers) {
              expected[t.from]! -= BigInt(t.amount)
              expected[t.to]! += BigInt(t.amount)
            }
            const ids = transfers.map((t) => t.id)
            for (const t of transfers) yield* stream.publish("eur", transfer(t.id, t.from, t.to, t.amount), t.id)

            const first = yield* startWorker(stream, { point, onHit: 5 })
            const line = yield* crashed(first, point)
            const crashedId = /event=(\S+)$/.exec(line)?.[1]
            assert.include(ids, crashedId, line)

            const second = yield* startWorker(stream)
            yield* eventually(
              transferCounts(ids),
              (counts) => counts.size === ids.length,
              "30 seconds",
              "every transfer to be applied"
            )
            yield* drained(stream)

            const counts = yield* transferCounts(ids)
            for (const id of ids) assert.strictEqual(counts.get(id), 1, `transfer ${id} applied once`)
            assert.deepStrictEqual(yield* balances(accounts), expected)
            assert.strictEqual(yield* totalBalance(accounts), BigInt(opening * accounts.length))
            const outcomes = [...(yield* outcomesOf(first)), ...(yield* outcomesOf(second))]
            const unexpected = outcomes.filter((o) => o.tag !== "Committed" && o.tag !== "Duplicate")
            assert.deepStrictEqual(unexpected, [], "no transfer released, rejected or dead-lettered")
            const committed = outcomes.filter((o) => o.tag === "Committed").map((o) => o.eventId)
            assert.strictEqual(new Set(committed).size, committed.length, "no transfer committed twice")
            // What became of the delivery that was killed, as seen by the restarted worker. The
            // broker counts an ack before the worker prints the outcome its answer completes, so a
            // redelivery's line is waited for (bounded) rather than read at once.
            const crashedOutcomes = Effect.map(outcomesOf(second), (all) => all.filter((o) => o.eventId === crashedId))
            const afterRestart = point === "after-ack"
              ? yield* crashedOutcomes
              : yield* eventually(crashedOutcomes, (mine) => mine.length > 0, "10 seconds", `an outcome of ${crashedId} from the restarted worker`)
            if (point === "after-ack") {
              assert.deepStrictEqual(afterRestart, [], "an acked transfer is not delivered again")
            } else {
              // Killed before its ack: redelivered, and committed by the restarted worker unless
              // the killed one had already committed it.
              assert.isNotEmpty(afterRestart, "the killed delivery came back")
              assert.deepInclude(afterRestart[0], { tag: point === "after-commit" ? "Duplicate" : "Committed" })
              assert.isAtLeast(afterRestart[0]!.deliveryCount, 2, "it was a redelivery")
              assert.deepStrictEqual(notDuplicate(afterRestart.slice(1).map((o) => o.tag)), [])
            }
          })
      )
    }
  })
})

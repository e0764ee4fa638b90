/**
 * Independent results in a batch (BE-JOB-007), with the ledger's batch mode against the real NATS
 * and PostgreSQL: one element failing (first, middle or last; permanently or for a while) is
 * settled on its own while the others commit in the same transaction; a poison element that fails
 * the whole run is isolated; every element is settled with its own ack, nak or term (watched on
 * the wire); and after a crash (a whole batch committed and not acked, or a batch redelivered
 * beside fresh work) nothing is applied twice.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, type Outcome } from "@jetworker/core"
import { ChildWorker, Eventually, OutcomeLog, TestDatabase, type TestStream } from "@jetworker/testing"
import { Duration, Effect, Fiber } from "effect"
import { fileURLToPath } from "node:url"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import * as RiskCheck from "../examples/ledger/src/RiskCheck.ts"
import { watchAcks } from "./support/acks.ts"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const fixture = fileURLToPath(new URL("./fixtures/ledger-worker.ts", import.meta.url))

/** The ledger in batch mode: batches of up to 5, waiting long enough that published work forms one. */
const batchSettings = { batchSize: 5, batchWait: Duration.millis(500), concurrency: 1 }

/**
 * Runs the ledger's batch consumer with `risk` as its risk check until `done` holds for the
 * outcomes; returns them and the size of the batch each event was handled in (the last one).
 */
const runBatches = (
  settings: LedgerWorker.Settings,
  risk: (event: { readonly id: string }) => Effect.Effect<void, RiskCheck.RiskCheckUnavailable>,
  done: (outcomes: ReadonlyArray<Outcome.Outcome>) => boolean
) =>
  Effect.gen(function*() {
    const log = yield* OutcomeLog.make
    const batchOf = new Map<string, number>()
    const check = (event: { readonly id: string }) =>
      Effect.andThen(
        Effect.map(Effect.serviceOption(CurrentDelivery.CurrentBatch), (batch) => {
          if (batch._tag === "Some") batchOf.set(event.id, batch.value.elements.length)
        }),
        risk(event)
      )
    const fiber = yield* Effect.forkChild(
      Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(Effect.provideService(RiskCheck.RiskCheck, { check }))
    )
    const outcomes = yield* log.waitUntil(done, "30 seconds")
    yield* Fiber.interrupt(fiber)
    return { outcomes, batchOf }
  })

/** A risk check that is unavailable (transient) for transfer `id` the first time only. */
const unavailableOnce = (id: string) => {
  let failed = false
  return (event: { readonly id: string }) =>
    event.id === id && !failed
      ? Effect.suspend(() => {
        failed = true
        return Effect.fail(new RiskCheck.RiskCheckUnavailable({ transferId: event.id, message: "risk service down" }))
      })
      : Effect.void
}

const tagsOf = (outcomes: ReadonlyArray<Outcome.Outcome>, id: string) =>
  outcomes.filter((o) => o.message.eventId === id).map((o) => o._tag)

/** Five transfer ids of `p`: t1 to t5, in publish order. */
const fiveIds = (p: string) => [1, 2, 3, 4, 5].map((n) => `${p}.t${n}`)

const publishAll = (stream: TestStream.TestStream, transfers: ReadonlyArray<readonly [id: string, json: string]>) =>
  Effect.forEach(transfers, ([id, json]) => stream.publish("eur", json, id), { discard: true })

describe("batches (BE-JOB-007)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("BE-JOB-007: failure of the first element: it alone is dead-lettered; the other four commit in the same batch", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(30) })
        const { p, a, b } = yield* twoAccounts("batch-first")
        const ids = fiveIds(p)
        // The first transfer names an account that does not exist: a permanent error.
        yield* publishAll(stream, ids.map((id, i) => [id, transfer(id, i === 0 ? `${p}.nobody` : a, b, 10_00)] as const))
        const { batchOf, outcomes } = yield* runBatches(settings, () => Effect.void, (all) => all.length >= 5)
        assert.deepStrictEqual(ids.map((id) => tagsOf(outcomes, id)), [["DeadLettered"], ["Committed"], ["Committed"], ["Committed"], ["Committed"]])
        assert.deepStrictEqual(ids.map((id) => batchOf.get(id)), [5, 5, 5, 5, 5], "one batch of five")
        assert.deepStrictEqual(Object.fromEntries(yield* transferCounts(ids)), Object.fromEntries(ids.slice(1).map((id) => [id, 1])))
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 60_00n, [b]: 40_00n })
        assert.isTrue(outcomes.every((o) => o.confirmed), "every element settled, each confirmed")
        const info = yield* stream.info
        assert.deepStrictEqual([info.num_ack_pending, info.num_redelivered], [0, 0])
      }))

    it.effect("BE-JOB-007: failure of the middle element: a transient failure retries it alone; the other four commit at once, and it commits on its redelivery", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(30) })
        const { p, a, b } = yield* twoAccounts("batch-middle")
        const ids = fiveIds(p)
        yield* publishAll(stream, ids.map((id) => [id, transfer(id, a, b, 10_00)] as const))
        // The middle transfer's risk check is unavailable once.
        const { outcomes } = yield* runBatches(settings, unavailableOnce(ids[2]!), (all) => all.filter((o) => o._tag === "Committed").length >= 5)
        assert.deepStrictEqual(tagsOf(outcomes, ids[2]!), ["Released", "Committed"])
        for (const id of [ids[0]!, ids[1]!, ids[3]!, ids[4]!]) assert.deepStrictEqual(tagsOf(outcomes, id), ["Committed"], id)
        const retried = outcomes.find((o) => o.message.eventId === ids[2])!
        assert.strictEqual(retried._tag === "Released" ? retried.reason : undefined, "Retrying")
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1, 1, 1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 50_00n, [b]: 50_00n })
      }))

    it.effect("BE-JOB-007: failure of the last element: it alone is refused (insufficient funds) and dead-lettered; the first four commit", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(30) })
        const { p, a, b } = yield* twoAccounts("batch-last")
        const ids = fiveIds(p)
        // 4 x 20.00 leaves 20.00: the last transfer's 30.00 is refused.
        yield* publishAll(stream, ids.map((id, i) => [id, transfer(id, a, b, i === 4 ? 30_00 : 20_00)] as const))
        const { batchOf, outcomes } = yield* runBatches(settings, () => Effect.void, (all) => all.length >= 5)
        assert.deepStrictEqual(ids.map((id) => tagsOf(outcomes, id)), [["Committed"], ["Committed"], ["Committed"], ["Committed"], ["DeadLettered"]])
        assert.deepStrictEqual(ids.map((id) => batchOf.get(id)), [5, 5, 5, 5, 5], "one batch of five")
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 20_00n, [b]: 80_00n })
        assert.strictEqual((yield* stream.info).num_ack_pending, 0)
      }))

    it.effect("BE-JOB-007: a poison element that fails the whole batch run is isolated: the others commit on their first delivery, it alone goes to the dead-letter stream", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(30), attempts: 3 })
        const { p, a, b } = yield* twoAccounts("batch-poison")
        const ids = fiveIds(p)
        yield* publishAll(stream, ids.map((id) => [id, transfer(id, a, b, 10_00)] as const))
        // The second transfer crashes its risk check (a defect), which takes the whole run down.
        const risk = (event: { readonly id: string }) => event.id === ids[1] ? Effect.die(new Error("risk client bug")) : Effect.void
        const { outcomes } = yield* runBatches(settings, risk, (all) => all.some((o) => o._tag === "DeadLettered"))
        for (const id of [ids[0]!, ids[2]!, ids[3]!, ids[4]!]) {
          const own = outcomes.filter((o) => o.message.eventId === id)
          assert.deepStrictEqual(own.map((o) => [o._tag, o.message.deliveryCount]), [["Committed", 1]], id)
        }
        const poison = outcomes.filter((o) => o.message.eventId === ids[1])
        assert.strictEqual(poison.at(-1)?._tag, "DeadLettered")
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 60_00n, [b]: 40_00n })
        assert.isUndefined((yield* transferCounts(ids)).get(ids[1]!))
      }))

    it.effect("BE-JOB-007: individual acks: every element is settled on the wire by its own ack, nak or term", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(30) })
        const { p, a, b } = yield* twoAccounts("batch-acks")
        const ids = fiveIds(p).slice(0, 4)
        const acks = yield* watchAcks(stream.stream, stream.consumer)
        const sequences: Array<number> = []
        for (const [i, id] of ids.entries()) {
          sequences.push(yield* stream.publish("eur", transfer(id, i === 1 ? `${p}.nobody` : a, b, 10_00), id))
        }
        yield* runBatches(settings, unavailableOnce(ids[2]!), (all) => all.filter((o) => o._tag !== "Released").length >= 4)
        yield* Eventually.holds("the last ack on the wire", Effect.sync(() => acks.filter((x) => x.body.startsWith("+ACK")).length >= 3), "10 seconds")
        const firstDelivery = (sequence: number) =>
          acks.filter((x) => x.sequence === sequence && x.deliveryCount === 1).map((x) => x.body.split(" ")[0])
        // Committed, dead-lettered (then terminated), retried (nak with a delay), committed.
        assert.deepStrictEqual(sequences.map(firstDelivery), [["+ACK"], ["+TERM"], ["-NAK"], ["+ACK"]])
        assert.isTrue(acks.some((x) => x.sequence === sequences[2] && x.deliveryCount === 2 && x.body.startsWith("+ACK")))
      }))

    it.effect("BE-JOB-007: crash after a partial commit: a worker killed after committing two of five transfers, before acking them; the next commits the other three and ends the two Duplicate, each applied once", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, ackWait: Duration.seconds(2) })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("batch-partial")
        const ids = fiveIds(p)
        const [early, late] = [[ids[1]!, ids[3]!], [ids[0]!, ids[2]!, ids[4]!]]
        yield* publishAll(stream, early.map((id) => [id, transfer(id, a, b, 10_00)] as const))
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        const first = yield* ChildWorker.spawn({ script: fixture, env: { ...env, JW_CRASH_AT: "after-commit" } })
        yield* first.waitForLine((line) => line.startsWith("crash at after-commit"), "30 seconds")
        yield* first.waitForExit("10 seconds")
        assert.deepStrictEqual(Object.fromEntries(yield* transferCounts(ids)), { [early[0]!]: 1, [early[1]!]: 1 }, "part of the work committed")
        yield* publishAll(stream, late.map((id) => [id, transfer(id, a, b, 10_00)] as const))
        const second = yield* ChildWorker.spawn({ script: fixture, env })
        const outcomes = yield* Eventually.poll("five outcomes", W.outcomeLines(second), (all) => all.length >= 5, { timeout: "30 seconds", interval: "100 millis" })
        const tags = (id: string) => outcomes.filter((o) => o.eventId === id).map((o) => o.tag)
        assert.deepStrictEqual(early.map(tags), [["Duplicate"], ["Duplicate"]])
        assert.deepStrictEqual(late.map(tags), [["Committed"], ["Committed"], ["Committed"]])
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1, 1, 1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 50_00n, [b]: 50_00n })
        yield* Eventually.holds("nothing left unacked", Effect.map(stream.info, (info) => info.num_ack_pending === 0 && info.num_pending === 0), "10 seconds")
        yield* second.kill("SIGTERM")
        yield* second.waitForExit("15 seconds")
      }))

    it.effect("BE-JOB-007: redelivery of the whole batch: a worker killed after its batch committed, before any ack; the next one ends every element Duplicate, applied once", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ...batchSettings, batchSize: 4, ackWait: Duration.seconds(2) })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("batch-whole")
        const ids = fiveIds(p).slice(0, 4)
        yield* publishAll(stream, ids.map((id) => [id, transfer(id, a, b, 10_00)] as const))
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        const first = yield* ChildWorker.spawn({ script: fixture, env: { ...env, JW_CRASH_AT: "after-commit" } })
        yield* first.waitForLine((line) => line.startsWith("crash at after-commit"), "30 seconds")
        yield* first.waitForExit("10 seconds")
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1, 1], "the batch committed")
        assert.strictEqual((yield* stream.info).num_ack_pending, 4, "and nothing was acked")
        const second = yield* ChildWorker.spawn({ script: fixture, env })
        const outcomes = yield* Eventually.poll("four outcomes", W.outcomeLines(second), (all) => all.length >= 4, { timeout: "30 seconds", interval: "100 millis" })
        assert.deepStrictEqual(ids.map((id) => outcomes.filter((o) => o.eventId === id).map((o) => o.tag)), [["Duplicate"], ["Duplicate"], ["Duplicate"], ["Duplicate"]])
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1, 1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 60_00n, [b]: 40_00n })
        yield* second.kill("SIGTERM")
        yield* second.waitForExit("15 seconds")
      }))
  })
})

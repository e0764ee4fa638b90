import { assert, describe, layer } from "@effect/vitest"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Effect, Fiber } from "effect"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { openAccount, settingsFor, totalBalance, transfer, transferCounts, uniquePrefix } from "./support/ledger.ts"
import { LedgerTestLive } from "./support/services.ts"

describe("ledger redelivery", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect("BE-JOB-002: sequential redelivery of a committed transfer is a Duplicate with no second effect", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const settings = settingsFor(stream)
        const p = uniquePrefix("seq")
        const log = yield* OutcomeLog.make
        const worker = yield* Effect.forkChild(LedgerWorker.runWith(settings, log.record))
        yield* openAccount(`${p}.a`, "EUR", 100_00)
        yield* openAccount(`${p}.b`, "EUR", 0)
        const payload = transfer(`${p}.t1`, `${p}.a`, `${p}.b`, 30_00)
        yield* stream.publish("eur", payload, `${p}.t1`)
        yield* log.waitUntil((all) => all.some((o) => o._tag === "Committed"), "20 seconds", "the first delivery to commit")
        // The producer republishes past the duplicate window: a second copy in the stream.
        yield* stream.publish("eur", payload, `${p}.t1.again`)
        const outcomes = yield* log.waitUntil((all) => all.length === 2, "20 seconds")
        yield* Fiber.interrupt(worker)
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed", "Duplicate"])
        assert.deepStrictEqual((yield* transferCounts([`${p}.t1`])).get(`${p}.t1`), 1)
        assert.strictEqual(yield* totalBalance([`${p}.a`, `${p}.b`]), 100_00n)
      }))
  })
})

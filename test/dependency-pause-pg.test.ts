/**
 * BE-JOB-003 against the real NATS and PostgreSQL: a PostgreSQL outage longer than the retry
 * budget dead-letters nothing. The ledger worker runs as a child process (under `Worker.runMain`,
 * PostgreSQL a `Lifecycle.resource` with a check) and reaches PostgreSQL through a loopback
 * `FaultProxy`; with 2 attempts 100 ms apart the transfers published while the link is cut
 * would be dead-lettered within a second or two (by the crash-loop guard, the attempt store being
 * down too). Paused on its dependency, the worker holds the delivery that failed, takes nothing
 * new, and applies every transfer once the link is back.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter } from "@jetworker/nats"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect } from "effect"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseProxy, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("dependency pause (PostgreSQL cut)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "150 seconds" })((it) => {
    it.effect("BE-JOB-003: transfers published while PostgreSQL is cut are held, not dead-lettered (2 attempts would be spent in a second), and each is applied once when the link is back", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(10), attempts: 2, retryBase: Duration.millis(100), inProcessRetries: 0 })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("dependency-pause")
        const { proxy, url } = yield* databaseProxy
        const worker = yield* W.start(workerEnv(settings, schema.name, url, natsUrl))
        yield* W.waitReady(worker)
        yield* proxy.cut
        const ids = Array.from({ length: 5 }, (_, i) => `${p}.t${i}`)
        for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 1_00), id)
        // The first failure probes PostgreSQL at once (its periodic check is 5 s apart): the
        // delivery is held and the intake paused, before the 2 attempts could be spent.
        const events = (event: string) => Effect.map(worker.logs, (lines) => lines.filter((l) => l.event === event))
        yield* Eventually.poll("a delivery held", events("delivery.held"), (held) => held.length > 0, {
          timeout: "30 seconds",
          interval: "100 millis"
        })
        yield* Eventually.poll("the consumer paused", events("consumer.paused"), (paused) => paused.length > 0, {
          timeout: "10 seconds",
          interval: "100 millis"
        })
        const ofTransfers = Effect.map(W.outcomes(worker), (all) => all.filter((o) => ids.includes(String(o.eventId))))
        assert.deepStrictEqual(
          (yield* ofTransfers).filter((o) => o.tag === "DeadLettered"),
          [],
          "nothing dead-lettered while the link is cut"
        )
        yield* proxy.restore
        yield* Eventually.holds(
          "every transfer commits once the link is back",
          Effect.map(ofTransfers, (o) => ids.every((id) => o.some((x) => x.eventId === id && x.tag === "Committed"))),
          "60 seconds"
        )
        assert.isNotEmpty(yield* events("consumer.resumed"), "the resumption is logged")
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.waitForExit("15 seconds")
        const tags = (yield* ofTransfers).map((o) => o.tag)
        assert.deepStrictEqual(tags.filter((tag) => tag !== "Committed" && tag !== "Released"), [], `outcomes: ${JSON.stringify(tags)}`)
        assert.deepStrictEqual([...(yield* transferCounts(ids)).values()], [1, 1, 1, 1, 1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 95_00n, [b]: 5_00n })
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [])
      }), 150_000)

    it.effect("BE-SHUT-002, BE-JOB-003: SIGTERM while a transfer is held for PostgreSQL ends the hold at once: the worker exits 0 well inside its drain share, the transfer released uncounted, and a new worker applies it once the link is back", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(30), attempts: 2, retryBase: Duration.millis(100), inProcessRetries: 0 })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("pause-shutdown")
        const { proxy, url } = yield* databaseProxy
        // A 20 s budget: its drain share alone is longer than the whole stop may take here.
        const env = { ...workerEnv(settings, schema.name, url, natsUrl), SHUTDOWN_BUDGET: "20 seconds" }
        const worker = yield* W.start(env)
        yield* W.waitReady(worker)
        yield* proxy.cut
        const id = `${p}.t1`
        yield* stream.publish("eur", transfer(id, a, b, 1_00), id)
        yield* Eventually.poll("the transfer held", Effect.map(worker.logs, (lines) => lines.filter((l) => l.event === "delivery.held")), (held) => held.length > 0, {
          timeout: "30 seconds",
          interval: "100 millis"
        })
        yield* worker.child.kill("SIGTERM")
        const exit = yield* worker.child.waitForExit("15 seconds")
        const logs = yield* worker.logs
        const completed = W.withMessage(logs, "shutdown.completed")
        const drain = logs.find((l) => l.message === "shutdown.stage" && l.stage === "drain")
        assert.deepStrictEqual(exit, { code: 0, signal: null }, JSON.stringify(completed))
        assert.strictEqual(completed[0]?.result, "success")
        assert.strictEqual(drain?.result, "completed")
        assert.isBelow(Number(drain?.durationMs), 5_000, "the drain did not wait for the dependency")
        const released = logs.filter((l) => l.outcome !== undefined && l.eventId === id)
        assert.deepStrictEqual(released.map((l) => [l.outcome, l.reason]), [["Released", "Interrupted"]])
        yield* proxy.restore
        const next = yield* W.start(env)
        yield* W.waitReady(next)
        yield* Eventually.holds(
          "the transfer commits on the next worker",
          Effect.map(W.outcomes(next), (o) => o.some((x) => x.eventId === id && x.tag === "Committed")),
          "30 seconds"
        )
        yield* next.child.kill("SIGTERM")
        yield* next.child.waitForExit("15 seconds")
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [])
      }), 150_000)
  })
})

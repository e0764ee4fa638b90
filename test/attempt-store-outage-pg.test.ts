/**
 * BE-JOB-003 against the real NATS and PostgreSQL: a PostgreSQL outage does not dead-letter a
 * transfer on its delivery count. `PgAttemptStore` lives in the handler's database, so while the
 * link is cut the failure count can be neither read nor written; 5 earlier deliveries that were
 * no failures (taken and naked by another client of the durable, as a killed or restarted
 * instance's would be) must not spend the 5 attempts. The ledger worker runs as a child process
 * and reaches PostgreSQL through a loopback `FaultProxy` that is cut once it is ready.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection } from "@jetworker/nats"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect } from "effect"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts, workerEnv } from "./support/ledger.ts"
import { databaseProxy, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("attempt store outage (PostgreSQL cut)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "150 seconds" })((it) => {
    it.effect("BE-JOB-003: a transfer delivered 5 times without failing is not dead-lettered when PostgreSQL is cut on its 6th delivery: released for a retry, it commits once the link is back", () =>
      Effect.gen(function*() {
        // Not paused on PostgreSQL: this is the path of a failure that counts (a pause would hold
        // the delivery instead, see dependency-pause-pg.test.ts), with the attempt store down too.
        const { stream, settings } = yield* ledgerStream({
          ackWait: Duration.seconds(10),
          attempts: 5,
          retryBase: Duration.millis(100),
          inProcessRetries: 0,
          pauseOnDependencies: false
        })
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("store-outage")
        const id = `${p}.t1`
        const seq = yield* stream.publish("eur", transfer(id, a, b, 2_50), id)
        // Deliveries 1 to 5, no failures: another client of the durable takes and naks them; the
        // last nak is delayed so that delivery 6 reaches the worker once the link is cut.
        const { jetstream } = yield* NatsConnection.NatsConnection
        const raw = yield* Effect.promise(() => jetstream.consumers.get(stream.stream, stream.consumer))
        for (let delivery = 1; delivery <= 5; delivery++) {
          const msg = yield* Effect.promise(() => raw.next({ expires: 5_000 }))
          assert.isNotNull(msg, `delivery ${delivery} arrived`)
          assert.strictEqual(msg!.seq, seq)
          assert.strictEqual(msg!.info.deliveryCount, delivery)
          msg!.nak(delivery === 5 ? 12_000 : 0)
        }
        const { proxy, url } = yield* databaseProxy
        const worker = yield* W.start(workerEnv(settings, schema.name, url, natsUrl))
        yield* W.waitReady(worker)
        yield* proxy.cut
        const ofTransfer = Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.eventId === id))
        // Delivery 6 (or a later one) ends while the link is cut: before the fix it was dead-lettered
        // `AttemptsExhausted` ("5 failed attempts") without running the handler.
        const during = yield* Eventually.poll("an outcome of the transfer during the cut", ofTransfer, (o) => o.length > 0, {
          timeout: "30 seconds",
          interval: "100 millis"
        })
        yield* proxy.restore
        assert.deepStrictEqual(
          during.map((o) => o.tag),
          ["Released"],
          `dead-lettered on deliveries that were no failures: ${JSON.stringify(during)}`
        )
        const logs = yield* worker.logs
        assert.isTrue(
          logs.some((l) => typeof l.message === "string" && l.message.startsWith("attempt store unavailable")),
          "the delivery met the outage (the attempt store could not be read)"
        )
        yield* Eventually.holds(
          "the transfer commits once the link is back",
          Effect.map(ofTransfer, (o) => o.some((x) => x.tag === "Committed")),
          "60 seconds"
        )
        yield* worker.child.kill("SIGTERM")
        yield* worker.child.waitForExit("15 seconds")
        assert.deepStrictEqual((yield* ofTransfer).map((o) => o.tag).filter((tag) => tag !== "Released"), ["Committed"])
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 97_50n, [b]: 2_50n })
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [])
      }), 150_000)
  })
})

/**
 * Chaos with a database that goes away (BE-JOB-002/003 together): three ledger worker processes
 * on one durable consumer reach PostgreSQL through one loopback `FaultProxy`. The transfers are
 * published in eight rounds; after each, while they are applied, the link is cut for 1.5 to 3 s
 * (every connection reset, new ones refused; always after the first round) or a worker is killed
 * (SIGKILL, then restarted), at seeded random. The retry budget is 3 attempts
 * from 100 ms (300 ms of backoff in all), which a cut would spend many times over: the workers
 * pause on PostgreSQL, holding what failed. (With 2 attempts the crash-loop guard, twice the
 * attempts, was 4 deliveries: a batch mode run whose transfer was also redelivered after kills
 * reached it once, and was dead-lettered `DeliveriesExhausted`.) Afterwards every transfer is applied exactly once, every balance is what the
 * transfers make of it, and nothing is dead-lettered. The seed is printed on failure
 * (`JW_CHAOS_SEED` replays the schedule).
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter } from "@jetworker/nats"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect } from "effect"
import {
  balances,
  expectedBalances,
  ledgerStream,
  chaosModes as modes,
  chaosSeed,
  openAccount,
  quickShutdown,
  randomTransfers,
  transfer,
  transferCounts,
  uniquePrefix,
  workerEnv
} from "./support/ledger.ts"
import { generator } from "./support/random.ts"
import { databaseProxy, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const seed = chaosSeed()


describe("chaos with database outages", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "180 seconds" })((it) => {
    for (const mode of modes) {
    it.effect(`BE-JOB-003: three workers, killed at random while the database link is cut again and again, apply every transfer exactly once and dead-letter none, ${mode.label} (seed ${seed})`, () =>
      Effect.gen(function*() {
        const random = generator(seed)
        const { stream, settings } = yield* ledgerStream({
          ackWait: Duration.seconds(5),
          attempts: 3,
          retryBase: Duration.millis(100),
          inProcessRetries: 0,
          ...mode.overrides
        })
        const schema = yield* TestDatabase.TestSchema
        const p = uniquePrefix("chaos-db")
        const accounts = Array.from({ length: 8 }, (_, i) => `${p}.acct${i}`)
        for (const account of accounts) yield* openAccount(account, "EUR", 1_000_00)
        const transfers = randomTransfers(random, accounts, p, 300)
        const { proxy, url } = yield* databaseProxy
        const env = { ...workerEnv(settings, schema.name, url, natsUrl), ...quickShutdown }
        const workers: Array<W.Worker> = []
        for (let i = 0; i < 3; i++) workers.push(yield* W.start(env))
        for (const worker of workers) yield* W.waitReady(worker)
        // Every worker started, the replaced ones too: their logs say what they held.
        const started: Array<W.Worker> = [...workers]
        // The schedule: 8 rounds, each publishing an eighth of the transfers and then, while they
        // are being applied, one fault: the link cut for 1.5 to 3 s (always in the first round,
        // then in about half of them) or a worker killed (the pacing and the length of the
        // outages, not waits for a result).
        const chunk = Math.ceil(transfers.length / 8)
        for (let round = 0; round < 8; round++) {
          yield* Effect.forEach(
            transfers.slice(round * chunk, (round + 1) * chunk),
            (t) => stream.publish("eur", transfer(t.id, t.from, t.to, t.amount), t.id),
            { concurrency: 4, discard: true }
          )
          if (round === 0 || random() < 0.5) {
            yield* proxy.cut
            yield* Effect.sleep(Duration.millis(1_500 + Math.floor(random() * 1_500)))
            yield* proxy.restore
          } else {
            const index = Math.floor(random() * workers.length)
            yield* workers[index]!.child.kill("SIGKILL")
            yield* workers[index]!.child.waitForExit("10 seconds")
            workers[index] = yield* W.start(env)
            started.push(workers[index]!)
          }
          yield* Effect.sleep(Duration.millis(300 + Math.floor(random() * 600)))
        }
        yield* Eventually.holds(
          "every transfer applied",
          Effect.map(transferCounts(transfers.map((t) => t.id)), (counts) => counts.size === transfers.length),
          "120 seconds"
        )
        yield* Eventually.holds(
          "nothing left on the consumer",
          Effect.map(stream.info, (info) => info.num_pending === 0 && info.num_ack_pending === 0),
          "60 seconds"
        )
        const held = (yield* Effect.forEach(started, (w) => w.logs)).flat().filter((l) => l.event === "delivery.held")
        for (const worker of workers) yield* worker.child.kill("SIGTERM")
        for (const worker of workers) yield* worker.child.waitForExit("15 seconds")

        const counts = yield* transferCounts(transfers.map((t) => t.id))
        assert.isTrue([...counts.values()].every((n) => n === 1), `seed ${seed}: each transfer applied once`)
        assert.deepStrictEqual(yield* balances(accounts), expectedBalances(accounts, 1_000_00n, transfers), `seed ${seed}: balances`)
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [], `seed ${seed}: nothing dead-lettered`)
        // The outages met deliveries: at least one was held.
        assert.isNotEmpty(held, `seed ${seed}: a delivery was held during an outage`)
      }), 180_000)
    }
  })
})

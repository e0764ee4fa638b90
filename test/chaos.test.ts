/**
 * Chaos against the real NATS and PostgreSQL (BE-JOB-001/002/006/007 together): three ledger
 * worker processes on one durable consumer while transfers are published, one transfer per
 * transaction and in batch mode; at seeded random moments a
 * worker is frozen past its AckWait (SIGSTOP, then SIGCONT) or killed (SIGKILL, then restarted).
 * Afterwards every transfer is applied exactly once: one row each, and every balance exactly what
 * the transfers make of it; and each transfer's `ledger.applied` event, recorded in the outbox
 * and published by the workers' relays (killed with them), is stored exactly once. The seed is printed on failure (`JW_CHAOS_SEED` replays the schedule).
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter } from "@jetworker/nats"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Duration, Effect, Fiber } from "effect"
import {
  appliedCopies,
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
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import { generator } from "./support/random.ts"
import * as W from "./support/worker.ts"


const seed = chaosSeed()


describe("chaos", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "180 seconds" })((it) => {
    for (const mode of modes) {
    it.effect(`BE-JOB-002: three workers frozen and killed at random apply every transfer exactly once, ${mode.label} (seed ${seed})`, () =>
      Effect.gen(function*() {
        const random = generator(seed)
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(2), ...mode.overrides })
        const schema = yield* TestDatabase.TestSchema
        const p = uniquePrefix("chaos")
        const accounts = Array.from({ length: 8 }, (_, i) => `${p}.acct${i}`)
        for (const account of accounts) yield* openAccount(account, "EUR", 1_000_00)
        const transfers = randomTransfers(random, accounts, p, 300)
        const env = { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...quickShutdown }
        // Workers live in their own scopes so that a killed one can be replaced.
        const workers: Array<W.Worker> = []
        for (let i = 0; i < 3; i++) workers.push(yield* W.start(env))
        for (const worker of workers) yield* W.waitReady(worker)
        const publishing = yield* Effect.forkChild(
          Effect.forEach(transfers, (t) => stream.publish("eur", transfer(t.id, t.from, t.to, t.amount), t.id), {
            concurrency: 16,
            discard: true
          })
        )
        // The chaos schedule: 20 faults, 300 to 700 ms apart (the pacing of the faults, not a wait).
        const stopped = new Set<number>()
        for (let fault = 0; fault < 20; fault++) {
          yield* Effect.sleep(Duration.millis(300 + Math.floor(random() * 400)))
          const index = Math.floor(random() * workers.length)
          const worker = workers[index]!
          if (stopped.has(index)) {
            yield* worker.child.kill("SIGCONT")
            stopped.delete(index)
          } else if (random() < 0.5) {
            yield* worker.child.kill("SIGSTOP") // frozen; its lease runs out after 2 s
            stopped.add(index)
          } else {
            yield* worker.child.kill("SIGKILL")
            yield* worker.child.waitForExit("10 seconds")
            workers[index] = yield* W.start(env)
          }
        }
        for (const index of stopped) yield* workers[index]!.child.kill("SIGCONT")
        yield* Fiber.join(publishing)
        yield* Eventually.holds(
          "every transfer applied",
          Effect.map(transferCounts(transfers.map((t) => t.id)), (counts) => counts.size === transfers.length),
          "90 seconds"
        )
        yield* Eventually.holds(
          "nothing left on the consumer",
          Effect.map(stream.info, (info) => info.num_pending === 0 && info.num_ack_pending === 0),
          "60 seconds"
        )
        // The relays (one at a time, killed with their workers) publish every applied event.
        yield* Eventually.holds(
          "every applied event published",
          Effect.map(appliedCopies(settings, p), (copies) => copies.size === transfers.length),
          "60 seconds"
        )
        for (const worker of workers) yield* worker.child.kill("SIGTERM")
        for (const worker of workers) yield* worker.child.waitForExit("15 seconds")

        const counts = yield* transferCounts(transfers.map((t) => t.id))
        assert.isTrue([...counts.values()].every((n) => n === 1), `seed ${seed}`)
        assert.deepStrictEqual(yield* balances(accounts), expectedBalances(accounts, 1_000_00n, transfers), `seed ${seed}: balances`)
        assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [], `seed ${seed}: nothing dead-lettered`)
        const copies = yield* appliedCopies(settings, p)
        assert.deepStrictEqual([...copies.values()].filter((n) => n !== 1), [], `seed ${seed}: each applied event stored once`)
        assert.strictEqual(copies.size, transfers.length)
      }), 150_000)
    }
  })
})

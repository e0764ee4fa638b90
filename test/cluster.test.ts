/**
 * The ledger on a three-node JetStream cluster (INT-NATS-007 and BE-JOB-002 under a leader
 * failover): replicated streams (R3), two worker processes connected to all three nodes, and
 * transfers published with confirmed publishes while the `LEDGER` stream's leader is SIGKILLed and
 * restarted. Publishes retry through the election with the same `Nats-Msg-Id`; afterwards every
 * transfer is applied exactly once, the consumer is drained, and every `ledger.applied` event
 * (published by the workers' outbox relays) is stored exactly once.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Eventually, NatsServer, TestDatabase } from "@jetworker/testing"
import { Effect, Fiber, Layer, Schedule } from "effect"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { appliedCopies, balances, expectedBalances, openAccount, settingsFor, transfer, transferCounts, uniquePrefix, workerEnv } from "./support/ledger.ts"
import { databaseUrl, MigratedLive } from "./support/services.ts"
import * as W from "./support/worker.ts"

const DatabaseLive = MigratedLive.pipe(Layer.provideMerge(TestDatabase.layer()))

const encoder = new TextEncoder()

/** A JetStream API call, retried while the cluster elects a leader (it times out meanwhile). */
const api = <A>(call: () => Promise<A>) =>
  Effect.tryPromise(call).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 80 }))

describe("a three-node JetStream cluster", () => {
  layer(DatabaseLive, { excludeTestServices: true, timeout: "240 seconds" })((it) => {
    it.effect("INT-NATS-007: the stream leader SIGKILLed and restarted under load: confirmed publishes retry through the election, every transfer is applied exactly once and every applied event is stored once", () =>
      Effect.gen(function*() {
        const cluster = yield* NatsServer.cluster()
        const settings = settingsFor(
          { stream: "CLUSTER_LEDGER", subjectPrefix: "cluster.transfer", consumer: "ledger-applier" },
          { appliedStream: "CLUSTER_APPLIED", replicas: 3 }
        )
        const natsLayer = NatsConnection.layer({
          servers: cluster.urls,
          name: "cluster-test",
          maxReconnectAttempts: -1,
          reconnectTimeWait: "200 millis"
        })
        yield* Effect.gen(function*() {
          const { manager } = yield* NatsConnection.NatsConnection
          // The cluster's JetStream API answers once it has elected its meta leader.
          yield* LedgerWorker.setup(settings).pipe(
            Effect.retry({ schedule: Schedule.spaced("500 millis"), times: 60 })
          )
          const schema = yield* TestDatabase.TestSchema
          const p = uniquePrefix("cluster")
          const accounts = Array.from({ length: 6 }, (_, i) => `${p}.acct${i}`)
          for (const account of accounts) yield* openAccount(account, "EUR", 1_000_00)
          const transfers = Array.from({ length: 300 }, (_, i) => ({
            id: `${p}.t${i}`,
            from: accounts[i % accounts.length]!,
            to: accounts[(i * 5 + 1) % accounts.length] === accounts[i % accounts.length]
              ? accounts[(i + 1) % accounts.length]!
              : accounts[(i * 5 + 1) % accounts.length]!,
            amount: 1 + (i % 97)
          }))
          const env = {
            ...workerEnv(settings, schema.name, databaseUrl, cluster.urls.join(",")),
            SHUTDOWN_BUDGET: "5 seconds",
            SHUTDOWN_READINESS_GRACE: "0 millis",
            SHUTDOWN_CLOSE: "1 second",
            SHUTDOWN_TELEMETRY: "500 millis",
            SHUTDOWN_RESERVE: "500 millis"
          }
          const workers = [yield* W.start(env), yield* W.start(env)]
          for (const worker of workers) yield* W.waitReady(worker, "60 seconds")

          // Confirmed publishes, paced (about 100 a second) so that the failover falls among them,
          // each retried with its id through the election.
          let published = 0
          const publishing = yield* Effect.forkChild(
            Effect.forEach(transfers, (t) =>
              Publisher.publish(`${settings.subjectPrefix}.eur`, encoder.encode(transfer(t.id, t.from, t.to, t.amount)), {
                msgId: t.id,
                stream: settings.stream,
                attempts: 20,
                timeout: "2 seconds"
              }).pipe(Effect.tap(() => Effect.sync(() => published++)), Effect.andThen(Effect.sleep("10 millis"))), { discard: true })
          )
          yield* Eventually.holds("a third of the transfers published", Effect.sync(() => published >= 100), "60 seconds")

          // Kill the stream's leader; it comes back on its store after a pause.
          const info = yield* api(() => manager.streams.info(settings.stream))
          const leader = cluster.node(info.cluster?.leader ?? "")
          assert.isDefined(leader, `the stream has a leader: ${JSON.stringify(info.cluster)}`)
          const publishedBeforeKill = published
          yield* leader!.stop("SIGKILL")
          // The outage lasts until the others have elected a new leader (publishes and deliveries wait
          // for it); a fixed pause let the old leader, restarted too early, win again.
          yield* Eventually.holds(
            "another node leads the stream",
            api(() => manager.streams.info(settings.stream)).pipe(
              Effect.map((i) => i.cluster?.leader !== undefined && i.cluster.leader !== leader!.name),
              Effect.orElseSucceed(() => false)
            ),
            "30 seconds"
          )
          yield* leader!.start
          assert.isBelow(publishedBeforeKill, transfers.length - 100, "the failover falls among the publishes")
          const after = yield* api(() => manager.streams.info(settings.stream))
          assert.notStrictEqual(after.cluster?.leader, leader!.name, "another node leads the stream after the failover")

          yield* Fiber.join(publishing)
          assert.strictEqual(published, transfers.length, "every publish confirmed")
          yield* Eventually.holds(
            "every transfer applied",
            Effect.map(transferCounts(transfers.map((t) => t.id)), (counts) => counts.size === transfers.length),
            "90 seconds"
          )
          yield* Eventually.holds(
            "nothing left on the consumer",
            api(() => manager.consumers.info(settings.stream, settings.consumer)).pipe(
              Effect.map((c) => c.num_pending === 0 && c.num_ack_pending === 0)
            ),
            "60 seconds"
          )
          yield* Eventually.holds(
            "every applied event published",
            Effect.map(appliedCopies(settings, p), (copies) => copies.size === transfers.length),
            "60 seconds"
          )
          for (const worker of workers) yield* worker.child.kill("SIGTERM")
          for (const worker of workers) yield* worker.child.waitForExit("15 seconds")

          const counts = yield* transferCounts(transfers.map((t) => t.id))
          assert.deepStrictEqual([...counts.values()].filter((n) => n !== 1), [], "each transfer applied once")
          assert.deepStrictEqual(yield* balances(accounts), expectedBalances(accounts, 1_000_00n, transfers))
          const stored = yield* api(() => manager.streams.info(settings.stream))
          assert.strictEqual(stored.state.messages, transfers.length, "each transfer stored once in the stream")
          const copies = yield* appliedCopies(settings, p)
          assert.deepStrictEqual([...copies.values()].filter((n) => n !== 1), [], "each applied event stored once")
          assert.strictEqual(copies.size, transfers.length)
        }).pipe(Effect.provide(natsLayer))
      }).pipe(Effect.scoped), 240_000)
  })
})

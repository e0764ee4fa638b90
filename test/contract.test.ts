/**
 * The reference ledger's contract with its stream (INT-NATS-002): the reviewed file in the
 * repository is the contract the worker applies, and the consumer's position survives a worker
 * restart, a broker crash and a deleted consumer re-applied from the contract, ending in a drained
 * consumer. The broker here is a private nats-server (crashed for real with SIGKILL).
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Contract, NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgIdempotencyStore, PgOutbox } from "@jetworker/sql-pg"
import { Eventually, NatsServer, OutcomeLog, TestDatabase } from "@jetworker/testing"
import { ConfigProvider, Duration, Effect, Fiber, Layer, Result, Schedule } from "effect"
import { readFileSync } from "node:fs"
import * as LedgerMigrations from "../examples/ledger/src/LedgerMigrations.ts"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { balances, ledgerStream, openAccount, transfer, transferCounts, uniquePrefix } from "./support/ledger.ts"

const contractFile = new URL("../examples/ledger/contract.json", import.meta.url)
const manifest = new URL("../examples/ledger/deploy/deployment.yaml", import.meta.url)

const millis = (input: Duration.Input | undefined) => input === undefined ? undefined : Duration.toMillis(Duration.fromInputUnsafe(input))

/** A contract as the server settings it stands for, durations in milliseconds: two equal ones declare the same. */
const normalised = (contract: Contract.Contract) => ({
  version: contract.version,
  ownership: contract.ownership,
  stream: Topology.streamConfig(contract.stream),
  consumers: contract.consumers.map((consumer) => ({
    config: Topology.consumerConfig({ ...consumer, stream: contract.stream.name }),
    expect: { ...consumer.expect, maxProcessingTime: millis(consumer.expect.maxProcessingTime) }
  })),
  publishHorizon: millis(contract.publishHorizon)
})

const DatabaseLive = Layer.merge(PgIdempotencyStore.layer(), PgOutbox.layer()).pipe(
  Layer.provideMerge(Layer.effectDiscard(Effect.andThen(Migrations.run, LedgerMigrations.run))),
  Layer.provideMerge(TestDatabase.layer())
)

describe("the ledger's contract", () => {
  it.effect("INT-NATS-002: review of subjects and expectations: the contract file in the repository is what the worker applies (subjects, stream, consumer, attempts, concurrency, instances, horizon) and it is consistent", () =>
    Effect.gen(function*() {
      const reviewed = yield* Contract.fromJson(readFileSync(contractFile, "utf8"))
      const defaults = yield* Effect.provideService(LedgerWorker.settings, ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} }))
      assert.deepStrictEqual(normalised(reviewed), normalised(LedgerWorker.contract(defaults)))
      // The closed list of subjects: one wildcard under the prefix, nothing else.
      assert.deepStrictEqual(reviewed.stream.subjects, ["ledger.transfer.>"])
      // The expectations agree with the deployment and the publisher.
      assert.match(readFileSync(manifest, "utf8"), new RegExp(`replicas: ${reviewed.consumers[0]!.expect.instances}\\b`))
      assert.isAtLeast(millis(reviewed.publishHorizon)!, Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon())))
      assert.deepStrictEqual(Contract.validate(reviewed), [])
    }))

  layer(DatabaseLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-002: recovery of the consumer position and draining the consumer: a worker restart, a broker crash and a deleted consumer re-applied from the contract lose nothing (replays end Duplicate, each transfer applied once); the consumer then drains to nothing pending or awaiting ack", () =>
      Effect.gen(function*() {
        const server = yield* NatsServer.make()
        const natsLayer = NatsConnection.layer({
          servers: server.url,
          name: "contract-recovery",
          maxReconnectAttempts: -1,
          reconnectTimeWait: "200 millis"
        })
        yield* Effect.gen(function*() {
          const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(5) })
          const p = uniquePrefix("recover")
          const [a, b] = [`${p}.a`, `${p}.b`]
          yield* openAccount(a, "EUR", 100_00)
          yield* openAccount(b, "EUR", 0)
          const ids = Array.from({ length: 30 }, (_, i) => `${p}.t${i + 1}`)
          // Retried with the same Nats-Msg-Id while the broker comes back: stored once.
          const publish = (from: number, to: number) =>
            Effect.forEach(ids.slice(from, to), (id) =>
              stream.publish("eur", transfer(id, a, b, 1), id).pipe(
                Effect.retry({ schedule: Schedule.spaced("200 millis"), times: 50 })
              ), { discard: true })
          const log = yield* OutcomeLog.make
          const settled = (all: ReadonlyArray<{ readonly _tag: string; readonly message: { readonly eventId: string | undefined } }>, upTo: number) =>
            ids.slice(0, upTo).every((id) => all.some((o) => o.message.eventId === id && (o._tag === "Committed" || o._tag === "Duplicate")))
          const startWorker = Effect.forkChild(LedgerWorker.runWith(settings, log.record))

          // A worker that ran, stopped, and started again picks up where the consumer was.
          let worker = yield* startWorker
          yield* publish(0, 10)
          yield* log.waitUntil((all) => settled(all, 10), "20 seconds", "the first 10 transfers")
          yield* Fiber.interrupt(worker)
          yield* publish(10, 20)
          worker = yield* startWorker
          yield* log.waitUntil((all) => settled(all, 20), "20 seconds", "the transfers published while no worker ran")

          // The broker crashes (unflushed consumer state lost) and comes back on its store.
          yield* server.restart("SIGKILL")
          yield* publish(20, 30)
          yield* log.waitUntil((all) => settled(all, 30), "30 seconds", "the transfers published after the broker's crash")
          yield* Fiber.interrupt(worker)

          // The consumer is deleted; applying the contract declares it again, from the start.
          const { manager } = yield* NatsConnection.NatsConnection
          yield* Effect.promise(() => manager.consumers.delete(stream.stream, stream.consumer))
          const contract = LedgerWorker.contract(settings)
          const applied = yield* Contract.apply(contract)
          assert.deepStrictEqual(applied.map((c) => [c.action, c.target]), [["create", `consumer ${stream.stream}/${stream.consumer}`]])
          const before = (yield* log.all).length
          worker = yield* startWorker
          const replayed = yield* log.waitUntil((all) => all.length >= before + 30, "30 seconds", "every transfer replayed")
          assert.deepStrictEqual(
            [...new Set(replayed.slice(before).map((o) => o._tag))],
            ["Duplicate"],
            "a replay performs no second effect"
          )

          // Drained: nothing left to deliver, nothing awaiting an ack, within a bound.
          yield* Eventually.holds(
            "the consumer drained",
            Effect.promise(() => manager.consumers.info(stream.stream, stream.consumer)).pipe(
              Effect.map((info) => info.num_pending === 0 && info.num_ack_pending === 0)
            ),
            "20 seconds"
          )
          yield* Fiber.interrupt(worker)
          // The test's short lease (5 s) is below the contract's processing time: a warning, no error.
          assert.deepStrictEqual((yield* Contract.check(contract)).map((f) => [f.check, f.severity]), [["processing_time", "warning"]])

          const all = yield* log.all
          assert.deepStrictEqual([...new Set(all.map((o) => o._tag))].sort(), ["Committed", "Duplicate"])
          const counts = yield* transferCounts(ids)
          assert.deepStrictEqual(ids.filter((id) => counts.get(id) !== 1), [], "every transfer applied exactly once")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n - 30n, [b]: 30n })
        }).pipe(Effect.provide(natsLayer))
      }).pipe(Effect.scoped), 120_000)
  })
})

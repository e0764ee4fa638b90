/**
 * Fault tests of BE-JOB-001 (ack only after the commit) and BE-JOB-002 (idempotent reprocessing),
 * each against the real NATS server and PostgreSQL: the worker's database or broker connection
 * runs through a loopback `FaultProxy` that is cut on cue, acks are watched on the wire by a
 * second NATS connection, and transactions are held open at named probe points. Every wait is on
 * an observable event (an outcome, a probe hit, a server counter, a proxy counter) with a bound.
 */
import { assert, describe, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { Consumer, type ErrorSummary, IdempotencyStore, type Outcome, Probe, Retry } from "@jetworker/core"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { PgIdempotencyStore, PgOutbox } from "@jetworker/sql-pg"
import { Eventually, FaultProxy, OutcomeLog, TestDatabase, TestStream } from "@jetworker/testing"
import { Context, Data, Deferred, Duration, Effect, Fiber, Layer, Queue, Redacted, Ref } from "effect"
import { SqlClient } from "effect/sql"
import { applyTransfer } from "../examples/ledger/src/Ledger.ts"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { metadata, TransferEvent } from "../examples/ledger/src/TransferEvent.ts"
import {
  balances,
  dedupRowExists,
  ledgerStream,
  totalBalance,
  transfer,
  transferCounts,
  twoAccounts
} from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"

const eventually = Eventually.holds
const awaitBounded = Eventually.deferred

/** A probe that cuts `proxy` the first time any delivery reaches `point`; `cutAt` tells which one. */
const cutOnFirst = (point: Probe.Point, proxy: FaultProxy.FaultProxy) =>
  Effect.map(Deferred.make<Probe.Hit>(), (cutAt) => ({
    cutAt,
    probe: {
      hit: (hit) =>
        hit.point === point
          ? Effect.flatMap(Deferred.succeed(cutAt, hit), (first) => (first ? proxy.cut : Effect.void))
          : Effect.void
    } satisfies Probe.ProbeShape
  }))

const hostPort = (url: string, defaultPort: number) => {
  const parsed = new URL(url)
  return { host: parsed.hostname, port: parsed.port === "" ? defaultPort : Number(parsed.port) }
}


/**
 * Whether a failure says the store could not be reached: the store's own statements fail as
 * `IdempotencyError` with reason `Unavailable`, the handler's as `SqlError` (a `ConnectionError`,
 * which says itself it is retryable). Both are classified transient.
 */
const storeUnreachable = (error: ErrorSummary.ErrorSummary | undefined): boolean =>
  error !== undefined && error.kind === "Failure" &&
  ((error.tag === "IdempotencyError" && error.fields.reason === "Unavailable") || error.tag === "SqlError")

const isFor = (id: string) => (outcome: Outcome.Outcome) => outcome.message.eventId === id
const count = (outcomes: ReadonlyArray<Outcome.Outcome>, tag: Outcome.Tag, id?: string) =>
  outcomes.filter((o) => o._tag === tag && (id === undefined || o.message.eventId === id)).length

/** The worker's own NATS connection, through `proxy` (reconnecting quickly once restored). */
const natsVia = (proxy: FaultProxy.FaultProxy) =>
  NatsConnection.layer({
    servers: `nats://${proxy.address.host}:${proxy.address.port}`,
    name: "faults-worker-via-proxy",
    reconnectTimeWait: "100 millis"
  })

/**
 * The worker's own PostgreSQL client, connecting through `proxy` to the test database on the
 * test schema, and the idempotency store and the outbox on it (the ledger's applied event must be
 * recorded in the transfer's transaction, so on the same client). A small connect timeout keeps a
 * cut quick.
 */
const databaseVia = (proxy: FaultProxy.FaultProxy, schema: string) => {
  const url = new URL(databaseUrl)
  url.hostname = proxy.address.host
  url.port = String(proxy.address.port)
  return Layer.merge(PgIdempotencyStore.layer(), PgOutbox.layer()).pipe(
    Layer.provideMerge(PgClient.layer({
      url: Redacted.make(url.toString()),
      startupParameters: { search_path: schema },
      applicationName: "faults-worker-via-proxy",
      connectTimeout: "1 second",
      maxConnections: 4
    }))
  )
}

/** A command a worker sent to the server about a message, as it arrived at an observer. */
interface Arrival {
  /** The message's stream sequence (from the `$JS.ACK` subject). */
  readonly sequence: number
  /** `+ACK`, `-NAK ...`, `+TERM`, `+WPI`. */
  readonly payload: string
}

/** An arrival, with what another PostgreSQL connection could see right after it arrived. */
interface WireCommand extends Arrival {
  /** The watched transfer ids whose `transfers` row was visible. */
  readonly transfersVisible: ReadonlyArray<string>
  /** The watched ids whose dedup row was visible. */
  readonly dedupVisible: ReadonlyArray<string>
  /** Messages in the dead-letter stream, read when a `+TERM` arrived (-1 for other commands). */
  readonly deadLetters: number
}

/**
 * Watches, from a second NATS connection, every command published to the reply subjects of
 * `stream`'s consumer (`$JS.ACK.<stream>.<consumer>.>`; nats.js publishes acks, naks, terms and
 * extensions there). Each arrival is recorded at once, in the subscription's callback; then a
 * fiber reads, on the observer's own PostgreSQL pool, what is visible of the transfers `ids`.
 */
const observeWire = (stream: TestStream.TestStream, scope: string, ids: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const observer = yield* NatsConnection.make({ servers: natsUrl, name: "faults-ack-observer" })
    const database = yield* Layer.build(TestDatabase.client({ applicationName: "faults-ack-observer", maxConnections: 2 }))
    const sql = Context.get(database, SqlClient.SqlClient)
    const arrivals: Array<Arrival> = []
    const checked: Array<WireCommand> = []
    const problems: Array<string> = []
    const queue = yield* Queue.unbounded<Arrival>()
    const subscription = observer.connection.subscribe(`$JS.ACK.${stream.stream}.${stream.consumer}.>`, {
      callback: (error, msg) => {
        if (error !== null) {
          problems.push(String(error))
          return
        }
        // $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
        const arrival = { sequence: Number(msg.subject.split(".")[5]), payload: msg.string() }
        arrivals.push(arrival)
        Queue.offerUnsafe(queue, arrival)
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => subscription.unsubscribe()))
    // The subscription is registered on the server before anything is published.
    yield* Effect.promise(() => observer.connection.flush())
    const check = (arrival: Arrival) =>
      Effect.gen(function*() {
        const transfers = yield* sql<{ readonly id: string }>`SELECT id FROM transfers WHERE id IN ${sql.in(ids)}`
        const dedup = yield* sql<{ readonly id: string }>`
          SELECT id FROM jetworker_dedup WHERE scope = ${scope} AND id IN ${sql.in(ids)}`
        const deadLetters = arrival.payload.startsWith("+TERM")
          ? (yield* Effect.promise(() => observer.manager.streams.info(stream.deadLetterStream))).state.messages
          : -1
        checked.push({
          ...arrival,
          transfersVisible: transfers.map((row) => row.id),
          dedupVisible: dedup.map((row) => row.id),
          deadLetters
        })
      }).pipe(Effect.catchCause((cause) => Effect.sync(() => problems.push(String(cause)))))
    yield* Effect.forkScoped(Effect.forever(Effect.flatMap(Queue.take(queue), check)))
    return {
      /** Every command that has arrived so far (recorded as it arrived). */
      arrivals: Effect.sync((): ReadonlyArray<Arrival> => [...arrivals]),
      /** Commands with what was visible in PostgreSQL when they arrived. */
      commands: Effect.sync((): ReadonlyArray<WireCommand> => [...checked]),
      problems: Effect.sync((): ReadonlyArray<string> => [...problems]),
      /** A round trip to the server: everything it sent the observer before is recorded. */
      flush: Effect.promise(() => observer.connection.flush())
    }
  })

/** A handler failure that says nothing about the data: worth a retry. */
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

describe("faults", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect(
      "BE-JOB-001: store unavailable: while PostgreSQL is cut nothing is acked or applied (released to retry); after restore each transfer commits exactly once",
      () =>
        Effect.gen(function*() {
          const schema = yield* TestDatabase.TestSchema
          const { stream, settings } = yield* ledgerStream({ attempts: 10 })
          const { p, a, b } = yield* twoAccounts("store")
          const proxy = yield* FaultProxy.make({ target: hostPort(databaseUrl, 5432) })
          const workerDatabase = yield* Layer.build(databaseVia(proxy, schema.name))
          const log = yield* OutcomeLog.make
          const worker = yield* Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(
            Effect.provideContext(workerDatabase),
            Effect.forkScoped
          )

          // The worker reaches PostgreSQL only through the proxy: a first transfer commits through it.
          const warmUp = `${p}.t0`
          const warmUpSeq = yield* stream.publish("eur", transfer(warmUp, a, b, 1_00), warmUp)
          yield* log.waitUntil((all) => all.some(isFor(warmUp)), "20 seconds", "the warm-up transfer")
          assert.strictEqual(count(yield* log.all, "Committed", warmUp), 1)
          assert.isAbove((yield* proxy.stats).accepted, 0, "the worker's pool connected through the proxy")

          yield* proxy.cut
          const ids = [`${p}.t1`, `${p}.t2`, `${p}.t3`]
          for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 10_00), id)
          // Every transfer is delivered, fails on the store and is released, at least twice over.
          const whileCut = yield* log.waitUntil(
            (all) => ids.every((id) => all.filter((o) => isFor(id)(o) && o._tag === "Released").length >= 2),
            "20 seconds",
            "each transfer to be released twice while the store is cut"
          )
          assert.isTrue(whileCut.length > 0)
          // Nothing of it was acked, nothing applied, and the server still holds every message.
          const info = yield* stream.info
          assert.strictEqual(info.ack_floor.stream_seq, warmUpSeq, "nothing acked past the warm-up")
          assert.strictEqual(info.num_ack_pending, ids.length, "all three still reserved, unacked, on the server")
          assert.strictEqual((yield* transferCounts(ids)).size, 0, "no effect while cut")
          for (const id of ids) assert.isFalse(yield* dedupRowExists(stream.consumer, id))
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 99_00n, [b]: 1_00n })
          // Every outcome while cut: released for a retry, the nak confirmed, the store unavailable.
          const beforeRestore = yield* log.all
          for (const outcome of beforeRestore.filter((o) => o.message.eventId !== warmUp)) {
            assert.strictEqual(outcome._tag, "Released", `while cut: ${JSON.stringify(outcome)}`)
            if (outcome._tag !== "Released") continue
            assert.strictEqual(outcome.reason, "Retrying")
            assert.isTrue(outcome.confirmed, "the nak reached the broker")
            assert.isTrue(storeUnreachable(outcome.error), JSON.stringify(outcome.error))
          }

          yield* proxy.restore
          const after = yield* log.waitUntil(
            (all) => ids.every((id) => all.some((o) => isFor(id)(o) && o._tag === "Committed")),
            "20 seconds",
            "every transfer to commit after the restore"
          )
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          for (const id of ids) {
            assert.strictEqual(count(after, "Committed", id), 1, `${id} committed once`)
            assert.strictEqual(count(after, "DeadLettered", id) + count(after, "Rejected", id), 0)
          }
          const counts = yield* transferCounts(ids)
          for (const id of ids) assert.strictEqual(counts.get(id), 1, `${id} applied once`)
          for (const id of ids) assert.isTrue(yield* dedupRowExists(stream.consumer, id))
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 69_00n, [b]: 31_00n })
          assert.strictEqual(yield* totalBalance([a, b]), 100_00n, "no money created or lost")
        })
    )

    it.effect(
      "BE-JOB-001: store unavailable: the connection lost inside the transaction, just before COMMIT, rolls everything back; nothing is acked and the redelivery commits once",
      () =>
        Effect.gen(function*() {
          const schema = yield* TestDatabase.TestSchema
          const { stream, settings } = yield* ledgerStream({ attempts: 10 })
          const { p, a, b } = yield* twoAccounts("store-commit")
          const proxy = yield* FaultProxy.make({ target: hostPort(databaseUrl, 5432) })
          const workerDatabase = yield* Layer.build(databaseVia(proxy, schema.name))
          // The first transaction to reach its commit loses its connection there: effects and
          // dedup row written, COMMIT not yet sent.
          const { cutAt, probe } = yield* cutOnFirst("before-commit", proxy)
          const log = yield* OutcomeLog.make
          const worker = yield* Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(
            Effect.provideContext(workerDatabase),
            Effect.provideService(Probe.Probe, probe),
            Effect.forkScoped
          )
          const id = `${p}.t1`
          const seq = yield* stream.publish("eur", transfer(id, a, b, 30_00), id)
          const hit = yield* awaitBounded("the transaction to reach its commit", cutAt)
          assert.strictEqual(hit.sequence, seq)
          const released = (yield* log.waitUntil((all) => all.length >= 1, "20 seconds", "the cut delivery's outcome"))[0]!
          assert.strictEqual(released._tag, "Released", JSON.stringify(released))
          if (released._tag === "Released") {
            assert.strictEqual(released.reason, "Retrying")
            assert.isTrue(released.confirmed, "the nak reached the broker")
            assert.isTrue(storeUnreachable(released.error), JSON.stringify(released.error))
          }
          const info = yield* stream.info
          assert.strictEqual(info.ack_floor.stream_seq, 0, "not acked")
          assert.strictEqual(info.num_ack_pending, 1, "still reserved on the server")
          assert.strictEqual((yield* transferCounts([id])).size, 0, "the effect was rolled back")
          assert.isFalse(yield* dedupRowExists(stream.consumer, id), "the dedup row was rolled back")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n, [b]: 0n })

          yield* proxy.restore
          const outcomes = yield* log.waitUntil((all) => all.some((o) => o._tag === "Committed"), "20 seconds", "the commit after the restore")
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          assert.strictEqual(count(outcomes, "Committed"), 1)
          for (const outcome of outcomes) assert.include(["Released", "Committed"], outcome._tag, JSON.stringify(outcome))
          assert.strictEqual((yield* transferCounts([id])).get(id), 1, "applied once")
          assert.isTrue(yield* dedupRowExists(stream.consumer, id))
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
        })
    )

    it.effect(
      "BE-JOB-001: broker unavailable: the broker cut between the commit and the ack leaves the ack unconfirmed; the redelivery is a Duplicate, with exactly one effect",
      () =>
        Effect.gen(function*() {
          const { stream, settings } = yield* ledgerStream()
          const { p, a, b } = yield* twoAccounts("brk-ack")
          const proxy = yield* FaultProxy.make({ target: hostPort(natsUrl, 4222) })
          const workerNats = yield* Layer.build(natsVia(proxy))
          const { cutAt, probe } = yield* cutOnFirst("after-commit", proxy)
          const log = yield* OutcomeLog.make
          const worker = yield* Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(
            Effect.provideContext(workerNats),
            Effect.provideService(Probe.Probe, probe),
            Effect.forkScoped
          )
          const id = `${p}.t1`
          const seq = yield* stream.publish("eur", transfer(id, a, b, 30_00), id)
          const hit = yield* awaitBounded("the commit of the first delivery", cutAt)
          assert.strictEqual(hit.sequence, seq)

          // The ack could not reach the server: the outcome says so, the effect is committed once.
          const [first] = yield* log.waitUntil((all) => all.length >= 1, "20 seconds", "the first delivery's outcome")
          assert.strictEqual(first!._tag, "Committed")
          assert.isFalse(first!.confirmed, "the ack was not confirmed")
          assert.strictEqual(first!.message.deliveryCount, 1)
          assert.strictEqual((yield* transferCounts([id])).get(id), 1)
          assert.isTrue(yield* dedupRowExists(stream.consumer, id))
          const cutInfo = yield* stream.info
          assert.strictEqual(cutInfo.ack_floor.stream_seq, 0, "the server never got the ack")
          assert.strictEqual(cutInfo.num_ack_pending, 1, "the message is still the server's to redeliver")

          yield* proxy.restore
          yield* log.waitUntil(
            (all) => all.some((o) => o._tag === "Duplicate" && o.confirmed),
            "20 seconds",
            "the redelivery after the restore to be acked as a Duplicate"
          )
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          // Every later delivery is a Duplicate. (NATS 2.9.10 may hand the message out twice after
          // the reconnect, once as a redelivery and once more with delivery count 1: both are
          // Duplicates, which is what idempotency is for.)
          const [, ...later] = yield* log.all
          assert.isAbove(later.length, 0)
          for (const outcome of later) {
            assert.strictEqual(outcome._tag, "Duplicate", JSON.stringify(outcome))
            assert.strictEqual(outcome.message.sequence, seq)
          }
          assert.isTrue(later.some((o) => o.confirmed), "a Duplicate's ack is confirmed")
          assert.strictEqual((yield* transferCounts([id])).get(id), 1, "exactly one effect")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
          const info = yield* stream.info
          assert.strictEqual(info.ack_floor.stream_seq, seq)
        })
    )

    it.effect(
      "BE-JOB-001: broker unavailable: while the broker is cut nothing is delivered, acked or applied; after restore every transfer commits once",
      () =>
        Effect.gen(function*() {
          const { stream, settings } = yield* ledgerStream()
          const { p, a, b } = yield* twoAccounts("brk-cut")
          const proxy = yield* FaultProxy.make({ target: hostPort(natsUrl, 4222) })
          const workerNats = yield* Layer.build(natsVia(proxy))
          const log = yield* OutcomeLog.make
          const worker = yield* Consumer.run(LedgerWorker.consumer(settings, log.record)).pipe(
            Effect.provideContext(workerNats),
            Effect.forkScoped
          )
          // The worker is up and pulling through the proxy.
          yield* eventually("the worker's pull request", Effect.map(stream.info, (i) => i.num_waiting > 0))

          yield* proxy.cut
          // The server has dropped the worker's pull request with its connection.
          yield* eventually("the server to drop the pull request", Effect.map(stream.info, (i) => i.num_waiting === 0))
          const ids = [`${p}.t1`, `${p}.t2`, `${p}.t3`]
          for (const id of ids) yield* stream.publish("eur", transfer(id, a, b, 10_00), id)
          // The worker keeps trying to reach the broker and is turned away, three times over.
          const refusedAtCut = (yield* proxy.stats).refused
          yield* eventually(
            "the worker's reconnect attempts to be refused",
            Effect.map(proxy.stats, (s) => s.refused >= refusedAtCut + 3)
          )
          assert.strictEqual((yield* log.all).length, 0, "no outcome while the broker is cut")
          const cutInfo = yield* stream.info
          assert.strictEqual(cutInfo.ack_floor.stream_seq, 0, "nothing acked")
          assert.strictEqual(cutInfo.num_ack_pending, 0, "nothing delivered")
          assert.strictEqual(cutInfo.num_pending, ids.length, "everything still on the server")
          assert.strictEqual((yield* transferCounts(ids)).size, 0, "no effect")

          yield* proxy.restore
          const outcomes = yield* log.waitUntil(
            (all) => ids.every((id) => all.some((o) => isFor(id)(o) && o._tag === "Committed")),
            "20 seconds",
            "every transfer to commit after the restore"
          )
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          for (const id of ids) assert.strictEqual(count(outcomes, "Committed", id), 1, `${id} committed once`)
          const counts = yield* transferCounts(ids)
          for (const id of ids) assert.strictEqual(counts.get(id), 1, `${id} applied once`)
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
        })
    )

    it.effect(
      "BE-JOB-001: ack matched to the transaction boundary: the ack is sent only after the commit is visible",
      () =>
        Effect.gen(function*() {
          const { stream, settings } = yield* ledgerStream()
          const { p, a, b } = yield* twoAccounts("boundary")
          const committed = `${p}.t1`
          const failing = `${p}.t2`
          const wire = yield* observeWire(stream, stream.consumer, [committed, failing])

          // Holds the transaction of `committed` open at `before-commit` until the test releases it.
          const atCommit = yield* Deferred.make<Probe.Hit>()
          const release = yield* Deferred.make<void>()
          const probe: Probe.ProbeShape = {
            hit: (hit) =>
              hit.point === "before-commit" && hit.eventId === committed
                ? Deferred.succeed(atCommit, hit).pipe(
                  Effect.andThen(Deferred.await(release)),
                  Effect.timeoutOption("15 seconds"),
                  Effect.asVoid
                )
                : Effect.void
          }
          const log = yield* OutcomeLog.make
          const worker = yield* LedgerWorker.runWith(settings, log.record).pipe(
            Effect.provideService(Probe.Probe, probe),
            Effect.forkScoped
          )

          const seq = yield* stream.publish("eur", transfer(committed, a, b, 30_00), committed)
          const hit = yield* awaitBounded("the transaction to reach its commit", atCommit)
          assert.strictEqual(hit.sequence, seq)
          // The effects are done inside the open transaction: the server still holds the message
          // unacked, no ack went over the wire, and no other connection sees the rows yet.
          const held = yield* stream.info
          assert.strictEqual(held.num_ack_pending, 1, "delivered, not acked")
          assert.strictEqual(held.ack_floor.stream_seq, 0, "the ack floor has not moved")
          yield* wire.flush
          assert.deepStrictEqual((yield* wire.arrivals).filter((c) => c.payload === "+ACK"), [], "no ack on the wire")
          assert.strictEqual((yield* transferCounts([committed])).size, 0, "the transfer is not visible yet")
          assert.isFalse(yield* dedupRowExists(stream.consumer, committed), "the dedup row is not visible yet")
          yield* Deferred.succeed(release, undefined)

          yield* log.waitUntil((all) => all.some(isFor(committed)), "20 seconds", "the held transfer's outcome")
          yield* eventually(
            "the ack on the wire",
            Effect.map(wire.commands, (cs) => cs.some((c) => c.sequence === seq && c.payload === "+ACK"))
          )
          const forSeq = (yield* wire.arrivals).filter((c) => c.sequence === seq && c.payload !== "+WPI")
          assert.deepStrictEqual(forSeq.map((c) => c.payload), ["+ACK"], "one ack, and nothing else but extensions")
          const acks = (yield* wire.commands).filter((c) => c.sequence === seq && c.payload === "+ACK")
          assert.deepStrictEqual(acks[0]!.transfersVisible, [committed], "the transfer was visible when the ack arrived")
          assert.deepStrictEqual(acks[0]!.dedupVisible, [committed], "the dedup row was visible when the ack arrived")
          const [outcome] = (yield* log.all).filter(isFor(committed))
          assert.strictEqual(outcome!._tag, "Committed")
          assert.isTrue(outcome!.confirmed)

          // A transaction that fails (unknown account) is never acked: it is dead-lettered, then terminated.
          const failingSeq = yield* stream.publish("eur", transfer(failing, a, `${p}.nobody`, 10_00), failing)
          const dead = (yield* log.waitUntil((all) => all.some(isFor(failing)), "20 seconds", "the failing transfer's outcome"))
            .filter(isFor(failing))[0]!
          assert.strictEqual(dead._tag, "DeadLettered")
          if (dead._tag === "DeadLettered") {
            assert.strictEqual(dead.reason, "PermanentError")
            assert.strictEqual(dead.error.tag, "UnknownAccount")
            assert.isTrue(dead.confirmed)
          }
          yield* eventually(
            "the term on the wire",
            Effect.map(wire.commands, (cs) => cs.some((c) => c.sequence === failingSeq && c.payload.startsWith("+TERM")))
          )
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          yield* wire.flush
          const arrivals = (yield* wire.arrivals).filter((c) => c.sequence === failingSeq && c.payload !== "+WPI")
          assert.deepStrictEqual(arrivals.map((c) => c.payload), ["+TERM"], "terminated, never acked")
          const term = (yield* wire.commands).find((c) => c.sequence === failingSeq && c.payload === "+TERM")!
          assert.strictEqual(term.deadLetters, 1, "the dead letter was stored before the term")
          assert.deepStrictEqual(term.transfersVisible, [committed], "no effect of the failed transaction")
          assert.deepStrictEqual(term.dedupVisible, [committed], "no dedup row of the failed transaction")
          assert.deepStrictEqual(yield* wire.problems, [])
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
        })
    )

    it.effect(
      "BE-JOB-002: concurrent redelivery: two instances sharing only PostgreSQL commit one copy of a transfer; every other copy is a Duplicate",
      () =>
        Effect.gen(function*() {
          const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(5), concurrency: 4 })
          const { p, a, b } = yield* twoAccounts("conc")
          const names = { A: `${p}-instance-a`, B: `${p}-instance-b` } as const
          type Instance = keyof typeof names
          // Each instance: its own NATS connection, its own PostgreSQL pool and its own store.
          const instanceContext = (instance: Instance) =>
            Layer.build(Layer.mergeAll(
              NatsConnection.layer({ servers: natsUrl, name: names[instance] }),
              Layer.merge(PgIdempotencyStore.layer(), PgOutbox.layer()).pipe(
                Layer.provideMerge(TestDatabase.client({ applicationName: names[instance], maxConnections: 5 }))
              )
            ))

          // Copies start their handlers only once both instances hold one, so they race for real;
          // the first to reach its commit is held there until a copy on the other instance is seen
          // waiting on the dedup row's lock.
          const received: Record<Instance, number> = { A: 0, B: 0 }
          const bothHold = yield* Deferred.make<void>()
          const committing = yield* Deferred.make<Instance>()
          const release = yield* Deferred.make<void>()
          const probeFor = (instance: Instance): Probe.ProbeShape => ({
            hit: (hit) => {
              if (hit.point === "received") {
                return Effect.suspend(() => {
                  received[instance]++
                  return received.A > 0 && received.B > 0
                    ? Effect.asVoid(Deferred.succeed(bothHold, undefined))
                    : Effect.asVoid(Deferred.await(bothHold).pipe(Effect.timeoutOption("15 seconds")))
                })
              }
              if (hit.point === "before-commit") {
                return Deferred.succeed(committing, instance).pipe(
                  Effect.flatMap((first) =>
                    first ? Deferred.await(release).pipe(Effect.timeoutOption("15 seconds")) : Effect.void
                  ),
                  Effect.asVoid
                )
              }
              return Effect.void
            }
          })
          const log = yield* OutcomeLog.make
          const byInstance: Record<Instance, Array<Outcome.Outcome>> = { A: [], B: [] }
          const start = (instance: Instance) =>
            Effect.gen(function*() {
              const context = yield* instanceContext(instance)
              const record = (outcome: Outcome.Outcome) =>
                Effect.andThen(Effect.sync(() => byInstance[instance].push(outcome)), log.record(outcome))
              return yield* Consumer.run(LedgerWorker.consumer(settings, record)).pipe(
                Effect.provideContext(context),
                Effect.provideService(Probe.Probe, probeFor(instance)),
                Effect.forkScoped
              )
            })
          const workers = [yield* start("A"), yield* start("B")]
          yield* eventually("both instances to pull", Effect.map(stream.info, (i) => i.num_waiting >= 2))

          // A producer republishing past the duplicate window: ten copies, each with its own
          // Nats-Msg-Id; more than one instance can reserve (4 running, about 4 prefetched).
          const id = `${p}.t1`
          const payload = transfer(id, a, b, 30_00)
          const copies = 10
          const seqs: Array<number> = []
          for (let i = 0; i < copies; i++) seqs.push(yield* stream.publish("eur", payload, `${id}.copy${i}`))

          const winner = yield* awaitBounded("a copy to reach its commit", committing)
          const other: Instance = winner === "A" ? "B" : "A"
          const sql = yield* SqlClient.SqlClient
          yield* eventually(
            `a copy on instance ${other} to wait on the dedup row`,
            Effect.map(
              sql<{ readonly n: number }>`
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE application_name = ${names[other]} AND wait_event_type = 'Lock'`,
              (rows) => (rows[0]?.n ?? 0) > 0
            )
          )
          yield* Deferred.succeed(release, undefined)

          const outcomes = yield* log.waitUntil(
            (all) => seqs.every((seq) => all.some((o) => o.message.sequence === seq && (o._tag === "Committed" || o._tag === "Duplicate"))),
            "20 seconds",
            "every copy to be settled"
          )
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          for (const worker of workers) yield* Fiber.interrupt(worker)
          assert.isAbove(received.A, 0, "instance A handled copies")
          assert.isAbove(received.B, 0, "instance B handled copies")
          const all = yield* log.all
          assert.strictEqual(count(all, "Committed"), 1, "exactly one copy committed")
          assert.strictEqual(count(all, "Duplicate"), all.length - 1, `every other copy is a Duplicate: ${JSON.stringify(OutcomeLog.countByTag(all))}`)
          assert.isAtLeast(outcomes.length, copies)
          assert.strictEqual(byInstance[winner].filter((o) => o._tag === "Committed").length, 1)
          assert.isAbove(byInstance[other].filter((o) => o._tag === "Duplicate").length, 0, "the other instance saw duplicates")
          assert.strictEqual((yield* transferCounts([id])).get(id), 1, "one effect")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
        })
    )

    it.effect(
      "BE-JOB-002: atomicity of deduplication: an effect written and then failed leaves neither the dedup row nor the effect; the redelivered attempt commits both once",
      () =>
        Effect.gen(function*() {
          const { stream } = yield* ledgerStream()
          const { p, a, b } = yield* twoAccounts("atomic")
          const runs = yield* Ref.make(0)
          // What the first attempt saw inside its own transaction, just before it failed.
          const inside = yield* Deferred.make<{ readonly transfers: number; readonly dedup: boolean }>()
          const checked = yield* Deferred.make<void>()
          const log = yield* OutcomeLog.make
          const consumer = Consumer.make({
            name: stream.consumer,
            source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
            schema: TransferEvent,
            metadata,
            handle: (event) =>
              Effect.gen(function*() {
                const run = yield* Ref.updateAndGet(runs, (n) => n + 1)
                // The retry waits until the test has looked at the state the failed attempt left.
                if (run > 1) yield* Deferred.await(checked).pipe(Effect.timeoutOption("15 seconds"))
                return yield* IdempotencyStore.commit(
                  event.id,
                  Effect.gen(function*() {
                    yield* applyTransfer(event)
                    if (run > 1) return
                    const sql = yield* SqlClient.SqlClient
                    const transfers = yield* sql<{ readonly n: number }>`
                      SELECT count(*)::int AS n FROM transfers WHERE id = ${event.id}`
                    const dedup = yield* dedupRowExists(stream.consumer, event.id)
                    yield* Deferred.succeed(inside, { transfers: transfers[0]?.n ?? 0, dedup })
                    return yield* new Flaky({ message: "failed after writing the effect" })
                  })
                )
              }),
            classify: {
              UnknownAccount: "permanent",
              InsufficientFunds: "permanent",
              CurrencyMismatch: "permanent",
              SqlError: "isRetryable",
              IdempotencyError: "isRetryable",
              Flaky: "transient"
            },
            // No in-process retry: the second attempt is a redelivery by the broker.
            retry: Retry.exponential({ attempts: 5, base: "50 millis", cap: "1 second", inProcessRetries: 0 }),
            concurrency: 2,
            onOutcome: log.record
          })
          const worker = yield* Effect.forkScoped(Consumer.run(consumer))

          const id = `${p}.t1`
          const seq = yield* stream.publish("eur", transfer(id, a, b, 30_00), id)
          const released = (yield* log.waitUntil((all) => all.length >= 1, "20 seconds", "the failed attempt's outcome"))[0]!
          assert.strictEqual(released._tag, "Released")
          if (released._tag === "Released") {
            assert.strictEqual(released.reason, "Retrying")
            assert.strictEqual(released.error?.tag, "Flaky")
          }
          // Inside its transaction the first attempt had written both the effect and the dedup row...
          assert.deepStrictEqual(yield* awaitBounded("the first attempt", inside), { transfers: 1, dedup: true })
          // ...and its failure rolled both back.
          assert.strictEqual((yield* transferCounts([id])).size, 0, "no effect after the failure")
          assert.isFalse(yield* dedupRowExists(stream.consumer, id), "no dedup row after the failure")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 100_00n, [b]: 0n })
          yield* Deferred.succeed(checked, undefined)

          const outcomes = yield* log.waitUntil((all) => all.length >= 2, "20 seconds", "the redelivered attempt's outcome")
          yield* eventually("the server to show nothing pending", Effect.map(stream.info, (i) => i.num_ack_pending + i.num_pending === 0))
          yield* Fiber.interrupt(worker)
          assert.deepStrictEqual((yield* log.all).map((o) => o._tag), ["Released", "Committed"])
          assert.strictEqual(outcomes[1]!.message.sequence, seq)
          assert.strictEqual(outcomes[1]!.message.deliveryCount, 2, "committed by the redelivery")
          assert.strictEqual(yield* Ref.get(runs), 2)
          assert.strictEqual((yield* transferCounts([id])).get(id), 1, "the effect, once")
          assert.isTrue(yield* dedupRowExists(stream.consumer, id), "the dedup row, once")
          assert.deepStrictEqual(yield* balances([a, b]), { [a]: 70_00n, [b]: 30_00n })
        })
    )
  })
})

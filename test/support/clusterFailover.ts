/**
 * A reference worker on a three-node JetStream cluster (R3 streams) whose consumer's leader is
 * SIGKILLed while a handler runs: what the cluster failover tests share. The worker runs on a node
 * that does not lead the consumer (it stays connected throughout), and the dead-letter stream is
 * led by a surviving node; a loopback risk service holds its answer for one event until the test
 * has killed the leader, so the handler ends (commits, or is refused) during the election.
 */
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Eventually, NatsServer, TestDatabase } from "@jetworker/testing"
import { Deferred, type Duration, Effect, Schedule, type Scope } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as LedgerWorker from "../../examples/ledger/src/LedgerWorker.ts"
import { settingsFor, workerEnv } from "./ledger.ts"
import { databaseUrl } from "./services.ts"
import * as W from "./worker.ts"

const encoder = new TextEncoder()

/** A JetStream API call, retried while the cluster elects a leader. */
export const api = <A>(call: () => Promise<A>) =>
  Effect.tryPromise(call).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 80 }))

/**
 * A loopback risk service that allows every transfer, but holds its answer for `heldId` until
 * `release` is done; `asked` is done when that request arrives.
 */
const riskService = (heldId: string) =>
  Effect.gen(function*() {
    const asked = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const server = Http.createServer((req, res) => {
      let body = ""
      req.on("data", (chunk) => (body += chunk))
      req.on("end", () => {
        const answer = () => {
          res.writeHead(200, { "content-type": "application/json" })
          res.end(JSON.stringify({ allow: true }))
        }
        const id = (JSON.parse(body) as { readonly id: string }).id
        if (id !== heldId) return answer()
        Effect.runFork(Effect.andThen(Deferred.succeed(asked, undefined), Effect.andThen(Deferred.await(release), Effect.sync(answer))))
      })
    })
    yield* Effect.acquireRelease(
      Effect.callback<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      }),
      () =>
        Effect.sync(() => server.closeAllConnections()).pipe(Effect.andThen(Effect.callback<void>((resume) => {
          server.close(() => resume(Effect.void))
        })))
    )
    return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/check`, asked, release }
  })

/** What `failover` gives the test body. */
export interface Failover {
  readonly settings: LedgerWorker.Settings
  readonly worker: W.Worker
  readonly publish: (id: string, body: string) => Effect.Effect<void, unknown, NatsConnection.NatsConnection>
  /** Finalized with the test's scope: the killed node is started again. */
  readonly killLeaderWhileHeld: Effect.Effect<void, unknown, Scope.Scope>
  /**
   * Like `killLeaderWhileHeld`, but the third node (neither the worker's nor the leader's) is
   * SIGKILLed too, so no leader can be elected until `restore` starts both again: what the worker
   * sends the consumer meanwhile gets no responders, whatever an election would have taken.
   */
  readonly killQuorumWhileHeld: Effect.Effect<{ readonly restore: Effect.Effect<void, unknown> }, unknown, Scope.Scope>
  readonly settledOnBroker: Effect.Effect<void, unknown>
  /**
   * Once `settledOnBroker`: waits until the worker has printed as many outcomes of `eventId` as the
   * broker made deliveries (of this test's one message), at most `timeout`. The broker counts an ack
   * before the worker prints the outcome its answer completes, so reading the outcomes as soon as the
   * broker is settled can miss the last one.
   */
  readonly outcomesOfAllDeliveries: (eventId: string, timeout: Duration.Input) => Effect.Effect<ReadonlyArray<OutcomeLine>, unknown>
  readonly outcomesOf: (eventId: string) => Effect.Effect<ReadonlyArray<OutcomeLine>>
}

/** One `outcome` line of the worker (`test/fixtures/ledger-worker.ts`). */
export interface OutcomeLine {
  readonly tag: string
  readonly sequence: number
  readonly deliveryCount: number
  readonly eventId?: string
  readonly confirmed: boolean
}

/**
 * Runs `body` against a worker on a fresh cluster (see the module): the consumer's leader is
 * known, the accounts `prepare` opens exist, the worker is ready and connected to another node,
 * and the dead-letter stream is led by a node other than the consumer's leader.
 */
export const failover = <A, E, R>(
  options: { readonly label: string; readonly ackWait: Duration.Duration; readonly heldId: string },
  prepare: Effect.Effect<void, unknown, R>,
  body: (f: Failover) => Effect.Effect<A, E, R | NatsConnection.NatsConnection | Scope.Scope>
) =>
  Effect.gen(function*() {
    const cluster = yield* NatsServer.cluster()
    const sfx = crypto.randomUUID().replaceAll("-", "").slice(0, 8)
    const upper = options.label.toUpperCase()
    const settings = settingsFor(
      { stream: `${upper}_${sfx}`, subjectPrefix: `${options.label}.${sfx}.transfer`, consumer: "ledger-applier" },
      { appliedStream: `${upper}_APPLIED_${sfx}`, appliedSubjectPrefix: `${options.label}.${sfx}.applied`, replicas: 3, ackWait: options.ackWait }
    )
    const natsLayer = NatsConnection.layer({ servers: cluster.urls, maxReconnectAttempts: -1, reconnectTimeWait: "200 millis" })
    return yield* Effect.gen(function*() {
      const { connection, manager } = yield* NatsConnection.NatsConnection
      yield* LedgerWorker.setup(settings).pipe(Effect.retry({ schedule: Schedule.spaced("500 millis"), times: 60 }))
      const consumerLeader = (yield* Eventually.poll(
        "the consumer has a leader",
        api(() => manager.consumers.info(settings.stream, settings.consumer)).pipe(Effect.map((i) => i.cluster?.leader)),
        (leader) => leader !== undefined && leader !== "",
        { timeout: "20 seconds" }
      ))!
      const schema = yield* TestDatabase.TestSchema
      yield* prepare
      const risk = yield* riskService(options.heldId)
      const away = cluster.nodes.find((n) => n.name !== consumerLeader)!
      const worker = yield* W.start({
        ...workerEnv(settings, schema.name, databaseUrl, away.url),
        ...W.quickBudget,
        LEDGER_RISK_URL: risk.url,
        LEDGER_RISK_TIMEOUT: "30 seconds"
      })
      yield* W.waitReady(worker, "60 seconds")
      const dlq = `${settings.stream}_DLQ`
      yield* Eventually.holds(
        "the dead-letter stream led by another node than the consumer",
        api(() => manager.streams.info(dlq)).pipe(
          Effect.flatMap((i) =>
            i.cluster?.leader !== undefined && i.cluster.leader !== "" && i.cluster.leader !== consumerLeader
              ? Effect.succeed(true)
              : Effect.ignore(api(() => connection.request(`$JS.API.STREAM.LEADER.STEPDOWN.${dlq}`, "", { timeout: 5_000 }))).pipe(
                Effect.as(false)
              )
          )
        ),
        "30 seconds"
      )
      const killLeaderWhileHeld = Effect.gen(function*() {
        yield* Deferred.await(risk.asked).pipe(Effect.timeout("15 seconds"))
        const killed = cluster.node(consumerLeader)!
        yield* killed.stop("SIGKILL")
        yield* Effect.addFinalizer(() => Effect.ignore(killed.start))
        yield* Deferred.succeed(risk.release, undefined)
      })
      const outcomesOf = (eventId: string) =>
        Effect.map(W.outcomes(worker), (all) => all.filter((o) => o.eventId === eventId) as unknown as ReadonlyArray<OutcomeLine>)
      const third = cluster.nodes.find((n) => n.name !== consumerLeader && n.name !== away.name)!
      const killQuorumWhileHeld = Effect.gen(function*() {
        yield* Deferred.await(risk.asked).pipe(Effect.timeout("15 seconds"))
        const killed = [cluster.node(consumerLeader)!, third]
        for (const node of killed) {
          yield* node.stop("SIGKILL")
          yield* Effect.addFinalizer(() => Effect.ignore(node.start))
        }
        yield* Deferred.succeed(risk.release, undefined)
        return { restore: Effect.forEach(killed, (node) => node.start, { concurrency: "unbounded", discard: true }) }
      })
      const settledOnBroker = Eventually.holds(
        "the consumer has nothing pending or unacknowledged",
        api(() => manager.consumers.info(settings.stream, settings.consumer)).pipe(
          Effect.map((i) => i.num_ack_pending === 0 && i.num_pending === 0)
        ),
        "40 seconds"
      )
      return yield* body({
        settings,
        worker,
        publish: (id, payload) =>
          Effect.asVoid(Publisher.publish(`${settings.subjectPrefix}.eur`, encoder.encode(payload), {
            msgId: id,
            stream: settings.stream,
            attempts: 20,
            timeout: "2 seconds"
          })),
        killLeaderWhileHeld,
        killQuorumWhileHeld,
        settledOnBroker,
        outcomesOfAllDeliveries: (eventId, timeout) =>
          Effect.gen(function*() {
            const deliveries = (yield* api(() => manager.consumers.info(settings.stream, settings.consumer))).delivered.consumer_seq
            return yield* Eventually.poll(
              `${deliveries} outcomes of ${eventId}, one per delivery`,
              outcomesOf(eventId),
              (mine) => mine.length >= deliveries,
              { timeout, interval: "100 millis" }
            )
          }),
        outcomesOf
      })
    }).pipe(Effect.provide(natsLayer))
  }).pipe(Effect.scoped)

/** The log lines of `worker` about sending a command again (`resend` in the engine's settle stage). */
export const resendLines = (logs: ReadonlyArray<W.LogLine>): ReadonlyArray<string> =>
  logs.map((l) => String(l.message)).filter((m) => m.includes("when sent again") || m.includes("still not confirmed after"))

/** Waits until `worker` has printed more than `count` outcomes of `eventId`. */
export const outcomesBeyond = (f: Failover, eventId: string, count: number, timeout: Duration.Input) =>
  Eventually.poll(`more than ${count} outcomes of ${eventId}`, f.outcomesOf(eventId), (mine) => mine.length > count, {
    timeout,
    interval: "100 millis"
  })

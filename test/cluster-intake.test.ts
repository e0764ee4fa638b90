/**
 * The JetStream intake on a three-node cluster when its consumer's leader is SIGKILLed while a
 * pull waits on it: the intake hears the new leader's LEADER_ELECTED advisory and pulls its room
 * again at once (the pulls the dead leader held are written off), instead of waiting for a
 * `409 Leadership Change` or, when none comes, for two missed heartbeats (~10.5-15 s); it never has
 * more than `prefetch` handed out. Also the intake's event lines an operator reads:
 * `intake.leader_changed`, `intake.stalled` and `intake.resumed`, each with the consumer's name.
 */
import { assert, describe, layer } from "@effect/vitest"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, NatsServer } from "@jetworker/testing"
import { AckPolicy, type JetStreamManager } from "@nats-io/jetstream"
import { Context, Effect, Layer, Logger, Schedule } from "effect"

/** The cluster of this file (one for all its tests). */
class Cluster extends Context.Service<Cluster, NatsServer.NatsCluster>()("test/cluster-intake/Cluster") {}

const ClusterLive = Layer.effect(Cluster, NatsServer.cluster())
/** The test's own connection (to every node), for set-up, publishes and consumer info. */
const AdminLive = Layer.unwrap(
  Effect.map(Cluster, (cluster) =>
    NatsConnection.layer({ servers: cluster.urls, maxReconnectAttempts: -1, reconnectTimeWait: "200 millis" }))
)
const TestLive = Layer.provideMerge(AdminLive, ClusterLive)

const encoder = new TextEncoder()

/** A JetStream API call, retried while the cluster elects a leader (it times out meanwhile). */
const api = <A>(call: () => Promise<A>) =>
  Effect.tryPromise(call).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 80 }))

/** Log lines with their level and annotations, and the layer that collects them (replacing the others). */
const collecting = () => {
  const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]), events: (event: string) => lines.filter((l) => l.annotations.event === event) }
}

/** A stream and a durable pull consumer on it, both with three replicas. */
const replicated = (manager: JetStreamManager, name: string) =>
  Effect.gen(function*() {
    yield* api(() => manager.streams.add({ name, subjects: [`${name}.>`], num_replicas: 3 }))
    yield* api(() =>
      manager.consumers.add(name, {
        durable_name: "intake",
        ack_policy: AckPolicy.Explicit,
        ack_wait: 60_000_000_000,
        max_deliver: 10,
        num_replicas: 3
      })
    )
    const leader = yield* Eventually.poll(
      "the consumer has a leader",
      api(() => manager.consumers.info(name, "intake")).pipe(Effect.map((i) => i.cluster?.leader)),
      (leader) => leader !== undefined && leader !== "",
      { timeout: "20 seconds" }
    )
    return { stream: name, consumer: "intake", leader: leader ?? "" }
  })

describe("the JetStream intake on a three-node cluster", () => {
  layer(TestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-004: the node leading the consumer SIGKILLed while the intake waits with an open pull: the intake hears the new leader, pulls from it within 4 s of its election, never has more than prefetch handed out, and logs intake.leader_changed", () =>
      Effect.gen(function*() {
        const cluster = yield* Cluster
        const { connection, jetstream, manager } = yield* NatsConnection.NatsConnection
        const { consumer, leader, stream } = yield* replicated(manager, "INTAKE_FAILOVER")
        // The stream led by another node: publishes after the kill wait for no election of their own.
        // (When the dead node led the stream too, a pull the new consumer leader holds was measured
        // waiting ~5 s for the messages published after the elections, with or without the advisory.)
        yield* Eventually.holds(
          "the stream led by another node than the consumer",
          api(() => manager.streams.info(stream)).pipe(
            Effect.flatMap((i) =>
              i.cluster?.leader !== leader
                ? Effect.succeed(true)
                : api(() => connection.request(`$JS.API.STREAM.LEADER.STEPDOWN.${stream}`, "", { timeout: 5_000 })).pipe(Effect.as(false))
            )
          ),
          "30 seconds"
        )
        // The worker on a node that does not lead the consumer: its pulls travel to the leader.
        const away = cluster.nodes.find((n) => n.name !== leader)!
        const worker = yield* Layer.build(NatsConnection.layer({ servers: away.url }))
        // The server's idle heartbeats to the intake's pulls (status 100 on an inbox).
        const heartbeats: Array<number> = []
        const tap = connection.subscribe("_INBOX.>", {
          callback: (_, msg) => {
            if (msg.headers?.code === 100) heartbeats.push(performance.now())
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => tap.unsubscribe()))
        yield* Effect.promise(() => connection.flush())
        const logged = collecting()
        const prefetch = 10
        const intake = yield* JetStreamSource.make({ stream, consumer, captureMaxDeliveries: false })
          .open({ consumer, prefetch, attempts: 3, ordering: "Unordered" })
          .pipe(Effect.provide(worker), Effect.provide(logged.layer))
        const info = api(() => manager.consumers.info(stream, consumer))
        yield* Eventually.holds("the intake's pull waits on the leader", Effect.map(info, (i) => i.num_waiting === 1), "10 seconds")
        // Killed just after a heartbeat: the watchdog can write the pull off 10.5 s later at the
        // earliest, well after the next leader's election.
        const seen = heartbeats.length
        yield* Eventually.holds("a heartbeat to the waiting pull", Effect.sync(() => heartbeats.length > seen), "10 seconds")
        const killed = cluster.node(leader)!
        yield* killed.stop("SIGKILL")
        yield* Effect.addFinalizer(() => Effect.ignore(killed.start))
        const killedAt = performance.now()
        yield* Eventually.holds(
          "another node leads the consumer",
          Effect.map(info, (i) => i.cluster?.leader !== undefined && i.cluster.leader !== "" && i.cluster.leader !== leader),
          "20 seconds"
        )
        const electedAt = performance.now()
        const published = 3 * prefetch
        for (let n = 0; n < published; n++) {
          yield* api(() => jetstream.publish(`${stream}.a`, encoder.encode(`m${n}`), { msgID: `m${n}` }))
        }
        // The waiting pull died with its leader: the messages come from a new pull.
        const taken = prefetch
        for (let n = 0; n < taken; n++) {
          yield* intake.take.pipe(
            Effect.timeoutOrElse({
              duration: "15 seconds",
              orElse: () => Effect.die(new Error(`message ${n + 1} not taken within 15 s`))
            })
          )
        }
        const tookMs = Math.round(performance.now() - electedAt)
        assert.isBelow(
          tookMs,
          4_000,
          `${taken} messages taken ${tookMs} ms after the new leader was seen (${Math.round(electedAt - killedAt)} ms after the kill)`
        )
        // And no more than prefetch beside what was taken: once no pull waits, every pull is filled.
        const settled = yield* Eventually.poll(
          "the intake's room refilled and no pull waiting",
          info,
          (i) => i.num_ack_pending > taken && i.num_waiting === 0,
          { timeout: "10 seconds" }
        )
        assert.isAtMost(settled.num_ack_pending, taken + prefetch, `handed out ${settled.num_ack_pending} with prefetch ${prefetch} and ${taken} taken`)

        const changes = logged.events("intake.leader_changed")
        assert.isAtLeast(changes.length, 1, JSON.stringify(logged.lines))
        assert.strictEqual(changes[0]!.level, "INFO")
        assert.strictEqual(changes[0]!.annotations.consumer, consumer)
        yield* killed.start
      }).pipe(Effect.scoped), 60_000)

    it.effect("a stalled intake says so (intake.stalled, WARN, with the silence) and says when it pulls again (intake.resumed, INFO, with how long it was stalled)", () =>
      Effect.gen(function*() {
        const cluster = yield* Cluster
        const { manager } = yield* NatsConnection.NatsConnection
        const { consumer, leader, stream } = yield* replicated(manager, "INTAKE_STALL")
        const away = cluster.nodes.find((n) => n.name !== leader)!
        // A link that freezes without breaking: the server keeps the pull, the intake hears nothing.
        const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: away.port } })
        const worker = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}` }))
        const logged = collecting()
        // Heartbeats every 1 s: a pull is silent after 2.5 s.
        yield* JetStreamSource.make({ stream, consumer, captureMaxDeliveries: false, pullExpires: "2 seconds" })
          .open({ consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
          .pipe(Effect.provide(worker), Effect.provide(logged.layer))
        const info = api(() => manager.consumers.info(stream, consumer))
        yield* Eventually.holds("the intake's pull waits on the leader", Effect.map(info, (i) => i.num_waiting >= 1), "10 seconds")
        yield* proxy.pause
        yield* Eventually.holds("the stall logged", Effect.sync(() => logged.events("intake.stalled").length > 0), "15 seconds")
        yield* proxy.resume
        yield* Eventually.holds("the resumption logged", Effect.sync(() => logged.events("intake.resumed").length > 0), "15 seconds")

        const stalled = logged.events("intake.stalled")[0]!
        assert.strictEqual(stalled.level, "WARN")
        assert.strictEqual(stalled.annotations.consumer, consumer)
        const silence = stalled.annotations.silenceMs
        assert.isTrue(typeof silence === "number" && silence >= 2_500, `silenceMs ${String(silence)}`)
        const resumed = logged.events("intake.resumed")[0]!
        assert.strictEqual(resumed.level, "INFO")
        assert.strictEqual(resumed.annotations.consumer, consumer)
        const stalledMs = resumed.annotations.stalledMs
        assert.isTrue(typeof stalledMs === "number" && stalledMs >= (silence as number), `stalledMs ${String(stalledMs)}`)
      }).pipe(Effect.scoped), 60_000)
  })
})

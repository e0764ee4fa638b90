/**
 * Dead-letter streams on a three-node JetStream cluster: the dead-letter and MaxDeliver-capture
 * streams a source ensures are replicated like its source stream, and an operator's replicas
 * are never lowered by a worker (a worker that changes a live stream says so in a log line);
 * `DeadLetter.list` never returns a short list when its temporary consumer lands on a replica
 * that is still catching up after a restart.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, MaxDeliveries, NatsConnection, NatsError } from "@jetworker/nats"
import { Eventually, NatsServer } from "@jetworker/testing"
import { Context, Effect, Layer, Logger, Schedule } from "effect"

class Cluster extends Context.Service<Cluster, NatsServer.NatsCluster>()("test/cluster-dead-letters/Cluster") {}

const ClusterLive = Layer.unwrap(Effect.gen(function*() {
  const cluster = yield* NatsServer.cluster()
  return Layer.merge(
    Layer.succeed(Cluster, cluster),
    NatsConnection.layer({ servers: cluster.urls, name: "cluster-dead-letters-test", maxReconnectAttempts: -1, reconnectTimeWait: "200 millis" })
  )
}))

const encoder = new TextEncoder()

/** A JetStream API call, retried while the cluster elects a leader (it times out meanwhile). */
const api = <A>(call: () => Promise<A>) =>
  Effect.tryPromise(call).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 60 }))

const uniqueName = (prefix: string) => `${prefix}_${crypto.randomUUID().replaceAll("-", "").slice(0, 10).toUpperCase()}`

/** An R3 source stream named `name` capturing `<name>.>`. */
const sourceStream = (name: string) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    yield* api(() => manager.streams.add({ name, subjects: [`${name}.>`], num_replicas: 3 }))
  })

const capturedLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    lines.push(`${logLevel} ${Array.isArray(message) ? message.join(" ") : String(message)}`)
  })
  return { lines, layer: Logger.layer([logger]) }
}

describe("dead-letter streams on a three-node cluster", () => {
  layer(ClusterLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("a source's dead-letter and capture streams get its replicas, and an operator's R3 dead-letter stream keeps its replicas and its age", () =>
      Effect.gen(function*() {
        const { manager } = yield* NatsConnection.NatsConnection
        const source = uniqueName("CDL")
        yield* sourceStream(source)
        const destination = DeadLetter.destination(source, "worker")
        // The operator's own R3 dead-letter stream, with a shorter age than the default.
        yield* api(() =>
          manager.streams.add({ name: destination.stream, subjects: [`jetworker.dlq.${source}.>`], num_replicas: 3, max_age: 3_600_000_000_000 })
        )
        const logs = capturedLogs()
        yield* DeadLetter.ensure(destination).pipe(Effect.provide(logs.layer))
        const dlq = yield* api(() => manager.streams.info(destination.stream))
        assert.strictEqual(dlq.config.num_replicas, 3, "the operator's replicas are kept")
        // And its age: the default is for a stream the worker creates. Only its discard policy is
        // brought to `new` (a full dead-letter stream refuses new dead letters, never drops old
        // ones), and the worker says so.
        assert.strictEqual(dlq.config.max_age, 3_600_000_000_000)
        const line = logs.lines.find((l) => l.includes(destination.stream))
        assert.isDefined(line, `a log line names the stream: ${JSON.stringify(logs.lines)}`)
        assert.include(line!, "discard")
        assert.notInclude(line!, "max_age")
        assert.notInclude(line!, "num_replicas")

        // Created by the worker: as many replicas as the source.
        const other = DeadLetter.destination(source, "other", { stream: `${source}_OTHER_DLQ`, subjectPrefix: "cdl.other" })
        yield* DeadLetter.ensure(other)
        assert.strictEqual((yield* api(() => manager.streams.info(other.stream))).config.num_replicas, 3)
        // One left at 1 replica (by an older version) is brought up to the source's.
        const older = DeadLetter.destination(source, "older", { stream: `${source}_OLDER_DLQ`, subjectPrefix: "cdl.older" })
        yield* api(() => manager.streams.add({ name: older.stream, subjects: ["cdl.older.>"], num_replicas: 1 }))
        const raised = capturedLogs()
        yield* DeadLetter.ensure(older, { stream: older.stream, subjectPrefix: "cdl.older" }).pipe(Effect.provide(raised.layer))
        assert.strictEqual((yield* api(() => manager.streams.info(older.stream))).config.num_replicas, 3)
        assert.isDefined(raised.lines.find((l) => l.includes(older.stream) && l.includes("num_replicas")), JSON.stringify(raised.lines))
        // Declared replicas win.
        const one = DeadLetter.destination(source, "one", { stream: `${source}_ONE_DLQ`, subjectPrefix: "cdl.one" })
        yield* DeadLetter.ensure(one, { stream: one.stream, subjectPrefix: "cdl.one", replicas: 1 })
        assert.strictEqual((yield* api(() => manager.streams.info(one.stream))).config.num_replicas, 1)

        yield* MaxDeliveries.ensure(source, "worker")
        const capture = yield* api(() => manager.streams.info(MaxDeliveries.captureStream(source, "worker")))
        assert.strictEqual(capture.config.num_replicas, 3, "the capture stream has the source's replicas")
      }), 60_000)

    it.effect("DeadLetter.list on a stream whose follower was SIGKILLed and restarted returns every message, or fails retryable (Unavailable while a replica catches up): never a short list", () =>
      Effect.gen(function*() {
        const cluster = yield* Cluster
        const { manager, jetstream } = yield* NatsConnection.NatsConnection
        const stream = uniqueName("CDLL")
        yield* sourceStream(stream)
        const publish = (n: number) =>
          Effect.forEach(
            Array.from({ length: n }, (_, i) => i),
            (i) => api(() => jetstream.publish(`${stream}.m`, encoder.encode(`m${i}`))),
            { concurrency: 50, discard: true }
          )
        yield* publish(20)
        const info = yield* api(() => manager.streams.info(stream))
        const follower = cluster.node((info.cluster?.replicas ?? []).find((r) => r.current)?.name ?? "")
        assert.isDefined(follower, `the stream has a current follower: ${JSON.stringify(info.cluster)}`)
        yield* follower!.stop("SIGKILL")
        yield* publish(2000)
        yield* follower!.start
        const total = 2020
        const sizes: Array<number | string> = []
        // Right after the restart, while the follower catches up, and until every replica is current.
        yield* Eventually.holds(
          "every replica current and a full list",
          Effect.gen(function*() {
            const listed = yield* DeadLetter.list(stream, { limit: 1000 }).pipe(
              Effect.map((messages) => messages.length),
              // A retryable failure is no short list: a replica catching up (Unavailable), or on a
              // loaded machine a request to the cluster that timed out.
              Effect.catchIf((error) => error.isRetryable, (error) => Effect.succeed(`${error.reason}: ${error.message}`))
            )
            sizes.push(listed)
            const now = yield* api(() => manager.streams.info(stream))
            return listed === 1000 && (now.cluster?.replicas ?? []).every((r) => r.current) && sizes.length >= 10
          }),
          "30 seconds"
        )
        assert.deepStrictEqual(
          sizes.filter((size) => typeof size === "number" && size !== 1000),
          [],
          `every list is full or fails Unavailable (of ${total}): ${JSON.stringify(sizes)}`
        )
        for (const size of sizes) {
          if (typeof size === "string" && size.startsWith("Unavailable")) assert.include(size, "catching up")
        }
        const all = yield* DeadLetter.list(stream, { from: 1001, limit: 1000 }).pipe(
          Effect.retry({ while: (error: NatsError.NatsError) => error.isRetryable, times: 5 })
        )
        assert.strictEqual(all.length, 1000)
      }), 60_000)
  })
})

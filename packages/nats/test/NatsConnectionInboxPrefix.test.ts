/**
 * `inboxPrefix` (`NATS_INBOX_PREFIX`): every reply subject of the connection starts with it, the
 * JetStream API's answers and PubAcks (nats.js's own) and also jetworker's pulls and the
 * confirmations of its acks, so a user allowed to subscribe to `<prefix>.>` only can run a consumer
 * and publish. Before, the intake's pulls and the acks' confirmations used `_INBOX.` whatever the
 * prefix: the subscription was refused and the consumer stopped (`NotAuthorized`). Against a
 * private nats-server whose user may subscribe to `_INBOX_svc.>` only.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, type Outcome } from "@jetworker/core"
import { JetStreamSource, NatsConnection, Publisher } from "@jetworker/nats"
import { NatsServer, OutcomeLog } from "@jetworker/testing"
import { AckPolicy } from "@nats-io/jetstream"
import { ConfigProvider, Context, DateTime, Effect, Fiber, Layer, Redacted, Schema } from "effect"

const config = [
  "authorization {",
  "  users: [",
  "    { user: admin, password: admin }",
  "    { user: svc, password: svc, permissions: {",
  "      publish: { allow: [\"$JS.API.>\", \"$JS.ACK.JOBS.worker.>\", \"jobs.>\"] },",
  "      subscribe: { allow: [\"_INBOX_svc.>\"] }",
  "    } }",
  "  ]",
  "}"
].join("\n")

const Job = Schema.Struct({ id: Schema.String })
const encoder = new TextEncoder()

describe("NatsConnection inboxPrefix", () => {
  it.live("a prefix that is no subject prefix is refused before connecting, naming the value", () =>
    Effect.gen(function*() {
      for (const value of ["", "_INBOX.>", "_INBOX.*", "my inbox", "a..b", ".a", "x".repeat(101)]) {
        const error = yield* Effect.flip(Layer.build(NatsConnection.layer({ servers: "nats://127.0.0.1:1", inboxPrefix: value }))).pipe(
          Effect.scoped,
          Effect.timeout("10 seconds")
        )
        assert.include(error.message, "inboxPrefix must be subject tokens of letters, digits, _, - and $", value)
        assert.include(error.message, JSON.stringify(value.slice(0, 100)))
      }
    }))

  it.live("a user allowed to subscribe to its prefix only runs a consumer (pulls, acks confirmed) and publishes", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config })
      const admin = Context.get(
        yield* Layer.build(NatsConnection.layer({ servers: server.url, user: "admin", password: Redacted.make("admin") })),
        NatsConnection.NatsConnection
      )
      yield* Effect.promise(() => admin.manager.streams.add({ name: "JOBS", subjects: ["jobs.>"] }))
      yield* Effect.promise(() => admin.manager.consumers.add("JOBS", { durable_name: "worker", ack_policy: AckPolicy.Explicit }))
      // The prefix from the environment, as a worker reads it.
      const svc = yield* Layer.build(
        NatsConnection.layerConfig({ user: "svc", password: Redacted.make("svc") }).pipe(
          Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnv({ env: { NATS_URL: server.url, NATS_INBOX_PREFIX: "_INBOX_svc" } })))
        )
      )
      assert.strictEqual(Context.get(svc, NatsConnection.NatsConnection).inboxPrefix, "_INBOX_svc")
      const ack = yield* Publisher.publish("jobs.a", encoder.encode(JSON.stringify({ id: "j1" })), { msgId: "j1", stream: "JOBS" }).pipe(
        Effect.provide(svc)
      )
      assert.strictEqual(ack.stream, "JOBS")
      const log = yield* OutcomeLog.make
      const run = yield* Effect.forkChild(Consumer.run(Consumer.make({
        name: "worker",
        source: JetStreamSource.make({ stream: "JOBS", consumer: "worker", captureMaxDeliveries: false }),
        schema: Job,
        metadata: (job) => ({ id: job.id, time: DateTime.makeUnsafe(0) }),
        handle: () => Effect.void,
        classify: {},
        onOutcome: log.record
      })).pipe(Effect.provide(svc)))
      const outcomes = yield* log.waitUntil((all) => all.length >= 1, "15 seconds", "the job's outcome")
      assert.deepStrictEqual(
        outcomes.map((o: Outcome.Outcome) => [o._tag, o.message.eventId, o.confirmed]),
        [["Committed", "j1", true]]
      )
      const info = yield* Effect.promise(() => admin.manager.consumers.info("JOBS", "worker"))
      assert.strictEqual(info.num_ack_pending, 0)
      assert.strictEqual(info.delivered.consumer_seq, 1)
      yield* Fiber.interrupt(run)
    }).pipe(Effect.scoped), 60_000)
})

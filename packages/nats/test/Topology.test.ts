import { assert, describe, layer } from "@effect/vitest"
import { AckPolicy } from "@nats-io/jetstream"
import { NatsConnection, Topology } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

describe("Topology", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a live consumer whose ack policy cannot become explicit is refused with the way out", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.consumers.add(stream.stream, { durable_name: "no-acks", ack_policy: AckPolicy.None }))
        const error = yield* Effect.flip(Topology.ensureConsumer({ stream: stream.stream, name: "no-acks" }))
        assert.include(error.message, "exists with ack policy none")
        assert.include(error.message, `nats consumer rm ${stream.stream} no-acks`)
      }))

    it.effect("a value the server would replace by its default (0 AckWait, MaxAckPending, duplicate window, replicas) is refused, naming the setting, before anything is sent", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const consumers = [
          ["ackWait", { stream: stream.stream, name: "zero-ack-wait", ackWait: 0 }],
          ["maxAckPending", { stream: stream.stream, name: "zero-pending", maxAckPending: 0 }]
        ] as const
        for (const [setting, options] of consumers) {
          const error = yield* Effect.flip(Topology.ensureConsumer(options))
          assert.strictEqual(error.reason, "ApiError")
          assert.include(error.message, `${setting} must be a positive`)
          const created = yield* Effect.promise(() => manager.consumers.info(stream.stream, options.name).then(() => true, () => false))
          assert.isFalse(created, `consumer ${options.name} was created`)
        }
        const name = `${stream.stream}_ZERO`
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        for (const [setting, options] of [
          ["duplicateWindow", { name, subjects: [`${stream.subjectPrefix}-zero.>`], duplicateWindow: "0 millis" }],
          ["replicas", { name, subjects: [`${stream.subjectPrefix}-zero.>`], replicas: 0 }]
        ] as const) {
          const error = yield* Effect.flip(Topology.ensureStream(options))
          assert.strictEqual(error.reason, "ApiError")
          assert.include(error.message, `${setting} must be`)
          const created = yield* Effect.promise(() => manager.streams.info(name).then(() => true, () => false))
          assert.isFalse(created, `stream ${name} was created`)
        }
      }).pipe(Effect.scoped))
  })
})

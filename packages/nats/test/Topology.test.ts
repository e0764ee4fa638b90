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
  })
})

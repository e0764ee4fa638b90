import { assert, describe, layer } from "@effect/vitest"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Empty, headers as natsHeaders } from "@nats-io/transport-node"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

describe("JetStreamSource: a pull the server refuses as a bad request", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a pull answered '400 Bad Request - …' on its inbox ends the intake for good, with the server's words", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { connection } = yield* NatsConnection.NatsConnection
        // Beside the real consumer (which holds the pull open: the stream is empty), a listener on
        // its next-message API answers each pull as nats-server answers one it cannot read.
        const refuser = connection.subscribe(`$JS.API.CONSUMER.MSG.NEXT.${stream.stream}.${stream.consumer}`, {
          callback: (_, msg) => {
            msg.respond(Empty, { headers: natsHeaders(400, "Bad Request - invalid json") })
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => refuser.unsubscribe()))
        yield* Effect.promise(() => connection.flush())
        const intake = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, captureMaxDeliveries: false })
          .open({ consumer: stream.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
        const ended = yield* Effect.flip(intake.take).pipe(
          Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.die(new Error("the intake kept pulling after a 400")) })
        )
        assert.strictEqual(ended.reason, "ContractMismatch", ended.message)
        assert.include(ended.message, `${stream.stream}/${stream.consumer}: the server refuses its pulls: 400 Bad Request - invalid json`)
      }).pipe(Effect.scoped))
  })
})

/**
 * `Publisher.outboxPublisher` after a PubAck that says `duplicate`: the relay republishing a row it
 * had already sent (killed before it could mark it) is the usual case and passes; an id another
 * producer used for another message would make the relay mark the event sent while the stream
 * dropped it. That is refused, retryable, naming the id and the message that holds it, against
 * the real NATS server.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Context, Effect, Layer } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })
const encoder = new TextEncoder()

const relayPublish = (message: Outbox.OutboxMessage) =>
  Effect.gen(function*() {
    const context = yield* Layer.build(Publisher.outboxPublisher({ attempts: 1 }))
    const { publish } = Context.get(context, Outbox.OutboxPublisher)
    return yield* Effect.result(publish(message, undefined))
  })

describe("outboxPublisher and a duplicate PubAck", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-007: a row republished after it was stored passes (the usual duplicate); a row whose id another message holds fails retryable, naming both, instead of being marked sent and lost", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const subject = stream.subject("orders")
        const row = (id: string, body: string): Outbox.OutboxMessage => ({ subject, id, payload: encoder.encode(body), headers: [] })

        // The relay killed after its publish, before marking the row: the next round sends it again.
        const first = yield* relayPublish(row("order-1", `{"n":1}`))
        const again = yield* relayPublish(row("order-1", `{"n":1}`))
        assert.isTrue(first._tag === "Success" && again._tag === "Success", JSON.stringify([first, again]))
        assert.strictEqual(yield* stream.stored, 1)

        // Another producer used the id first, for another message.
        yield* Publisher.publish(subject, encoder.encode(`{"other":true}`), { msgId: "order-2", stream: stream.stream })
        const taken = yield* relayPublish(row("order-2", `{"n":2}`))
        assert.strictEqual(taken._tag, "Failure", "the row would be marked sent, and the stream dropped it")
        if (taken._tag === "Failure") {
          assert.isTrue(taken.failure.retryable, "published once the window has forgotten the id")
          assert.include(taken.failure.message, `Nats-Msg-Id "order-2" is taken: ${stream.stream} holds another message under it (#2, subject ${subject})`)
        }
        assert.strictEqual(yield* stream.stored, 2)
      }).pipe(Effect.scoped))
  })
})

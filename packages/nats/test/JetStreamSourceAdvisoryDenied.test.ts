/**
 * An intake whose user may not subscribe to JetStream's advisories (`$JS.EVENT.ADVISORY.>`): the
 * server refuses its subscription to the consumer's LEADER_ELECTED advisory; the intake says so
 * once and goes on pulling (a leader change is then noticed by its silence watchdog, as before).
 */
import { assert, describe, it } from "@effect/vitest"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, NatsServer } from "@jetworker/testing"
import { AckPolicy } from "@nats-io/jetstream"
import { Context, Effect, Layer, Logger, Redacted } from "effect"

const encoder = new TextEncoder()

describe("JetStreamSource without permission for advisories", () => {
  it.live("the refused LEADER_ELECTED subscription is logged once and the intake goes on delivering", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({
        config: [
          "authorization {",
          "  users: [",
          "    { user: worker, password: secret, permissions: { subscribe: { allow: [\">\"], deny: [\"$JS.EVENT.ADVISORY.>\"] } } }",
          "  ]",
          "}"
        ].join("\n")
      })
      const lines: Array<string> = []
      const logged = Logger.layer([Logger.make(({ message }) => void lines.push(String(Array.isArray(message) ? message[0] : message)))])
      const nats = yield* Layer.build(NatsConnection.layer({ servers: server.url, user: "worker", password: Redacted.make("secret") }))
      const { jetstream, manager } = Context.get(nats, NatsConnection.NatsConnection)
      yield* Effect.promise(() => manager.streams.add({ name: "DENIED", subjects: ["denied.>"] }))
      yield* Effect.promise(() =>
        manager.consumers.add("DENIED", { durable_name: "intake", ack_policy: AckPolicy.Explicit, max_deliver: 10 })
      )
      const intake = yield* JetStreamSource.make({ stream: "DENIED", consumer: "intake", captureMaxDeliveries: false })
        .open({ consumer: "intake", prefetch: 4, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.provide(nats), Effect.provide(logged))
      for (const n of [1, 2, 3]) yield* Effect.promise(() => jetstream.publish("denied.a", encoder.encode(`m${n}`)))
      for (const n of [1, 2, 3]) {
        const delivery = yield* intake.take.pipe(Effect.timeout("10 seconds"))
        assert.strictEqual(delivery.sequence, n)
      }
      const refused = (line: string) => line.includes("cannot subscribe to $JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.DENIED.intake")
      yield* Eventually.holds("the refusal logged", Effect.sync(() => lines.some(refused)), "5 seconds")
      assert.strictEqual(lines.filter(refused).length, 1, lines.join("\n"))
    }).pipe(Effect.scoped), 30_000)
})

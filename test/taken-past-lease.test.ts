/**
 * A delivery taken past its lease (INT-NATS-002): with prefetch above concurrency, a message can
 * wait in the JetStream intake's buffer longer than its ack wait while a slow handler runs. Such a
 * delivery may already belong to another consumer, and its ack would be withheld anyway, so the
 * engine releases it (`LeaseLost`, uncounted) without running its handler; the broker's
 * redelivery runs it once. Before, the handler ran on the stale delivery (its ack withheld) and
 * again on the redelivery: each waiting message was handled twice.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Envelope, type Outcome } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Logger, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (n: number) => JSON.stringify({ id: `j${n}`, type: "test.job", time: new Date().toISOString(), data: { n } })

describe("a delivery taken past its lease", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("is released LeaseLost without running its handler, and its redelivery runs it once", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const handled: Array<string> = []
        const outcomes: Array<Outcome.Outcome> = []
        const fiber = yield* Effect.forkChild(
          Consumer.run(Consumer.make({
            name: test.consumer,
            source: JetStreamSource.make({ stream: test.stream, consumer: test.consumer, captureMaxDeliveries: false, pullExpires: "2 seconds" }),
            schema: Event,
            // The first message's handler outlasts the others' leases while they wait in the
            // buffer (its own lease is kept by the engine's extensions).
            handle: (event) =>
              CurrentDelivery.CurrentDelivery.use((delivery) =>
                Effect.andThen(
                  Effect.sync(() => void handled.push(`${event.data.n}@${delivery.deliveryCount}`)),
                  event.data.n === 1 ? Effect.sleep("3 seconds") : Effect.void
                )
              ),
            classify: {},
            concurrency: 1,
            prefetch: 4,
            onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
          })).pipe(Effect.provide(Logger.layer([])))
        )
        for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
        yield* Eventually.holds(
          "all five committed and acked",
          Effect.map(test.info, (info) =>
            info.num_ack_pending === 0 && info.num_pending === 0 &&
            new Set(outcomes.filter((o) => o._tag === "Committed" && o.confirmed).map((o) => o.message.sequence)).size === 5),
          "30 seconds"
        )
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        const runs = (n: number) => handled.filter((h) => h.startsWith(`${n}@`))
        for (let n = 1; n <= 5; n++) assert.lengthOf(runs(n), 1, `message ${n} handled ${runs(n).length} times: ${handled.join(", ")}`)
        const released = outcomes.filter((o) => o._tag === "Released")
        assert.isAbove(released.length, 0, "no delivery was taken past its lease: the test did not make the case")
        for (const o of released) {
          assert.strictEqual(o._tag === "Released" && o.reason, "LeaseLost", JSON.stringify(o))
          assert.strictEqual(o._tag === "Released" && o.error?.tag, "LeaseLost", JSON.stringify(o))
        }
        // Every committed delivery was acked: none ran past its lease.
        for (const o of outcomes.filter((o) => o._tag === "Committed")) assert.isTrue(o.confirmed, JSON.stringify(o))
        assert.lengthOf(outcomes.filter((o) => o._tag === "Committed"), 5, JSON.stringify(outcomes))
      }).pipe(Effect.scoped), 60_000)
  })
})

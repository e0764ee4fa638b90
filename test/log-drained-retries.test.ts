/**
 * The "drained its backlog" line on the real broker: a message naked for a retry is no longer in
 * JetStream's pending count (it is delivered, waiting for its redelivery), so the consumer saw
 * "nothing left on the broker" and said it had drained while the retry still waited. Now the line
 * waits until that redelivery has settled, and the summary lines say how many deliveries await their
 * redelivery. Against the real NATS server.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, Effect, Fiber, Logger, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (id: string, n: number) => JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { n } })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

describe("the drained line on JetStream", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("is not written while a naked message waits for its retry, and is written once after the retry settles", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const log = yield* OutcomeLog.make
        const lines: Array<string> = []
        const capture = Logger.make(({ message }) => {
          const parts = Array.isArray(message) ? message : [message]
          lines.push(String(parts[0]))
        })
        yield* stream.publish("a", job("j1", 1), "j1")
        yield* stream.publish("a", job("j2", 2), "j2")
        let failed = false
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          // j2 fails once: naked with a 1.5 s backoff.
          handle: (event) =>
            Effect.suspend(() => {
              if (event.id !== "j2" || failed) return Effect.void
              failed = true
              return Effect.fail(new Flaky({ message: "lock timeout" }))
            }),
          classify: { Flaky: "transient" },
          retry: Retry.exponential({ attempts: 3, base: "1500 millis", jitter: false, inProcessRetries: 0 }),
          progressInterval: "200 millis",
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(Logger.layer([capture]))))
        yield* log.waitUntil((all) => all.some((o) => o._tag === "Released"), "15 seconds")
        // While the retry waits, the broker counts nothing pending: what the old line went by.
        const info = yield* stream.info
        assert.deepStrictEqual([info.num_pending, info.num_ack_pending], [0, 1])
        // The summary says what the broker does not: a delivery awaits its redelivery.
        yield* Eventually.poll(
          "a summary line with the awaited retry",
          Effect.sync(() => lines.filter((text) => text.includes(" in the last "))),
          (found) => found.some((text) => text.endsWith("0 in flight, 0 left on the broker, 1 awaiting redelivery")),
          { timeout: "5 seconds" }
        )
        const all = yield* log.waitUntil((all) => all.length >= 3, "15 seconds")
        const drained = (text: string) => text.includes("drained its backlog")
        yield* Eventually.poll("the drained line", Effect.sync(() => lines.filter(drained)), (found) => found.length > 0, {
          timeout: "5 seconds"
        })
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(all.map((o) => `${o._tag} ${o.message.eventId}`), ["Committed j1", "Released j2", "Committed j2"])
        assert.deepStrictEqual(lines.filter(drained), [
          `consumer ${stream.consumer} drained its backlog (3 settled: 2 Committed, 1 Released)`
        ])
      }))
  })
})

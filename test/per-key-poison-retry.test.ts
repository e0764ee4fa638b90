/**
 * Per-key ordering (BE-JOB-004) against the real NATS JetStream, with poison messages and
 * redeliveries interleaved with a key's other messages: never two handlers of a key at once, and
 * the key's order kept among first deliveries.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Envelope, Retry } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, Effect, Fiber, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Job = Envelope.schema("test.job", Schema.Struct({ key: Schema.String, n: Schema.Number, kind: Schema.String }))
const job = (id: string, key: string, n: number, kind = "ok") =>
  JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { key, n, kind } })

class Poison extends Data.TaggedError("Poison")<{ readonly message: string }> {}
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

/** A recorder of handler starts and ends per key, finding overlaps of one key's handlers. */
const tracker = () => {
  const events: Array<string> = []
  const running = new Map<string, number>()
  const overlaps: Array<string> = []
  const around = <X, Y, Z>(key: string, label: string, effect: Effect.Effect<X, Y, Z>) =>
    Effect.suspend(() => {
      const now = (running.get(key) ?? 0) + 1
      running.set(key, now)
      if (now > 1) overlaps.push(`${now} handlers of ${key} at once (${label})`)
      events.push(`start ${label}`)
      return effect.pipe(Effect.ensuring(Effect.sync(() => {
        running.set(key, running.get(key)! - 1)
        events.push(`end ${label}`)
      })))
    })
  return { events, overlaps, around }
}

describe("per-key ordering with poison messages and retries, on the real JetStream", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-JOB-004: per key: a poison message (dead-lettered) between two of its key: the next one starts only after the poison's handler ended, and the key's others run in order", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const t = tracker()
        const plan = [["k", 1, "ok"], ["k", 2, "poison"], ["other", 1, "ok"], ["k", 3, "ok"], ["k", 4, "poison"], ["k", 5, "ok"]] as const
        for (const [i, [key, n, kind]] of plan.entries()) yield* stream.publish(key, job(`p${i}`, key, n, kind), `p${i}`)
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: { perKey: (event) => event.data.key },
          handle: (event) =>
            t.around(event.data.key, `${event.data.key}${event.data.n}`, Effect.gen(function*() {
              yield* Effect.sleep("150 millis")
              if (event.data.kind === "poison") return yield* new Poison({ message: `job ${event.data.n} is poison` })
            })),
          classify: { Poison: "permanent" },
          concurrency: 4,
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const outcomes = yield* log.waitUntil((all) => all.length >= plan.length, "30 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(t.overlaps, [])
        const ofKey = t.events.filter((e) => / k\d$/.test(e))
        assert.deepStrictEqual(ofKey, ["start k1", "end k1", "start k2", "end k2", "start k3", "end k3", "start k4", "end k4", "start k5", "end k5"])
        assert.deepStrictEqual(
          outcomes.map((o) => `${o.message.eventId}:${o._tag}`).sort(),
          ["p0:Committed", "p1:DeadLettered", "p2:Committed", "p3:Committed", "p4:DeadLettered", "p5:Committed"]
        )
      }))

    it.effect("BE-JOB-004: per key: a message released for a retry comes back while later ones of its key run: its redelivery waits for its turn (never two of a key at once)", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const t = tracker()
        for (let n = 1; n <= 6; n++) yield* stream.publish("k", job(`r${n}`, "k", n), `r${n}`)
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: { perKey: (event) => event.data.key },
          handle: (event) =>
            Effect.gen(function*() {
              const { deliveryCount } = yield* CurrentDelivery.CurrentDelivery
              yield* t.around("k", `${event.data.n}#${deliveryCount}`, Effect.gen(function*() {
                yield* Effect.sleep("150 millis")
                if (event.data.n === 1 && deliveryCount === 1) return yield* new Flaky({ message: "first delivery fails" })
              }))
            }),
          classify: { Flaky: "transient" },
          retry: Retry.exponential({ attempts: 3, base: "200 millis", cap: "300 millis", jitter: false, inProcessRetries: 0 }),
          concurrency: 4,
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        yield* log.waitUntil((all) => all.filter((o) => o._tag === "Committed").length >= 6, "30 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(t.overlaps, [])
        const starts = t.events.filter((e) => e.startsWith("start ")).map((e) => e.slice(6))
        assert.strictEqual(starts[0], "1#1")
        assert.include(starts, "1#2")
        // The later ones keep their order among themselves.
        assert.deepStrictEqual(starts.filter((s) => !s.startsWith("1#")), ["2#1", "3#1", "4#1", "5#1", "6#1"])
      }))
  })
})

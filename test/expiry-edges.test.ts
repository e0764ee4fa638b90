/**
 * Work expiry (BE-JOB-005) at its edges, against the real NATS JetStream: an expired event whose
 * dead letter (onExpired "deadLetter") cannot be written, expiry decided after a retry's backoff,
 * and expiry while a delivery waits for its key's turn.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Envelope, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, Effect, Fiber, Metric, Schema } from "effect"
import { DiscardPolicy, RetentionPolicy, StorageType } from "@nats-io/jetstream"
import { NatsLive } from "./support/services.ts"

const Job = Envelope.schema("test.job", Schema.Struct({ key: Schema.String, n: Schema.Number }))
const job = (id: string, key: string, n: number, expiresAt?: number) =>
  JSON.stringify({
    id,
    type: "test.job",
    time: new Date().toISOString(),
    ...(expiresAt === undefined ? {} : { expiresAt: new Date(expiresAt).toISOString() }),
    data: { key, n }
  })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}

const metricValue = (id: string, name: string, where: Record<string, string> = {}) =>
  Effect.map(Metric.snapshot, (snapshots) =>
    snapshots
      .filter((m) =>
        m.id === id && m.attributes?.consumer === name &&
        Object.entries(where).every(([k, v]) => m.attributes?.[k] === v)
      )
      .reduce((sum, m) => {
        const state = m.state as { readonly count?: number | bigint; readonly value?: number | bigint }
        return sum + Number(state.count ?? state.value ?? 0)
      }, 0))

const describeOutcome = (o: { readonly _tag: string; readonly message: { readonly deliveryCount: number }; readonly confirmed: boolean }) =>
  `${o._tag}${"reason" in o ? `(${String(o.reason)})` : "stage" in o ? `(${String(o.stage)})` : ""}#${o.message.deliveryCount}${o.confirmed ? "" : "!"}`

describe("expiry at its edges, on the real JetStream", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-JOB-005: onExpired deadLetter with the dead-letter stream full: released DeadLetterFailed (never success), then dead-lettered Expired once there is room, counted once, the handler never run", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds", maxDeliver: 10 })
        const { manager } = yield* NatsConnection.NatsConnection
        // The dead-letter stream exists already, full: one message of at most one, discard new.
        const dlq = stream.deadLetterStream
        yield* Effect.promise(() =>
          manager.streams.add({
            name: dlq,
            subjects: [`jetworker.dlq.${stream.stream}.>`],
            retention: RetentionPolicy.Limits,
            storage: StorageType.File,
            max_msgs: 1,
            discard: DiscardPolicy.New
          })
        )
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(dlq).catch(() => false)))
        const { jetstream } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => jetstream.publish(`jetworker.dlq.${stream.stream}.filler`, "filler"))
        const log = yield* OutcomeLog.make
        let ran = 0
        const before = yield* metricValue("jetworker.expired", stream.consumer)
        yield* stream.publish("k", job("x1", "k", 1, Date.now() - 60_000), "x1")
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          handle: () => Effect.sync(() => void ran++),
          classify: {},
          expiry: { onExpired: "deadLetter" },
          retry: Retry.exponential({ attempts: 3, base: "100 millis", inProcessRetries: 0 }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const first = yield* log.waitUntil((all) => all.length >= 1, "20 seconds")
        assert.deepStrictEqual(first.map(describeOutcome), ["Released(DeadLetterFailed)#1"])
        // Room again.
        yield* Effect.promise(() => manager.streams.purge(dlq))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "20 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map(describeOutcome), ["Released(DeadLetterFailed)#1", "Expired(BeforeHandler)#2"])
        assert.strictEqual(ran, 0)
        const letters = yield* DeadLetter.list(dlq)
        assert.deepStrictEqual(letters.map((l) => [l.eventId, l.reason]), [["x1", "Expired"]])
        assert.strictEqual((yield* metricValue("jetworker.expired", stream.consumer)) - before, 1)
        assert.strictEqual((yield* stream.info).num_ack_pending, 0)
      }))

    it.effect("BE-JOB-005: expiry after a retry's backoff: the redelivery after the nak delay is Expired before the handler runs again", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const runs: Array<number> = []
        yield* stream.publish("k", job("e1", "k", 1, Date.now() + 1_500), "e1")
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          handle: () =>
            Effect.gen(function*() {
              const current = yield* CurrentDelivery.CurrentDelivery
              runs.push(current.deliveryCount)
              return yield* new Flaky({ message: "down" })
            }),
          classify: { Flaky: "transient" },
          retry: Retry.exponential({ attempts: 5, base: "2500 millis", cap: "3 seconds", jitter: false, inProcessRetries: 2, inProcessMaxDelay: "1 second" }),
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "20 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map(describeOutcome), ["Released(Retrying)#1", "Expired(BeforeHandler)#2"])
        assert.deepStrictEqual(runs, [1])
      }))

    it.effect("BE-JOB-005/BE-JOB-004: a delivery that expires while it waits for its key's turn ends Expired (AfterWait) without running its handler", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        const log = yield* OutcomeLog.make
        const ran: Array<number> = []
        yield* stream.publish("k", job("w1", "k", 1), "w1")
        yield* stream.publish("k", job("w2", "k", 2, Date.now() + 700), "w2")
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Job,
          ordering: { perKey: (event) => event.data.key },
          handle: (event) => Effect.andThen(Effect.sync(() => ran.push(event.data.n)), event.data.n === 1 ? Effect.sleep("1500 millis") : Effect.void),
          classify: {},
          concurrency: 4,
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "20 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => `${o.message.eventId}:${describeOutcome(o)}`).sort(), ["w1:Committed#1", "w2:Expired(AfterWait)#1"])
        assert.deepStrictEqual(ran, [1])
      }))
  })
})

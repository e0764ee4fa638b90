/**
 * BE-SHUT-002 with per-key ordering (BE-JOB-004), against the real JetStream: a consumer that
 * stops starts no handler after that. Deliveries waiting in this instance for their key's turn are
 * released (`Released`, `Interrupted`, uncounted) when their turn comes, after the running handler
 * of their key, so that the broker hands them out again in the key's order. Before, each waiting
 * delivery ran its handler in turn inside the drain: four transfers of one account, each 700 ms,
 * ran one after another after the stop began (and past the drain budget they were cut there).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope, type Outcome } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Job = Envelope.schema("test.job", Schema.Struct({ key: Schema.String, n: Schema.Number }))
const job = (id: string, key: string, n: number) =>
  JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { key, n } })

const show = (o: Outcome.Outcome) => `${o.message.eventId}:${o._tag}${"reason" in o ? `(${o.reason})` : ""}#${o.message.deliveryCount}`

describe("per-key ordering at shutdown", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-SHUT-002/BE-JOB-004: deliveries waiting for their key's turn when the consumer stops are released, not run, and come back in the key's order", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "30 seconds" })
        for (let n = 1; n <= 4; n++) yield* stream.publish("k", job(`s${n}`, "k", n), `s${n}`)
        const started: Array<string> = []
        const consumerOf = (log: OutcomeLog.OutcomeLog, stopping: () => boolean, startedAfterStop: Array<number>) =>
          Consumer.make({
            name: stream.consumer,
            source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
            schema: Job,
            ordering: { perKey: (event) => event.data.key },
            handle: (event) =>
              Effect.suspend(() => {
                started.push(`k${event.data.n}`)
                if (stopping()) startedAfterStop.push(event.data.n)
                return Effect.sleep("700 millis") // the handler's own work
              }),
            classify: {},
            concurrency: 4,
            drainTimeout: "10 seconds",
            onOutcome: log.record
          })

        // First run: k1 runs, k2..k4 wait in this instance for their turn; then the consumer stops.
        const first = yield* OutcomeLog.make
        let stopping = false
        const startedAfterStop: Array<number> = []
        const fiber = yield* Effect.forkChild(Consumer.run(consumerOf(first, () => stopping, startedAfterStop)))
        yield* Eventually.holds("the first handler of the key running", Effect.sync(() => started.includes("k1")), "20 seconds")
        // All four handed out to this instance (the engine takes them into the key's lane as they
        // arrive; one still in the intake's buffer at the stop is handed back without an outcome).
        yield* Eventually.holds("all four handed out", Effect.map(stream.info, (info) => info.num_ack_pending === 4), "20 seconds")
        stopping = true
        yield* Fiber.interrupt(fiber)
        const outcomes = (yield* first.all).map(show)
        assert.deepStrictEqual(startedAfterStop, [], `handlers started after the stop began: ${outcomes.join(", ")}`)
        // s1 committed; the others released by the engine (waiting for their turn) or, if one was
        // still in the intake's buffer, handed back by the intake without an outcome.
        assert.include(outcomes, "s1:Committed#1")
        assert.deepStrictEqual(outcomes.filter((o) => o !== "s1:Committed#1" && !/^s[234]:Released\(Interrupted\)#1$/.test(o)), [])

        // Second run: the released ones come back, each handled once, in the key's order.
        const second = yield* OutcomeLog.make
        const again = yield* Effect.forkChild(Consumer.run(consumerOf(second, () => false, [])))
        const after = yield* second.waitUntil((all) => all.length >= 3, "30 seconds")
        yield* Fiber.interrupt(again)
        assert.deepStrictEqual(after.map((o) => `${o.message.eventId}:${o._tag}`), ["s2:Committed", "s3:Committed", "s4:Committed"])
        assert.deepStrictEqual(started, ["k1", "k2", "k3", "k4"])
      }))
  })
})

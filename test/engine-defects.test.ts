/**
 * Every delivery ends in exactly one outcome, whatever user code the engine calls throws or
 * does (BE-JOB-003): a `metadata` that throws or returns no id, a handler that throws instead
 * of returning an Effect, an `onOutcome` that throws or hangs. Against the real NATS server.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, DateTime, Effect, Fiber, Ref, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String, n: Schema.Number })
const job = (id: string, n: number) => JSON.stringify({ id, n })
const metadataOf = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

const consumerOf = (stream: TestStream.TestStream) => ({
  name: stream.consumer,
  source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
  schema: Event,
  classify: {},
  retry: Retry.exponential({ attempts: 2, base: "10 millis" })
})

describe("engine: user code that throws", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("BE-JOB-003: a metadata function that throws or returns no id ends the delivery Rejected and dead-lettered with the cause; the next delivery still commits", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const log = yield* OutcomeLog.make
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream),
          metadata: (event) => {
            if (event.n === 1) throw new Error("metadata exploded")
            if (event.n === 2) return { id: "", time: DateTime.makeUnsafe(0) }
            // No `time`: reading it throws inside the engine's checks, a defect the safety net catches.
            if (event.n === 4) return { id: event.id } as unknown as ReturnType<typeof metadataOf>
            return metadataOf(event)
          },
          handle: () => Effect.void,
          onOutcome: log.record
        })))
        yield* stream.publish("a", job("throws", 1), "throws")
        yield* stream.publish("a", job("noid", 2), "noid")
        yield* stream.publish("a", job("notime", 4), "notime")
        yield* stream.publish("a", job("fine", 3), "fine")
        const outcomes = yield* log.waitUntil((all) => all.length >= 4, "10 seconds", "four outcomes")
        yield* Fiber.interrupt(fiber)
        const bySequence = [...outcomes].sort((x, y) => x.message.sequence - y.message.sequence)
        assert.deepStrictEqual(bySequence.map((o) => o._tag), ["Rejected", "Rejected", "DeadLettered", "Committed"])
        const [threw, noId, noTime] = bySequence
        assert.strictEqual(noTime!._tag === "DeadLettered" && noTime!.reason, "Defect")
        assert.strictEqual(threw!._tag === "Rejected" && threw!.reason, "MetadataInvalid")
        assert.match(threw!._tag === "Rejected" ? threw!.error.message : "", /metadata exploded/)
        assert.strictEqual(noId!._tag === "Rejected" && noId!.reason, "MetadataInvalid")
        assert.isTrue(bySequence.every((o) => o.confirmed))
        const dead = yield* DeadLetter.list(stream.deadLetterStream)
        // Dead-lettered by concurrent workers: in no particular order.
        assert.deepStrictEqual(
          dead.map((d) => [d.sourceSequence, d.reason]).sort(([x], [y]) => Number(x) - Number(y)),
          [[1, "MetadataInvalid"], [2, "MetadataInvalid"], [3, "Defect"]]
        )
        // Settled once each: nothing is left for redelivery.
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0)
        assert.strictEqual(info.num_redelivered, 0)
      }))

    it.effect("BE-JOB-003: a handler that throws instead of returning an Effect fails its attempt like a defect, and ends DeadLettered after the attempts", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 })
        const log = yield* OutcomeLog.make
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream),
          metadata: metadataOf,
          handle: (event): Effect.Effect<void> => {
            if (event.n === 1) throw new Error("handler threw synchronously")
            return Effect.void
          },
          onOutcome: log.record
        })))
        yield* stream.publish("a", job("sync-throw", 1), "sync-throw")
        const outcomes = yield* log.waitUntil((all) => all.some((o) => o._tag === "DeadLettered"), "15 seconds", "a dead letter")
        yield* Fiber.interrupt(fiber)
        const final = outcomes.find((o) => o._tag === "DeadLettered")!
        assert.strictEqual(final._tag === "DeadLettered" && final.reason, "AttemptsExhausted")
        assert.match(final._tag === "DeadLettered" ? final.error.message : "", /handler threw synchronously/)
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Released", "DeadLettered"])
      }))

    it.effect("BE-JOB-003: an onOutcome that throws loses no outcome and stops nothing; one that hangs is cut at its bound and does not hold the shutdown", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const seen = yield* Ref.make<ReadonlyArray<string>>([])
        const throwing = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream),
          metadata: metadataOf,
          handle: () => Effect.void,
          onOutcome: (outcome) => {
            Effect.runSync(Ref.update(seen, (xs) => [...xs, outcome.message.eventId ?? "?"]))
            throw new Error("onOutcome exploded")
          }
        })))
        yield* stream.publish("a", job("o1", 1), "o1")
        yield* stream.publish("a", job("o2", 2), "o2")
        yield* Eventually.holds("both outcomes reached onOutcome", Effect.map(Ref.get(seen), (xs) => xs.length === 2))
        assert.isUndefined(throwing.pollUnsafe(), "the consumer still runs")
        yield* Fiber.interrupt(throwing)
        const info = yield* stream.info
        assert.strictEqual(info.num_ack_pending, 0, "both were acked")
        // A hanging onOutcome: interruption (shutdown) completes within its bound.
        const started = yield* Ref.make(false)
        const hanging = yield* Effect.forkChild(Consumer.run(Consumer.make({
          ...consumerOf(stream),
          metadata: metadataOf,
          handle: () => Effect.void,
          onOutcomeTimeout: "300 millis",
          drainTimeout: "10 seconds",
          onOutcome: () => Effect.andThen(Ref.set(started, true), Effect.never)
        })))
        yield* stream.publish("a", job("o3", 3), "o3")
        yield* Eventually.holds("onOutcome started", Ref.get(started))
        const before = yield* Clock.currentTimeMillis
        yield* Fiber.interrupt(hanging).pipe(Effect.timeout("5 seconds"))
        assert.isBelow((yield* Clock.currentTimeMillis) - before, 2_000, "bounded by onOutcomeTimeout, not the drain")
      }))

    it.effect("BE-SHUT-004: an onOutcome still running when the drain budget ends stays bounded by onOutcomeTimeout, whether its handler finished within the drain or was cut after it", () =>
      Effect.gen(function*() {
        // The drain budget (200 ms) ends before the hanging onOutcome's own bound (600 ms): what is
        // left is interrupted and awaited, and the bound must still cut the onOutcome then.
        for (const handlerOutlivesDrain of [false, true]) {
          const stream = yield* TestStream.make({ ackWait: "5 seconds" })
          const started = yield* Ref.make(false)
          const consumer = yield* Effect.forkChild(Consumer.run(Consumer.make({
            ...consumerOf(stream),
            metadata: metadataOf,
            handle: () => handlerOutlivesDrain ? Effect.never : Effect.void,
            onOutcomeTimeout: "600 millis",
            drainTimeout: "200 millis",
            onOutcome: () => Effect.andThen(Ref.set(started, true), Effect.never)
          })))
          const id = handlerOutlivesDrain ? "cut" : "finished"
          yield* stream.publish("a", job(id, 1), id)
          if (!handlerOutlivesDrain) yield* Eventually.holds("onOutcome started", Ref.get(started))
          else yield* Eventually.holds("the handler runs", Effect.map(stream.info, (info) => info.num_ack_pending === 1))
          const before = yield* Clock.currentTimeMillis
          const stopped = yield* Fiber.interrupt(consumer).pipe(Effect.timeoutOption("10 seconds"))
          assert.isTrue(stopped._tag === "Some", `the consumer did not stop (handler ${id})`)
          assert.isBelow((yield* Clock.currentTimeMillis) - before, 3_000, `bounded by the drain and onOutcomeTimeout (handler ${id})`)
        }
      }))
  })
})

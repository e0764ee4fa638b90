/**
 * A delivery's span, over the real NATS server: with no tracing backend (the native tracer) the
 * engine builds a light span of its own, which must still continue the publisher's trace into the
 * handler (its current span, the spans it opens, its log lines); with a tracer installed, the span
 * is the tracer's, with the messaging attributes and the outcome.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { JsonLogger } from "@jetworker/node"
import { OutcomeLog, SpanLog, TestStream } from "@jetworker/testing"
import { DateTime, Deferred, Effect, Fiber, Logger, Option, Result, Schema, Tracer } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

/** A consumer of `stream`'s durable with `handle`, reporting its outcomes to `outcomes`. */
const consumerOf = (
  stream: TestStream.TestStream,
  handle: (event: typeof Event.Type) => Effect.Effect<void>,
  outcomes: OutcomeLog.OutcomeLog
) =>
  Consumer.run(Consumer.make({
    name: stream.consumer,
    source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
    schema: Event,
    metadata,
    handle,
    classify: {},
    onOutcome: outcomes.record
  }))

/** What the handler saw of its trace. */
interface Seen {
  readonly current: Tracer.Span
  readonly nested: Tracer.Span
}

describe("a delivery's span", () => {
  layer(NatsLive, { timeout: "60 seconds" })((it) => {
    it.effect("with no tracing backend, it continues the publisher's trace: the handler's current span, the spans it opens and its log lines carry it", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const outcomes = yield* OutcomeLog.make
        const seen = yield* Deferred.make<Seen>()
        const lines: Array<Record<string, unknown>> = []
        const capture = Logger.map(JsonLogger.formatter, (line) => {
          lines.push(JSON.parse(line) as Record<string, unknown>)
        })
        const handle = () =>
          Effect.gen(function*() {
            const current = yield* Effect.currentSpan
            yield* Effect.logInfo("handler.ran")
            const nested = yield* Effect.currentSpan.pipe(Effect.withSpan("handler.work"))
            yield* Deferred.succeed(seen, { current, nested })
          }).pipe(Effect.orDie)
        const fiber = yield* Effect.forkChild(consumerOf(stream, handle, outcomes).pipe(Effect.provide(Logger.layer([capture]))))
        // The publisher's side: Publisher injects the `traceparent` of its publish span.
        const publisher = yield* Effect.currentSpan.pipe(
          Effect.tap(() => stream.publish("a", JSON.stringify({ id: "traced" }), "traced")),
          Effect.withSpan("test.publisher")
        )
        const { current, nested } = yield* Deferred.await(seen).pipe(Effect.timeout("15 seconds"))
        yield* outcomes.waitUntil((all) => all.length === 1, "15 seconds", "the outcome")
        yield* Fiber.interrupt(fiber)

        assert.strictEqual(current.name, `process ${stream.stream}/${stream.consumer}`)
        assert.strictEqual(current.kind, "consumer")
        assert.strictEqual(current.traceId, publisher.traceId, "the delivery's span continues the publisher's trace")
        const parent = Option.getOrUndefined(current.parent)
        assert.isDefined(parent)
        assert.notStrictEqual(parent!.spanId, publisher.spanId, "its parent is the publish span, a child of the publisher's")
        assert.strictEqual(current.status._tag, "Ended", "ended with the delivery")
        assert.strictEqual(nested.traceId, publisher.traceId)
        assert.strictEqual(Option.getOrUndefined(nested.parent)?.spanId, current.spanId, "a span the handler opens is a child of the delivery's")
        const line = lines.find((l) => l.message === "handler.ran")
        assert.isDefined(line, JSON.stringify(lines))
        assert.strictEqual(line!.traceId, publisher.traceId)
        assert.strictEqual(line!.spanId, current.spanId)
        assert.deepStrictEqual((yield* outcomes.all).map((o) => o._tag), ["Committed"])
      }))

    it.effect("with a tracer installed, it is the tracer's span, with the messaging attributes and the outcome, ended", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const outcomes = yield* OutcomeLog.make
        const spans = yield* SpanLog.make
        const fiber = yield* Effect.forkChild(consumerOf(stream, () => Effect.void, outcomes).pipe(Effect.withTracer(spans.tracer)))
        yield* stream.publish("a", JSON.stringify({ id: "exported" }), "exported")
        yield* outcomes.waitUntil((all) => all.length === 1, "15 seconds", "the outcome")
        yield* Fiber.interrupt(fiber)

        const [span] = yield* spans.named(`process ${stream.stream}/${stream.consumer}`)
        assert.isDefined(span, (yield* spans.all).map((s) => s.name).join(", "))
        assert.strictEqual(span!.kind, "consumer")
        assert.strictEqual(span!.status._tag, "Ended")
        assert.deepInclude(Object.fromEntries(span!.attributes), {
          "messaging.system": "nats",
          "messaging.operation.type": "process",
          "messaging.destination.name": stream.subject("a"),
          "messaging.consumer.group.name": stream.consumer,
          "messaging.message.id": "exported",
          "jetworker.outcome": "Committed"
        })
      }))

    it.effect("span names stay few when subjects carry entity ids: named by the stream and consumer (process) or the stream (send), the subject an attribute", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const outcomes = yield* OutcomeLog.make
        const spans = yield* SpanLog.make
        const fiber = yield* Effect.forkChild(consumerOf(stream, () => Effect.void, outcomes).pipe(Effect.withTracer(spans.tracer)))
        const ids = ["8812", "8813", "8814"]
        for (const id of ids) {
          yield* stream.publish(`created.${id}`, JSON.stringify({ id }), id).pipe(Effect.withTracer(spans.tracer))
        }
        yield* outcomes.waitUntil((all) => all.length === ids.length, "15 seconds", "the outcomes")
        yield* Fiber.interrupt(fiber)

        const all = yield* spans.all
        assert.deepStrictEqual(
          [...new Set(all.map((s) => s.name))].sort(),
          [`process ${stream.stream}/${stream.consumer}`, `send ${stream.stream}`],
          "one name per consumer and one per stream, whatever the subjects"
        )
        for (const [name, kind] of [[`process ${stream.stream}/${stream.consumer}`, "consumer"], [`send ${stream.stream}`, "producer"]] as const) {
          const named = yield* spans.named(name)
          assert.deepStrictEqual(
            named.map((s) => s.attributes.get("messaging.destination.name")).sort(),
            ids.map((id) => stream.subject(`created.${id}`)),
            `${name}: the full subject is the destination attribute`
          )
          assert.isTrue(named.every((s) => s.kind === kind), name)
        }
      }))

    it.effect("a batch's span is linked to the publish span of each of its elements (a batch has many producers' traces)", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const outcomes = yield* OutcomeLog.make
        const spans = yield* SpanLog.make
        // Published first, so that the batch forms of all three.
        const publishers: Array<Tracer.Span> = []
        for (const id of ["b1", "b2", "b3"]) {
          publishers.push(
            yield* Effect.currentSpan.pipe(
              Effect.tap(() => stream.publish("a", JSON.stringify({ id }), id)),
              Effect.withSpan(`test.publisher.${id}`)
            )
          )
        }
        const consumer = Consumer.makeBatch({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata,
          batch: { maxSize: 3, maxWait: "2 seconds" },
          handleBatch: (events) => Effect.succeed(events.map(() => Result.succeed(undefined))),
          classify: {},
          onOutcome: outcomes.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.withTracer(spans.tracer)))
        yield* outcomes.waitUntil((all) => all.length === 3, "15 seconds", "the three outcomes")
        yield* Fiber.interrupt(fiber)

        const batches = yield* spans.named(`process ${stream.stream}/${stream.consumer}`)
        assert.strictEqual(batches.length, 1, "one batch of three")
        const linked = batches[0]!.links.map((link) => link.span.traceId).sort()
        assert.deepStrictEqual(linked, publishers.map((p) => p.traceId).sort(), "linked to each producer's trace")
        for (const link of batches[0]!.links) {
          assert.notInclude(publishers.map((p) => p.spanId), link.span.spanId, "to the publish span, a child of the publisher's")
        }
      }))
  })
})

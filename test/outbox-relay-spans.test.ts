/**
 * The outbox relay's tracing: a relay polls its table every `pollInterval` (200 ms by default), and
 * an idle worker must not export a trace per poll (about 15 spans a second of bookkeeping, over a
 * million a day per worker). Only a publish is traced: its span continues the trace of the
 * transaction that wrote the row.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Outbox } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgOutbox } from "@jetworker/sql-pg"
import { SpanLog, TestDatabase } from "@jetworker/testing"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { NatsLive } from "./support/services.ts"

const Live = Layer.mergeAll(PgOutbox.layer(), Publisher.outboxPublisher()).pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer()),
  Layer.provideMerge(NatsLive)
)

describe("the outbox relay's spans", () => {
  layer(Live, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("INT-NATS-007: rounds that find nothing to publish record no span; a round that publishes records the publish alone, in the trace of the transaction that wrote the row", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const suffix = crypto.randomUUID().slice(0, 8)
        const name = `OUTBOX_SPANS_${suffix.toUpperCase()}`
        const prefix = `outbox-spans-${suffix}`
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Topology.ensureStream({ name, subjects: [`${prefix}.>`] })
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        const log = yield* SpanLog.make
        // Five idle rounds, as an idle worker's relay runs one every 200 ms.
        for (let round = 0; round < 5; round++) {
          const done = yield* PgOutbox.relayRound().pipe(Effect.withTracer(log.tracer))
          assert.strictEqual(done.published, 0)
        }
        const idle = yield* log.all
        assert.deepStrictEqual(idle.map((span) => span.name), [], "idle rounds record no span")
        // A row written in a traced transaction, then a round that publishes it.
        const traceId = yield* sql.withTransaction(Effect.gen(function*() {
          yield* Outbox.record({ subject: `${prefix}.e1`, id: `${prefix}-e1`, payload: new TextEncoder().encode("{}") })
          return (yield* Effect.currentSpan).traceId
        })).pipe(Effect.withSpan("handler"))
        const done = yield* PgOutbox.relayRound().pipe(Effect.withTracer(log.tracer))
        assert.strictEqual(done.published, 1)
        const spans = yield* log.all
        // Named by the stream where the relay is given one, `send` alone here: a subject may carry an entity id.
        assert.deepStrictEqual(spans.map((span) => span.name), ["send"], "the publish alone")
        assert.strictEqual(spans[0]!.attributes.get("messaging.destination.name"), `${prefix}.e1`)
        assert.strictEqual(spans[0]!.traceId, traceId, "the publish continues the writer's trace")
      }).pipe(Effect.scoped))
  })
})

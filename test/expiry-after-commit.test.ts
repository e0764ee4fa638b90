/**
 * Expiry is about the effect (BE-JOB-005): `Expired` means "no effect". A handler whose commit
 * went through and which then finds its event expired (`Expiry.ensure` before an optional later
 * step) has applied its effect: the outcome says so. Against the real NATS server and PostgreSQL.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Expiry, IdempotencyStore } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Clock, DateTime, Effect, Fiber, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String, expiresAt: Schema.Number })

describe("expiry after the commit", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("BE-JOB-005: Expiry.ensure after the store committed the effect ends Committed (acked), not Expired", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS expiry_after_commit (id text PRIMARY KEY)`
        // The handler waits, after its commit, until its event's deadline has passed (bounded).
        const pastDeadline = CurrentDelivery.CurrentDelivery.use((current) =>
          Eventually.holds(
            "the event's deadline to pass",
            Effect.map(Clock.currentTimeMillis, (now) => now > (current.expiresAt ?? Number.POSITIVE_INFINITY)),
            "5 seconds"
          )).pipe(Effect.orDie)
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata: (event) => ({
            id: event.id,
            time: DateTime.makeUnsafe(Date.now()),
            expiresAt: DateTime.makeUnsafe(event.expiresAt)
          }),
          handle: (event) =>
            IdempotencyStore.commit(event.id, sql`INSERT INTO expiry_after_commit (id) VALUES (${event.id})`).pipe(
              Effect.andThen(pastDeadline),
              // Before an optional later step: the event is past its deadline by now.
              Effect.andThen(Expiry.ensure)
            ),
          classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
          onOutcome: log.record
        })))
        const id = `late-${crypto.randomUUID()}`
        yield* stream.publish("a", JSON.stringify({ id, expiresAt: Date.now() + 1_000 }), id)
        const [outcome] = yield* log.waitUntil((all) => all.length >= 1, "15 seconds", "the outcome")
        yield* Fiber.interrupt(fiber)
        const rows = yield* sql<{ readonly id: string }>`SELECT id FROM expiry_after_commit WHERE id = ${id}`
        assert.strictEqual(rows.length, 1, "the effect is committed")
        assert.strictEqual(outcome?._tag, "Committed", JSON.stringify(outcome))
        assert.isTrue(outcome!.confirmed, "acked")
        assert.strictEqual((yield* stream.info).num_ack_pending, 0)
      }))
  })
})

/**
 * Failures an operator can read without the source (BE-JOB-003, dead-letter write): a dead letter
 * caused by a PostgreSQL error keeps the error's chain, down to the server's SQLSTATE, message
 * and detail, bounded in size.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, type ErrorSummary, IdempotencyStore } from "@jetworker/core"
import { DeadLetter, JetStreamSource } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { DateTime, Effect, Fiber, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String, amount: Schema.Number })

describe("readable failures", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect("BE-JOB-003: dead-letter write: a PostgreSQL data error keeps its SQLSTATE, message and detail in the dead letter and the outcome", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS readable_amounts (id text PRIMARY KEY, amount integer NOT NULL)`
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(Date.now()) }),
          // A value too large for its `integer` column: SQLSTATE 22003, a data error.
          handle: (event) =>
            IdempotencyStore.commit(event.id, sql`INSERT INTO readable_amounts (id, amount) VALUES (${event.id}, ${event.amount})`),
          classify: { SqlError: "permanent", IdempotencyError: "isRetryable" },
          onOutcome: log.record
        })))
        yield* stream.publish("a", JSON.stringify({ id: "too-big", amount: 2 ** 40 }), "too-big")
        const outcomes = yield* log.waitUntil((all) => all.length > 0, "15 seconds")
        yield* Fiber.interrupt(fiber)
        const [outcome] = outcomes
        assert.strictEqual(outcome?._tag, "DeadLettered")
        const [letter] = yield* DeadLetter.list(stream.deadLetterStream)
        const error = letter!.error as ErrorSummary.ErrorSummary
        assert.strictEqual(error.tag, "SqlError")
        const deepest = error.causes?.at(-1)
        assert.isDefined(deepest, JSON.stringify(error))
        assert.strictEqual(deepest!.fields.code, "22003", JSON.stringify(error))
        assert.match(deepest!.message, /integer out of range/)
        assert.isBelow(JSON.stringify(error).length, 8_000, "bounded")
        // The outcome carries the same chain.
        assert.deepStrictEqual(outcome?._tag === "DeadLettered" ? outcome.error.causes : undefined, error.causes)
      }))
  })
})

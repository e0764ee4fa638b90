/**
 * An outcome's log line tells an operator why without the source: the line names the innermost
 * cause (PostgreSQL's own message), and its keys (`eventId`, `reason`, `error`, beside
 * `outcome`, `subject`, `sequence`, `deliveryCount`) let a `jq` filter find it. Against the real
 * NATS server and PostgreSQL.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, IdempotencyStore } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { DateTime, Effect, Fiber, Logger, References, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String, amount: Schema.Number })

describe("outcome log lines", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect("BE-JOB-003: a dead-lettered PostgreSQL data error's line names the server's message, with eventId, reason and error keys", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS outcome_line_amounts (id text PRIMARY KEY, amount integer NOT NULL)`
        const lines: Array<{ readonly text: string; readonly annotations: Record<string, unknown> }> = []
        const capture = Logger.make(({ fiber, message }) => {
          const parts = Array.isArray(message) ? message : [message]
          lines.push({ text: String(parts[0]), annotations: { ...fiber.getRef(References.CurrentLogAnnotations) } })
        })
        const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(Date.now()) }),
          // A value too large for its `integer` column: SQLSTATE 22003, a data error.
          handle: (event) =>
            IdempotencyStore.commit(event.id, sql`INSERT INTO outcome_line_amounts (id, amount) VALUES (${event.id}, ${event.amount})`),
          classify: { SqlError: "permanent", IdempotencyError: "isRetryable" },
          onOutcome: log.record
        })).pipe(Effect.provide(Logger.layer([capture]))))
        const id = `too-big-${crypto.randomUUID()}`
        yield* stream.publish("a", JSON.stringify({ id, amount: 2 ** 40 }), id)
        const [outcome] = yield* log.waitUntil((all) => all.length > 0, "15 seconds")
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(outcome?._tag, "DeadLettered")
        const line = lines.find((l) => l.text.startsWith("DeadLettered "))
        assert.isDefined(line, lines.map((l) => l.text).join("\n"))
        assert.include(line!.text, `(${id}): PermanentError: SqlError: `)
        assert.include(line!.text, "integer out of range")
        assert.include(line!.text, "code 22003", "the SQLSTATE an operator looks up")
        const { annotations } = line!
        assert.strictEqual(annotations.outcome, "DeadLettered")
        assert.strictEqual(annotations.eventId, id)
        assert.strictEqual(annotations.reason, "PermanentError")
        assert.match(String(annotations.error), /^SqlError: .*integer out of range/)
        assert.strictEqual(annotations.subject, stream.subject("a"))
        assert.strictEqual(annotations.sequence, 1)
        assert.strictEqual(annotations.deliveryCount, 1)
      }))
  })
})

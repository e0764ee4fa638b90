/**
 * A handler that fails after its `IdempotencyStore.commit` returned, against the real NATS server
 * and PostgreSQL: the failure outcome stays (the step after the commit is retried, or kept in the
 * dead-letter stream), and says that the effect is committed (`effectCommitted`), in the outcome
 * and in the dead letter's error header; the redelivery, or the replay of the dead letter once the
 * cause is fixed, finds the effect committed (`Duplicate`) and runs only the step after it: the
 * effect is applied once, and the step that failed is not lost.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { LedgerTestLive } from "./support/services.ts"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })
const payload = (id: string) => JSON.stringify({ id })

class PublishFailed extends Data.TaggedError("PublishFailed")<{ readonly message: string }> {}
class PublishRefused extends Data.TaggedError("PublishRefused")<{ readonly message: string }> {}

const effects = Effect.fnUntraced(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS after_commit_effects (id text PRIMARY KEY)`
  return (id: string) => sql`INSERT INTO after_commit_effects (id) VALUES (${id})`.pipe(Effect.asVoid)
})

const effectCount = (id: string) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM after_commit_effects WHERE id = ${id}`.pipe(
      Effect.map((rows) => rows[0]?.n ?? 0)
    ))

const committedOf = (outcome: Outcome.Outcome) =>
  outcome._tag === "Released" || outcome._tag === "DeadLettered" ? outcome.effectCommitted === true : false
const reasonOf = (outcome: Outcome.Outcome) => "reason" in outcome ? outcome.reason : ""

/** A consumer that commits its event's row, then runs `after` (the step that may fail). */
const consumerOf = (
  stream: TestStream.TestStream,
  log: OutcomeLog.OutcomeLog,
  insert: Effect.Success<ReturnType<typeof effects>>,
  after: () => Effect.Effect<void, PublishFailed | PublishRefused>
) =>
  Consumer.make({
    name: stream.consumer,
    source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
    schema: Event,
    metadata,
    handle: (event) => IdempotencyStore.commit(event.id, insert(event.id)).pipe(Effect.andThen(after())),
    classify: { PublishFailed: "transient", PublishRefused: "permanent", SqlError: "isRetryable", IdempotencyError: "isRetryable" },
    retry: Retry.exponential({ attempts: 3, base: "50 millis", inProcessRetries: 0 }),
    onOutcome: log.record
  })

describe("a failure after the commit returned", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("transient: Released (Retrying) with effectCommitted; the redelivery is a Duplicate that runs the step once; one effect", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        let afterRuns = 0
        const fiber = yield* Effect.forkChild(Consumer.run(consumerOf(stream, log, insert, () =>
          Effect.suspend(() => ++afterRuns === 1 ? Effect.fail(new PublishFailed({ message: "publish timed out" })) : Effect.void))))
        const id = `after-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), id)
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds", "two outcomes")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(
          outcomes.map((o) => [o._tag, reasonOf(o), committedOf(o), o.message.deliveryCount]),
          [["Released", "Retrying", true, 1], ["Duplicate", "", false, 2]]
        )
        assert.strictEqual(afterRuns, 2, "the step after the commit ran again on the redelivery")
        assert.strictEqual(yield* effectCount(id), 1, "the effect applied once")
      }))

    it.effect("permanent: DeadLettered with effectCommitted, in its error header too; the replay, once fixed, is a Duplicate that runs the step; one effect", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const log = yield* OutcomeLog.make
        const insert = yield* effects()
        let fixed = false
        let stepsDone = 0
        const fiber = yield* Effect.forkChild(Consumer.run(consumerOf(stream, log, insert, () =>
          Effect.suspend(() =>
            fixed
              ? Effect.sync(() => {
                stepsDone++
              })
              : Effect.fail(new PublishRefused({ message: "the topic refused the message" }))
          ))))
        const id = `after-${crypto.randomUUID()}`
        yield* stream.publish("a", payload(id), id)
        const [first] = yield* log.waitUntil((all) => all.length >= 1, "15 seconds", "the dead letter")
        assert.deepStrictEqual([first!._tag, reasonOf(first!), committedOf(first!)], ["DeadLettered", "PermanentError", true])
        assert.strictEqual(yield* effectCount(id), 1, "the effect is applied")
        const [dead] = yield* DeadLetter.list(stream.deadLetterStream)
        assert.isDefined(dead)
        const { manager } = yield* NatsConnection.NatsConnection
        const stored = yield* Effect.promise(() => manager.streams.getMessage(stream.deadLetterStream, { seq: dead!.sequence }))
        const error = JSON.parse(stored!.header.get(DeadLetter.Header.error)) as { readonly fields: Record<string, unknown> }
        assert.strictEqual(error.fields.effectCommitted, true, "the dead letter says the effect is committed")
        assert.deepStrictEqual((yield* DeadLetter.read(stream.deadLetterStream, dead!.sequence)).error, error, "DeadLetter.read gives it too")

        // The cause fixed, the replay finds the effect committed and runs only the step after it.
        fixed = true
        yield* DeadLetter.replay(stream.deadLetterStream, dead!.sequence)
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds", "the replay's outcome")
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(outcomes[1]!._tag, "Duplicate")
        assert.strictEqual(stepsDone, 1, "the step that failed ran once, on the replay")
        assert.strictEqual(yield* effectCount(id), 1, "the effect applied once")
      }))
  })
})

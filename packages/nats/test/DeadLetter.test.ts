import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { ErrorSummary, type Outcome } from "@jetworker/core"
import { headers as makeHeaders } from "@nats-io/transport-node"
import { DateTime, Duration, Effect } from "effect"

const NatsLive = NatsConnection.layer({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  name: "jetworker-test-deadletter"
})

const encoder = new TextEncoder()

const uniqueId = () => crypto.randomUUID().replaceAll("-", "").slice(0, 12)

/**
 * Two throw-away source streams dead-lettering into one shared dead-letter stream. The subject
 * prefix is unique too: the server refuses overlapping subjects across streams, and other test
 * files create dead-letter streams under the default prefix at the same time.
 */
const sharedDeadLetter = Effect.gen(function*() {
  const { manager } = yield* NatsConnection.NatsConnection
  const id = uniqueId()
  const stream = `DLQ_SHARED_${id}`
  const subjectPrefix = `dlq_${id}`
  const options: DeadLetter.Options = { stream, subjectPrefix }
  const a = yield* TestStream.make({ prefix: "SRC_A" })
  const b = yield* TestStream.make({ prefix: "SRC_B" })
  yield* Effect.addFinalizer(() =>
    Effect.promise(() => manager.streams.delete(stream).catch(() => false)).pipe(
      Effect.timeoutOption(Duration.seconds(5))
    )
  )
  return {
    options,
    stream,
    subjectPrefix,
    a: DeadLetter.destination(a.stream, a.consumer, options),
    b: DeadLetter.destination(b.stream, b.consumer, options),
    capture: (source: string) => `${subjectPrefix}.${source}.>`
  }
})

/** The live config of `stream`. */
const liveConfig = (stream: string) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    const info = yield* Effect.promise(() => manager.streams.info(stream))
    return info.config
  })

/** The live subjects of `stream`. */
const liveSubjects = (stream: string) => Effect.map(liveConfig(stream), (config) => config.subjects)

/** Publishes to `destination` (confirmed by its stream) and returns the stored message's subject. */
const publishAndRead = (destination: DeadLetter.Destination, msgId: string) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    const ack = yield* Publisher.publish(destination.subject, encoder.encode(msgId), {
      msgId,
      stream: destination.stream,
      attempts: 1
    })
    const stored = yield* Effect.promise(() => manager.streams.getMessage(destination.stream, { seq: ack.seq }))
    return stored?.subject
  })

describe("DeadLetter", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("BE-JOB-003: a dead-letter stream shared by two sources keeps both sources' subjects", () =>
      Effect.gen(function*() {
        const shared = yield* sharedDeadLetter
        yield* DeadLetter.ensure(shared.a, shared.options)
        yield* DeadLetter.ensure(shared.b, shared.options)
        // A source restarting must not take the other source's subject away again.
        yield* DeadLetter.ensure(shared.a, shared.options)

        const subjects = yield* liveSubjects(shared.stream)
        assert.includeMembers(subjects, [shared.capture(shared.a.sourceStream), shared.capture(shared.b.sourceStream)])
        assert.strictEqual(yield* publishAndRead(shared.a, "a-1"), shared.a.subject)
        assert.strictEqual(yield* publishAndRead(shared.b, "b-1"), shared.b.subject)
      }))

    it.effect("BE-JOB-003: a subject an operator added to a shared dead-letter stream survives an ensure", () =>
      Effect.gen(function*() {
        const shared = yield* sharedDeadLetter
        const { manager } = yield* NatsConnection.NatsConnection
        yield* DeadLetter.ensure(shared.a, shared.options)
        const manual = `${shared.subjectPrefix}_ops.manual.>`
        const before = yield* liveSubjects(shared.stream)
        yield* Effect.promise(() =>
          manager.streams.update(shared.stream, { subjects: [...before, manual], description: "kept by ops" })
        )

        yield* DeadLetter.ensure(shared.a, shared.options)
        yield* DeadLetter.ensure(shared.b, shared.options)

        const subjects = yield* liveSubjects(shared.stream)
        assert.includeMembers(subjects, [
          manual,
          shared.capture(shared.a.sourceStream),
          shared.capture(shared.b.sourceStream)
        ])
        assert.strictEqual(subjects.length, 3)
        // Adding B's subject updated the stream; what the declaration does not cover stays.
        assert.strictEqual((yield* liveConfig(shared.stream)).description, "kept by ops")
      }))

    it.effect("BE-JOB-003: a broader subject already on the shared stream counts as capturing the source's subject", () =>
      Effect.gen(function*() {
        const shared = yield* sharedDeadLetter
        const { manager } = yield* NatsConnection.NatsConnection
        yield* DeadLetter.ensure(shared.a, shared.options)
        // The server refuses overlapping subjects in one stream, so adding the narrower one would fail.
        const broad = `${shared.subjectPrefix}.>`
        yield* Effect.promise(() => manager.streams.update(shared.stream, { subjects: [broad] }))

        yield* DeadLetter.ensure(shared.b, shared.options)

        assert.deepStrictEqual(yield* liveSubjects(shared.stream), [broad])
        assert.strictEqual(yield* publishAndRead(shared.b, "b-1"), shared.b.subject)
      }))

    it.effect("BE-JOB-003: a dead letter written twice is stored once, also when its error or an original header mentions Nats-Msg-Id (NATS 2.9 takes the first occurrence in the header block)", () =>
      Effect.gen(function*() {
        const shared = yield* sharedDeadLetter
        yield* DeadLetter.ensure(shared.a)
        const headers = makeHeaders()
        headers.set("X-Note", "forwarded with its Nats-Msg-Id")
        const record: Outcome.DeadLetterRecord = {
          outcome: "Rejected",
          reason: "SchemaInvalid",
          error: ErrorSummary.make("SchemaInvalid", "the envelope's id differs from its Nats-Msg-Id"),
          message: { consumer: shared.a.consumer, subject: "orders.created", sequence: 7, deliveryCount: 1, eventId: undefined },
          failedAt: DateTime.makeUnsafe(Date.now())
        }
        const original = { headers, subject: "orders.created", seq: 7, data: encoder.encode("{}") }
        const first = yield* DeadLetter.publish(shared.a, original, record)
        const again = yield* DeadLetter.publish(shared.a, original, record)
        assert.isFalse(first.duplicate)
        assert.isTrue(again.duplicate, "the second write was stored again")
        assert.strictEqual((yield* DeadLetter.list(shared.stream)).length, 1)
      }).pipe(Effect.scoped))

    it.effect("BE-JOB-003: a MaxDeliver advisory handled after the dead-letter stream's duplicate window (its worker came back late) finds the dead letter the engine had stored: no second dead letter, no second replay", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        // The dead-letter stream with a 1 s window: its passing stands for the default 2 minutes'.
        const target = DeadLetter.destination(stream.stream, stream.consumer)
        yield* Topology.ensureStream({ name: target.stream, subjects: [`jetworker.dlq.${stream.stream}.>`], duplicateWindow: "1 second" })
        const seq = yield* stream.publish("a", `{"id":"A"}`, "A")
        const options = { stream: stream.stream, consumer: stream.consumer, sequence: seq, deadLetter: { create: false } }
        // The engine's dead letter, as it stores it (the same id and headers as a recovery's).
        const first = yield* DeadLetter.recover(options)
        assert.isFalse(first.duplicate)
        // The window passes (the scenario's own time): the id alone no longer finds the first.
        yield* Effect.sleep("1500 millis")
        const again = yield* DeadLetter.recover(options)
        assert.deepStrictEqual([again.duplicate, again.seq], [true, first.seq], "the dead letter already stored is found")
        assert.lengthOf(yield* DeadLetter.list(target.stream), 1, "one dead letter, so one replay")
        // Another message of the consumer is still dead-lettered.
        const other = yield* stream.publish("a", `{"id":"B"}`, "B")
        assert.isFalse((yield* DeadLetter.recover({ ...options, sequence: other })).duplicate)
      }).pipe(Effect.scoped), 30_000)

    it.effect("BE-JOB-003: controlled replay: a dead letter replayed after its dead-letter stream was re-created (sequences restart at 1) reaches the source stream instead of being taken as a duplicate of an older replay and deleted", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const decoder = new TextDecoder()

        // First dead letter (#1 of the dead-letter stream), replayed: stored in the source stream.
        const a = yield* stream.publish("a", `{"id":"A"}`, "A")
        yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence: a })
        const first = yield* DeadLetter.replay(stream.deadLetterStream, 1)
        assert.isFalse(first.duplicate)

        // The dead-letter stream is removed and created again: its sequences restart at 1.
        yield* Effect.promise(() => manager.streams.delete(stream.deadLetterStream))
        const b = yield* stream.publish("b", `{"id":"B"}`, "B")
        yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence: b })
        const letter = yield* DeadLetter.read(stream.deadLetterStream, 1)
        assert.strictEqual(decoder.decode(letter.payload), `{"id":"B"}`, "the new dead letter is #1")

        const before = yield* stream.stored
        const second = yield* DeadLetter.replay(stream.deadLetterStream, 1)
        const after = yield* stream.stored
        assert.isFalse(second.duplicate, "dead letter B was taken as a duplicate of A's replay and deleted: lost")
        assert.strictEqual(after, before + 1)
        // The id is the dead letter's own headers: the same on every read (a retried replay is
        // stored once), another for a later dead letter of the same message (its failure time).
        assert.strictEqual(DeadLetter.replayId(letter), DeadLetter.replayId({ ...letter, sequence: 7 }))
        assert.notStrictEqual(DeadLetter.replayId(letter), DeadLetter.replayId({ ...letter, failedAt: new Date().toISOString() }))
        assert.isAtMost(DeadLetter.replayId({ ...letter, sourceStream: "S".repeat(255), consumer: "C".repeat(255) }).length, 200)
      }).pipe(Effect.scoped), 60_000)
  })
})

/**
 * `DeadLetter.list` against the real server: what it returns (order, fields, `from`, `limit`,
 * empty and missing streams) and what it costs in JetStream API requests when replays have left
 * large gaps in the dead-letter stream.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection, NatsError } from "@jetworker/nats"
import { connect, headers } from "@nats-io/transport-node"
import { Duration, Effect, type Scope } from "effect"

const servers = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const NatsLive = NatsConnection.layer({ servers, name: "dead-letter-list-test" })

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A throw-away dead-letter stream, created like the framework's, deleted with the scope. */
const makeDeadLetterStream = Effect.gen(function*() {
  const { manager } = yield* NatsConnection.NatsConnection
  const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
  const destination = DeadLetter.destination(`DLL_${id}`, "worker", { subjectPrefix: `dll_${id}` })
  yield* Effect.addFinalizer(() =>
    Effect.promise(() => manager.streams.delete(destination.stream).catch(() => false)).pipe(
      Effect.timeoutOption(Duration.seconds(5))
    )
  )
  yield* DeadLetter.ensure(destination)
  return destination
})

/** Publishes (confirmed) one dead letter for source sequence `n`; returns its sequence. */
const publishDeadLetter = (destination: DeadLetter.Destination, n: number) =>
  Effect.gen(function*() {
    const { jetstream } = yield* NatsConnection.NatsConnection
    const h = headers()
    h.set("X-Trace", `trace-${n}`)
    h.set(`${DeadLetter.Header.originalPrefix}Nats-Msg-Id`, `event-${n}`)
    h.set(DeadLetter.Header.stream, destination.sourceStream)
    h.set(DeadLetter.Header.consumer, destination.consumer)
    h.set(DeadLetter.Header.subject, `orders.${n}`)
    h.set(DeadLetter.Header.sequence, String(n))
    h.set(DeadLetter.Header.deliveries, "3")
    h.set(DeadLetter.Header.outcome, "DeadLettered")
    h.set(DeadLetter.Header.reason, "AttemptsExhausted")
    h.set(DeadLetter.Header.error, JSON.stringify({ tag: "Boom", n }))
    h.set(DeadLetter.Header.eventId, `event-${n}`)
    h.set(DeadLetter.Header.failedAt, new Date(Date.UTC(2024, 0, 1, 0, 0, n % 60)).toISOString())
    const ack = yield* Effect.promise(() =>
      jetstream.publish(destination.subject, encoder.encode(`payload-${n}`), {
        headers: h,
        expect: { streamName: destination.stream }
      })
    )
    return ack.seq
  })

/** Publishes dead letters for source sequences `from..to` concurrently (sequence order unknown). */
const publishMany = (destination: DeadLetter.Destination, from: number, to: number) =>
  Effect.forEach(
    Array.from({ length: to - from + 1 }, (_, i) => from + i),
    (n) => publishDeadLetter(destination, n),
    { concurrency: 32 }
  )

/** Deletes dead letters by sequence, as `replay` does. */
const deleteAll = (stream: string, sequences: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    yield* Effect.forEach(
      sequences,
      (seq) => Effect.promise(() => manager.streams.deleteMessage(stream, seq, false)),
      { concurrency: 32, discard: true }
    )
  })

/**
 * Counts the JetStream API requests that name `stream` while `effect` runs, through a second
 * connection subscribed to `$JS.API.>` (other test files share the server, hence the filter).
 */
const countApiRequests = <A, E, R>(
  stream: string,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<{ readonly result: A; readonly requests: ReadonlyArray<string> }, E, R | NatsConnection.NatsConnection | Scope.Scope> =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const counter = yield* Effect.acquireRelease(
      Effect.promise(() => connect({ servers, name: "dead-letter-list-counter" })),
      (nc) => Effect.promise(() => nc.close())
    )
    const seen: Array<string> = []
    let counting = false
    counter.subscribe("$JS.API.>", {
      callback: (_error, msg) => {
        if (counting && msg.subject.split(".").includes(stream)) {
          seen.push(msg.subject)
        }
      }
    })
    // The subscription is registered once the counter's flush returns; everything the listing
    // sent has reached the counter once the listing's connection and then the counter flush.
    yield* Effect.promise(() => counter.flush())
    counting = true
    const result = yield* effect
    yield* Effect.promise(() => connection.flush())
    yield* Effect.promise(() => counter.flush())
    counting = false
    return { result, requests: seen }
  })

describe("DeadLetter.list", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect(
      "BE-JOB-003: listing dead letters costs a bounded number of requests, however many were replayed",
      () =>
        Effect.gen(function*() {
          const destination = yield* makeDeadLetterStream
          // 3 kept dead letters with 2000 replayed (deleted) ones between them.
          const first = yield* publishDeadLetter(destination, 1)
          const gap1 = yield* publishMany(destination, 2, 1001)
          const second = yield* publishDeadLetter(destination, 1002)
          const gap2 = yield* publishMany(destination, 1003, 2002)
          const third = yield* publishDeadLetter(destination, 2003)
          assert.deepStrictEqual([first, second, third], [1, 1002, 2003])
          yield* deleteAll(destination.stream, [...gap1, ...gap2])

          const { requests, result } = yield* countApiRequests(destination.stream, DeadLetter.list(destination.stream))

          assert.deepStrictEqual(result.map((m) => m.sequence), [1, 1002, 2003], "the kept ones, oldest first")
          assert.deepStrictEqual(result.map((m) => m.sourceSequence), [1, 1002, 2003])
          const [m] = result
          assert.strictEqual(m!.sourceStream, destination.sourceStream)
          assert.strictEqual(m!.consumer, "worker")
          assert.strictEqual(m!.subject, "orders.1")
          assert.strictEqual(m!.deliveries, 3)
          assert.strictEqual(m!.outcome, "DeadLettered")
          assert.strictEqual(m!.reason, "AttemptsExhausted")
          assert.deepStrictEqual(m!.error, { tag: "Boom", n: 1 })
          assert.strictEqual(m!.eventId, "event-1")
          assert.strictEqual(m!.failedAt, "2024-01-01T00:00:01.000Z")
          assert.strictEqual(decoder.decode(m!.payload), "payload-1")
          assert.deepStrictEqual(
            [...m!.originalHeaders].sort(),
            [["Nats-Msg-Id", "event-1"], ["X-Trace", "trace-1"]]
          )
          assert.isAtMost(requests.length, 10, `API requests for one listing: ${requests.length}\n${requests.join("\n")}`)

          // From inside the gap, at the same cost; and no listing consumer is left behind.
          const fromGap = yield* countApiRequests(destination.stream, DeadLetter.list(destination.stream, { from: 2 }))
          assert.deepStrictEqual(fromGap.result.map((m) => m.sequence), [1002, 2003])
          assert.isAtMost(fromGap.requests.length, 10, fromGap.requests.join("\n"))
          const { manager } = yield* NatsConnection.NatsConnection
          const left = yield* Effect.promise(() => manager.consumers.list(destination.stream).next())
          assert.deepStrictEqual(left.map((c) => c.name), [])
        })
    )

    it.effect("lists from a sequence in the middle, up to the limit, oldest first", () =>
      Effect.gen(function*() {
        const destination = yield* makeDeadLetterStream
        for (let n = 1; n <= 10; n++) yield* publishDeadLetter(destination, n)
        yield* deleteAll(destination.stream, [5, 6])

        const fromMiddle = yield* DeadLetter.list(destination.stream, { from: 4 })
        assert.deepStrictEqual(fromMiddle.map((m) => m.sequence), [4, 7, 8, 9, 10])
        assert.deepStrictEqual(fromMiddle.map((m) => decoder.decode(m.payload)), [
          "payload-4",
          "payload-7",
          "payload-8",
          "payload-9",
          "payload-10"
        ])

        const limited = yield* DeadLetter.list(destination.stream, { from: 3, limit: 3 })
        assert.deepStrictEqual(limited.map((m) => m.sequence), [3, 4, 7])

        // A deleted `from` starts at the next one kept; one past the end lists nothing.
        assert.deepStrictEqual((yield* DeadLetter.list(destination.stream, { from: 5, limit: 1 })).map((m) => m.sequence), [7])
        assert.deepStrictEqual(yield* DeadLetter.list(destination.stream, { from: 11 }), [])
        assert.deepStrictEqual(yield* DeadLetter.list(destination.stream, { limit: 0 }), [])
        assert.deepStrictEqual((yield* DeadLetter.list(destination.stream)).map((m) => m.sequence), [1, 2, 3, 4, 7, 8, 9, 10])
      }))

    it.effect("caps a listing at 1000 dead letters", () =>
      Effect.gen(function*() {
        const destination = yield* makeDeadLetterStream
        yield* publishMany(destination, 1, 1005)
        const listed = yield* DeadLetter.list(destination.stream, { limit: 5000 })
        assert.strictEqual(listed.length, 1000)
        assert.deepStrictEqual(listed.map((m) => m.sequence), Array.from({ length: 1000 }, (_, i) => i + 1))
        const rest = yield* DeadLetter.list(destination.stream, { from: 1001, limit: 1000 })
        assert.deepStrictEqual(rest.map((m) => m.sequence), [1001, 1002, 1003, 1004, 1005])
      }))

    it.effect("lists nothing from an empty dead-letter stream, or one whose dead letters were all replayed", () =>
      Effect.gen(function*() {
        const destination = yield* makeDeadLetterStream
        assert.deepStrictEqual(yield* DeadLetter.list(destination.stream), [])
        const seqs = yield* publishMany(destination, 1, 3)
        yield* deleteAll(destination.stream, seqs)
        assert.deepStrictEqual(yield* DeadLetter.list(destination.stream, { from: 1 }), [])
      }))

    it.effect("fails with StreamNotFound for a missing dead-letter stream", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(DeadLetter.list(`DLL_missing_${crypto.randomUUID().slice(0, 8)}`))
        assert.instanceOf(error, NatsError.NatsError)
        assert.strictEqual(error.reason, "StreamNotFound")
      }))
  })
})

/**
 * A bulk replay (`jetworker dlq replay --all`) of dead letters whose source stream was deleted.
 * Each replay read the dead letter, published it (nobody answered) and looked the subject's stream
 * up: three requests per dead letter, each failing the same way, before the next one, paced by
 * `--rate`. Once the source stream is known to be gone, the rest of its dead letters are not tried:
 * they fail with the same reason at once, and are kept.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Effect } from "effect"
import * as DeadLetters from "../src/DeadLetters.ts"

const NatsLive = NatsConnection.layer({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  name: "jetworker-test-dlq-replay-gone-source"
})

describe("a bulk replay whose source stream is gone", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("tries the first dead letter, then fails the rest of that source at once, each kept", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ prefix: "REPLAYGONE" })
        for (const id of ["A", "B", "C", "D"]) {
          const sequence = yield* stream.publish("a", `{"id":"${id}"}`, id)
          yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence })
        }
        const { connection, manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.delete(stream.stream))
        const selected = yield* DeadLetter.list(stream.deadLetterStream)
        assert.strictEqual(selected.length, 4)

        // Every JetStream API request, as the server sees them (not the event subject: a
        // subscriber there would answer for the missing stream).
        const requests: Array<string> = []
        const sniffer = connection.subscribe("$JS.API.>", {
          callback: (_error, message) => {
            requests.push(message.subject)
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => sniffer.unsubscribe()))
        yield* Effect.promise(() => connection.flush())

        const result = yield* DeadLetters.run("replay", stream.deadLetterStream, selected, {
          rate: 50,
          onProgress: () => Effect.void
        })
        yield* Effect.promise(() => connection.flush())
        assert.strictEqual(result.done, 0)
        assert.deepStrictEqual(result.failed.map((f) => f.sequence), selected.map((m) => m.sequence))
        const first = `no stream captures subject ${stream.subject("a")} (source stream ${stream.stream} does not exist)`
        assert.strictEqual(result.failed[0]!.message, first)
        for (const f of result.failed.slice(1)) {
          assert.strictEqual(f.message, `not tried: source stream ${stream.stream} does not exist (as for #${selected[0]!.sequence})`)
        }
        // Only the first dead letter was read and its subject's stream looked up.
        const reads = requests.filter((subject) => subject.startsWith(`$JS.API.STREAM.MSG.GET.${stream.deadLetterStream}`))
        assert.strictEqual(reads.length, 1, requests.join("\n"))
        assert.strictEqual((yield* DeadLetter.list(stream.deadLetterStream)).length, 4, "every dead letter is kept")
      }).pipe(Effect.scoped), 30_000)
  })
})

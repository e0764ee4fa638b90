/**
 * The README's main job, `./scripts/jw demo`, as a user runs it, on a dead-letter stream that
 * earlier runs and real traffic have already filled.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection } from "@jetworker/nats"
import { ChildWorker, TestDatabase, TestStream } from "@jetworker/testing"
import { headers } from "@nats-io/transport-node"
import { Effect } from "effect"
import { fileURLToPath } from "node:url"
import { settingsFor, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"

const demo = fileURLToPath(new URL("../examples/ledger/src/demo.ts", import.meta.url))

describe("demo", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("counts only its own dead letters, even when the dead-letter stream holds over a thousand older ones for the same sequences", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make({ ackWait: "5 seconds" })
        const schema = yield* TestDatabase.TestSchema
        const settings = settingsFor(stream)
        // Dead letters left by earlier traffic: the stream's sequences 1..1001 (as after the
        // stream was recreated), more than one listing page.
        const destination = DeadLetter.destination(stream.stream, stream.consumer)
        yield* DeadLetter.ensure(destination)
        const { jetstream } = yield* NatsConnection.NatsConnection
        yield* Effect.forEach(Array.from({ length: 1_001 }, (_, i) => i + 1), (seq) =>
          Effect.promise(() => {
            const h = headers()
            h.set(DeadLetter.Header.stream, stream.stream)
            h.set(DeadLetter.Header.consumer, stream.consumer)
            h.set(DeadLetter.Header.subject, stream.subject("eur"))
            h.set(DeadLetter.Header.sequence, String(seq))
            h.set(DeadLetter.Header.deliveries, "1")
            h.set(DeadLetter.Header.outcome, "DeadLettered")
            h.set(DeadLetter.Header.reason, "PermanentError")
            h.set(DeadLetter.Header.error, "{}")
            h.set(DeadLetter.Header.failedAt, new Date().toISOString())
            return jetstream.publish(destination.subject, new TextEncoder().encode("{}"), { headers: h })
          }), { concurrency: 32, discard: true })
        const child = yield* ChildWorker.spawn({ script: demo, env: workerEnv(settings, schema.name, databaseUrl, natsUrl) })
        const exit = yield* child.waitForExit("90 seconds")
        const out = (yield* child.lines).join("\n")
        assert.strictEqual(exit.code, 0, `${out}\n${(yield* child.stderr).join("\n")}`)
        assert.include(out, `dead-letter stream ${stream.deadLetterStream} holds 4 of them`)
        assert.include(out, "all checks passed")
      }))
  })
})

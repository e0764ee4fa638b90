/**
 * `jetworker dlq list` takes only a dead-letter stream, as `show`, `replay` and `purge` do.
 *
 * Before: `dlq list --stream PAYMENTS` given the source stream (an easy mistake) printed
 * "no dead letters in PAYMENTS" and exited 0, while the other commands refused it (exit 2,
 * "PAYMENTS is not a dead-letter stream ... in PAYMENTS_DLQ").
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection, Topology } from "@jetworker/nats"
import { ChildWorker } from "@jetworker/testing"
import { Effect } from "effect"
import { fileURLToPath } from "node:url"

const natsUrl = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const bin = fileURLToPath(new URL("../src/bin/jetworker.ts", import.meta.url))

const jetworker = (...args: Array<string>) =>
  Effect.gen(function*() {
    const child = yield* ChildWorker.spawn({ script: bin, args, env: {} })
    const exit = yield* child.waitForExit("30 seconds")
    return { code: exit.code, stdout: (yield* child.lines).join("\n"), stderr: (yield* child.stderr).join("\n") }
  })

describe("jetworker dlq list", () => {
  layer(NatsConnection.layer({ servers: natsUrl, name: "jetworker-cli-test" }), { timeout: "60 seconds" })((it) => {
    it.effect("refuses a source stream as replay, purge and show do (exit 2, naming its dead-letter stream); lists its dead-letter stream", () =>
      Effect.gen(function*() {
        const stream = `CLI_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
        const { jetstream, manager } = yield* NatsConnection.NatsConnection
        const deadLetterStream = DeadLetter.destination(stream, "worker").stream
        yield* Effect.addFinalizer(() =>
          Effect.forEach([stream, deadLetterStream], (name) => Effect.promise(() => manager.streams.delete(name).catch(() => false)), { discard: true })
        )
        yield* Topology.ensureStream({ name: stream, subjects: [`${stream.toLowerCase()}.>`] })
        yield* Topology.ensureConsumer({ stream, name: "worker", ackWait: "30 seconds", maxDeliver: -1, maxAckPending: 100 })
        const ack = yield* Effect.promise(() => jetstream.publish(`${stream.toLowerCase()}.e`, new TextEncoder().encode(`{"id":"e1"}`)))
        yield* DeadLetter.recover({ stream, consumer: "worker", sequence: ack.seq })

        const refused = yield* jetworker("dlq", "list", "--stream", stream, "--server", natsUrl)
        const purge = yield* jetworker("dlq", "purge", "--stream", stream, "--all", "--yes", "--server", natsUrl)
        assert.strictEqual(refused.code, purge.code, "the same exit code as purge")
        assert.strictEqual(refused.code, 2, `${refused.stdout}${refused.stderr}`)
        assert.strictEqual(refused.stdout, "")
        assert.strictEqual(
          refused.stderr,
          `jetworker dlq list: ${stream} is not a dead-letter stream (its first message has no ${DeadLetter.Header.stream} header), ` +
            `nothing listed; the dead letters of ${stream}'s consumers are in ${deadLetterStream}`
        )
        assert.strictEqual(
          purge.stderr.replace("dlq purge", "dlq list").replace("nothing purged", "nothing listed"),
          refused.stderr,
          "the same wording as purge"
        )

        const listed = yield* jetworker("dlq", "list", "--stream", deadLetterStream, "--json", "--server", natsUrl)
        assert.strictEqual(listed.code, 0, listed.stderr)
        assert.deepStrictEqual((JSON.parse(listed.stdout) as ReadonlyArray<{ readonly sourceSequence: number }>).map((r) => r.sourceSequence), [ack.seq])
      }), 60_000)
  })
})

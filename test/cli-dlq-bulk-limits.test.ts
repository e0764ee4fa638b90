/**
 * `jetworker dlq replay` and `purge` at their edges, as an operator runs them on the real NATS: a
 * child process, its exit code and output.
 *
 * What failed before:
 * - `purge --all --max 2` over 5 dead letters printed "purged 2 of 2 dead letter(s)", exit 0, and
 *   its dry run "would purge 2": nothing said that 3 more matched and were left (the selection was
 *   read up to --max only). Now the selection reads one more, and both say "more dead letters
 *   match than --max 2; the next from sequence 3" on stderr, and `next` in `--json`.
 * - `--json` gave `selected` as the rows in a dry run and as a number in a run; both now also
 *   give `count`, the number.
 * - A replay of a dead letter whose source stream was deleted said "jetstream is not enabled"
 *   (nats.js's words for a publish nobody answered) of a server that runs JetStream.
 * - `dlq list --from -1` was taken (and listed from the oldest), while `--sequence` below 1 is
 *   refused.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection, Topology } from "@jetworker/nats"
import { ChildWorker } from "@jetworker/testing"
import { Effect } from "effect"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const bin = fileURLToPath(new URL("../packages/cli/src/bin/jetworker.ts", import.meta.url))

const jetworker = (...args: Array<string>) =>
  Effect.gen(function*() {
    const child = yield* ChildWorker.spawn({ script: bin, args: [...args, "--server", natsUrl] })
    const exit = yield* child.waitForExit("30 seconds")
    return { code: exit.code, stdout: (yield* child.lines).join("\n"), stderr: (yield* child.stderr).join("\n") }
  }).pipe(Effect.scoped)

/** `count` dead letters (#1 to #count) of a fresh source stream (consumer `worker`), recovered into its dead-letter stream. */
const deadLetters = (count: number) =>
  Effect.gen(function*() {
    const stream = `CLIMAX_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
    const { jetstream, manager } = yield* NatsConnection.NatsConnection
    const target = DeadLetter.destination(stream, "worker")
    yield* Effect.addFinalizer(() =>
      Effect.forEach([stream, target.stream], (name) => Effect.promise(() => manager.streams.delete(name).catch(() => false)), { discard: true })
    )
    yield* Topology.ensureStream({ name: stream, subjects: [`${stream.toLowerCase()}.>`] })
    yield* Topology.ensureConsumer({ stream, name: "worker", ackWait: "30 seconds", maxDeliver: -1, maxAckPending: 100 })
    for (let i = 1; i <= count; i++) {
      const ack = yield* Effect.promise(() => jetstream.publish(`${stream.toLowerCase()}.e`, new TextEncoder().encode(`{"id":"e${i}"}`)))
      yield* DeadLetter.recover({ stream, consumer: "worker", sequence: ack.seq })
    }
    const left = Effect.map(DeadLetter.list(target.stream), (letters) => letters.map((m) => m.sequence))
    return { stream, subject: `${stream.toLowerCase()}.e`, deadLetterStream: target.stream, left }
  })

interface BulkJson {
  readonly count: number
  readonly selected: number | ReadonlyArray<{ readonly sequence: number }>
  readonly next: number | null
  readonly done?: number
}

describe("jetworker dlq replay and purge: --max, a deleted source stream, --from", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("purge and replay with --max below what matches say that more match and the next sequence, on stderr and as next in --json, in the dry run and the run (exit 0); exactly --max matching says nothing", () =>
      Effect.gen(function*() {
        const { deadLetterStream, left } = yield* deadLetters(5)
        const dlq = ["--stream", deadLetterStream, "--all"]

        const dry = yield* jetworker("dlq", "purge", ...dlq, "--max", "2", "--dry-run")
        assert.strictEqual(dry.code, 0, dry.stderr)
        assert.include(dry.stdout, `would purge 2 dead letter(s) of ${deadLetterStream}`)
        assert.include(dry.stderr, "jetworker dlq purge: more dead letters match than --max 2; the next from sequence 3")
        const dryJson = yield* jetworker("dlq", "purge", ...dlq, "--max", "2", "--dry-run", "--json")
        const planned = JSON.parse(dryJson.stdout) as BulkJson
        assert.deepStrictEqual([planned.count, planned.next], [2, 3])
        assert.deepStrictEqual((planned.selected as ReadonlyArray<{ readonly sequence: number }>).map((r) => r.sequence), [1, 2])
        assert.deepStrictEqual(yield* left, [1, 2, 3, 4, 5], "a dry run changes nothing")

        const unconfirmed = yield* jetworker("dlq", "purge", ...dlq, "--max", "2")
        assert.strictEqual(unconfirmed.code, 1)
        assert.include(unconfirmed.stderr, "2 dead letter(s) selected (--max 2: more match)")

        const purged = yield* jetworker("dlq", "purge", ...dlq, "--max", "2", "--yes", "--rate", "1000", "--json")
        assert.strictEqual(purged.code, 0, purged.stderr)
        const result = JSON.parse(purged.stdout) as BulkJson
        assert.deepStrictEqual([result.count, result.selected, result.done, result.next], [2, 2, 2, 3])
        assert.include(purged.stderr, "more dead letters match than --max 2; the next from sequence 3, not purged: run the command again for the rest")
        assert.deepStrictEqual(yield* left, [3, 4, 5])

        const replayed = yield* jetworker("dlq", "replay", ...dlq, "--max", "1", "--yes")
        assert.strictEqual(replayed.code, 0, replayed.stderr)
        assert.include(replayed.stdout, `replayed 1 of 1 dead letter(s) of ${deadLetterStream}`)
        assert.include(replayed.stderr, "more dead letters match than --max 1; the next from sequence 4, not replayed")
        assert.deepStrictEqual(yield* left, [4, 5])

        // Exactly --max match: the selection is complete, and nothing says otherwise.
        const exact = yield* jetworker("dlq", "purge", ...dlq, "--max", "2", "--yes", "--json")
        assert.strictEqual(exact.code, 0, exact.stderr)
        const complete = JSON.parse(exact.stdout) as BulkJson
        assert.deepStrictEqual([complete.count, complete.done, complete.next], [2, 2, null])
        assert.notInclude(exact.stderr, "more dead letters match")
        assert.deepStrictEqual(yield* left, [])

        const none = yield* jetworker("dlq", "purge", ...dlq, "--dry-run", "--json")
        assert.deepStrictEqual(JSON.parse(none.stdout), { action: "purge", dryRun: true, count: 0, selected: [], next: null })
      }), 120_000)

    it.effect("a replay of a dead letter whose source stream was deleted names the subject and the missing stream (exit 1), not 'jetstream is not enabled'; the dead letter is kept", () =>
      Effect.gen(function*() {
        const { deadLetterStream, left, stream, subject } = yield* deadLetters(1)
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.delete(stream))

        const run = yield* jetworker("dlq", "replay", "--stream", deadLetterStream, "--sequence", "1")
        assert.strictEqual(run.code, 1, run.stdout + run.stderr)
        assert.include(run.stderr, `jetworker dlq replay: no stream captures subject ${subject} (source stream ${stream} does not exist)`)
        assert.notInclude(`${run.stdout}\n${run.stderr}`.toLowerCase(), "jetstream is not enabled")
        assert.deepStrictEqual(yield* left, [1])
      }), 60_000)

    it.effect("dlq list --from below 1 is refused (exit 2) as --sequence below 1 is", () =>
      Effect.gen(function*() {
        for (const from of ["-1", "0"]) {
          const run = yield* jetworker("dlq", "list", "--stream", "ANY_DLQ", "--from", from)
          assert.strictEqual(run.code, 2, `--from ${from}: ${run.stdout}${run.stderr}`)
          assert.include(run.stderr, `jetworker dlq list: --from takes a stream sequence, 1 or more (as dlq list shows them), got ${from}`)
        }
      }), 60_000)
  })
})

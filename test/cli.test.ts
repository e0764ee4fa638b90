/**
 * The `jetworker` command as an operator runs it: a child process on the real files, its exit
 * code and output.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { DeadLetters } from "@jetworker/cli"
import { DeadLetter, NatsConnection, Topology } from "@jetworker/nats"
import { ChildWorker, NatsServer, TestStream } from "@jetworker/testing"
import { Duration, Effect, Redacted } from "effect"
import { readFileSync, writeFileSync } from "node:fs"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const bin = fileURLToPath(new URL("../packages/cli/src/bin/jetworker.ts", import.meta.url))
const reference = fileURLToPath(new URL("../examples/ledger/deploy/deployment.yaml", import.meta.url))
const ledgerContract = fileURLToPath(new URL("../examples/ledger/contract.json", import.meta.url))

/** Runs the command with `env` laid over the test's environment. */
const jetworkerEnv = (env: Record<string, string>, ...args: Array<string>) =>
  Effect.gen(function*() {
    const child = yield* ChildWorker.spawn({ script: bin, args, env })
    const exit = yield* child.waitForExit("30 seconds")
    return { code: exit.code, stdout: (yield* child.lines).join("\n"), stderr: (yield* child.stderr).join("\n") }
  })

const jetworker = (...args: Array<string>) => jetworkerEnv({}, ...args)

/** Polls `effect` every 100 ms until `predicate` holds, at most `timeout`. */
const until = <A, E, R>(effect: Effect.Effect<A, E, R>, predicate: (a: A) => boolean, timeout: Duration.Input) =>
  Effect.gen(function*() {
    const deadline = Date.now() + Duration.toMillis(Duration.fromInputUnsafe(timeout))
    for (;;) {
      const value = yield* effect
      if (predicate(value)) return value
      if (Date.now() > deadline) return yield* Effect.die(new Error(`not within ${Duration.format(Duration.fromInputUnsafe(timeout))}: ${String(value)}`))
      yield* Effect.sleep("100 millis")
    }
  })

/** `count` dead letters of a fresh source stream (consumer `worker`), recovered into its dead-letter stream. */
const deadLetters = (count: number) =>
  Effect.gen(function*() {
    const stream = `CLI_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
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
    const stored = Effect.promise(() => manager.streams.info(target.stream).then((info) => info.state.messages))
    return { stream, deadLetterStream: target.stream, stored }
  })

describe("jetworker CLI", () => {
  it.live("BE-SHUT-002, BE-SHUT-004: configuration check: the reference manifest's timings agree with the worker's settings (exit 0)", () =>
    Effect.gen(function*() {
      const run = yield* jetworker("config", "check", "--manifest", reference, "--ack-wait-env", "LEDGER_ACK_WAIT")
      assert.strictEqual(run.code, 0, run.stdout + run.stderr)
      assert.include(run.stdout, "the settings agree with the manifest")
      for (const check of ["budget-under-grace", "readiness-probe", "liveness-probe", "drain-under-ack-wait"]) {
        assert.match(run.stdout, new RegExp(`ok +${check}`))
      }
    }))

  it.live("config check exits 1 with a readable report when the timings disagree, and prints JSON with --json", () =>
    Effect.gen(function*() {
      const broken = join(tmpdir(), `jw-manifest-${process.pid}-${Date.now()}.yaml`)
      writeFileSync(broken, readFileSync(reference, "utf8").replace("terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20"))
      const run = yield* jetworker("config", "check", "--manifest", broken, "--ack-wait-env", "LEDGER_ACK_WAIT")
      assert.strictEqual(run.code, 1)
      assert.match(run.stdout, /ERROR budget-under-grace +preStop 0 s \+ SHUTDOWN_BUDGET 25 s = 25 s >= terminationGracePeriodSeconds 20 s/)
      assert.include(run.stdout, "the settings DISAGREE with the manifest")
      const json = yield* jetworker("config", "check", "--manifest", broken, "--json")
      assert.strictEqual(json.code, 1)
      const report = JSON.parse(json.stdout) as { readonly ok: boolean; readonly findings: ReadonlyArray<{ readonly check: string; readonly level: string }> }
      assert.isFalse(report.ok)
      assert.deepInclude(report.findings.find((f) => f.check === "budget-under-grace")!, { level: "error" })
    }))

  it.live("config check exits 2 when it cannot check: no such container, or an unreadable manifest", () =>
    Effect.gen(function*() {
      const noContainer = yield* jetworker("config", "check", "--manifest", reference, "--container", "sidecar")
      assert.strictEqual(noContainer.code, 2)
      assert.include(noContainer.stderr, "no container \"sidecar\"")
      const missing = yield* jetworker("config", "check", "--manifest", "/nonexistent/manifest.yaml")
      assert.strictEqual(missing.code, 2)
    }))

  it.live("every command answers --help", () =>
    Effect.gen(function*() {
      for (
        const args of [
          ["--help"],
          ["config", "--help"],
          ["config", "check", "--help"],
          ["dlq", "--help"],
          ["dlq", "list", "--help"],
          ["dlq", "replay", "--help"],
          ["dlq", "recover", "--help"],
          ["dlq", "show", "--help"],
          ["dlq", "purge", "--help"],
          ["migrate", "--help"],
          ["contract", "--help"],
          ["contract", "check", "--help"],
          ["contract", "diff", "--help"],
          ["contract", "apply", "--help"]
        ]
      ) {
        const run = yield* jetworker(...args)
        assert.strictEqual(run.code, 0, args.join(" "))
        assert.include(run.stdout, "USAGE")
      }
    }), 120_000)

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-002: jetworker contract apply, diff and check on the ledger's contract: check exits 0 when the server fits and 1 with a readable report when MaxDeliver is not above the attempts; diff and --dry-run write nothing; apply without a terminal needs --yes", () =>
      Effect.gen(function*() {
        const { manager } = yield* NatsConnection.NatsConnection
        // The reviewed ledger contract, on a stream of this run.
        const stream = `CLI_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
        const file = join(tmpdir(), `jw-contract-${process.pid}-${stream}.json`)
        writeFileSync(
          file,
          readFileSync(ledgerContract, "utf8").replace("\"LEDGER\"", `"${stream}"`).replace("ledger.transfer.>", `${stream.toLowerCase()}.transfer.>`)
        )
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(stream).catch(() => false)))
        const server = ["--server", natsUrl]

        const absent = yield* jetworker("contract", "check", "--contract", file, ...server)
        assert.strictEqual(absent.code, 1, absent.stderr)
        assert.include(absent.stdout, `stream ${stream} does not exist: apply the contract`)
        const dryRun = yield* jetworker("contract", "apply", "--contract", file, "--dry-run", ...server)
        assert.strictEqual(dryRun.code, 0, dryRun.stderr)
        assert.include(dryRun.stdout, `+ create stream ${stream}\n+ create consumer ${stream}/ledger-applier`)
        const unconfirmed = yield* jetworker("contract", "apply", "--contract", file, ...server)
        assert.strictEqual(unconfirmed.code, 1)
        assert.include(unconfirmed.stderr, "pass --yes")
        assert.strictEqual(yield* Effect.promise(() => manager.streams.info(stream).then(() => true, () => false)), false, "nothing written")

        const applied = yield* jetworker("contract", "apply", "--contract", file, "--yes", ...server)
        assert.strictEqual(applied.code, 0, applied.stderr)
        assert.include(applied.stdout, "applied 2 change(s)")
        const fits = yield* jetworker("contract", "check", "--contract", file, ...server)
        assert.strictEqual(fits.code, 0, fits.stdout + fits.stderr)
        assert.include(fits.stdout, `the server fits the contract of stream ${stream}, version 1 (service-owned)`)
        const same = yield* jetworker("contract", "diff", "--contract", file, ...server)
        assert.strictEqual(same.code, 0)
        assert.include(same.stdout, "nothing to change")

        // An operator lowers MaxDeliver to the attempts: the last attempt could not dead-letter.
        yield* Topology.ensureConsumer({ stream, name: "ledger-applier", ackWait: "30 seconds", maxDeliver: 5, maxAckPending: 1000 })
        const broken = yield* jetworker("contract", "check", "--contract", file, ...server)
        assert.strictEqual(broken.code, 1)
        assert.include(broken.stdout, `ERROR   consumer ${stream}/ledger-applier [max_deliver]`)
        assert.include(broken.stdout, "has max_deliver 5; it must exceed the retry policy's 5 attempts")
        assert.include(broken.stdout, `the server does NOT fit the contract of stream ${stream}`)
        const json = yield* jetworker("contract", "check", "--contract", file, "--json", ...server)
        assert.strictEqual(json.code, 1)
        const report = JSON.parse(json.stdout) as { readonly ok: boolean; readonly findings: ReadonlyArray<{ readonly check: string }> }
        assert.isFalse(report.ok)
        assert.includeMembers(report.findings.map((f) => f.check), ["max_deliver"])
        const diff = yield* jetworker("contract", "diff", "--contract", file, ...server)
        assert.strictEqual(diff.code, 1)
        assert.include(diff.stdout, `~ consumer ${stream}/ledger-applier max_deliver: 5 -> 11`)
        const preview = yield* jetworker("contract", "apply", "--contract", file, "--dry-run", ...server)
        assert.strictEqual(preview.code, 0)
        assert.strictEqual((yield* Effect.promise(() => manager.consumers.info(stream, "ledger-applier"))).config.max_deliver, 5, "a dry run writes nothing")
        const fixed = yield* jetworker("contract", "apply", "--contract", file, "--yes", ...server)
        assert.strictEqual(fixed.code, 0, fixed.stderr)
        assert.strictEqual((yield* jetworker("contract", "check", "--contract", file, ...server)).code, 0)

        // It cannot run: an unreadable contract, an unreachable server (2).
        const unreadable = join(tmpdir(), `jw-contract-${process.pid}-bad.json`)
        writeFileSync(unreadable, JSON.stringify({ version: "1", ownership: "shared" }))
        const bad = yield* jetworker("contract", "check", "--contract", unreadable, ...server)
        assert.strictEqual(bad.code, 2)
        assert.include(bad.stderr, "the contract is unreadable: ownership:")
        const unreachable = yield* jetworker("contract", "check", "--contract", file, "--server", "nats://127.0.0.1:1")
        assert.strictEqual(unreachable.code, 2)
      }).pipe(Effect.scoped), 120_000)

    it.effect("dlq list filters by subject, reason and time; show prints one in full; replay and purge take a selection, list it with --dry-run, refuse without a terminal or --yes, and pace the run; a retried replay's Nats-Msg-Id is stored once", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager, jetstream } = yield* NatsConnection.NatsConnection
        const server = ["--server", natsUrl]
        const dlqStream = ["--stream", stream.deadLetterStream]
        const seqs = [
          yield* stream.publish("a", `{"id":"x1"}`, "x1"),
          yield* stream.publish("a", `{"id":"x2"}`, "x2"),
          yield* stream.publish("b", `{"id":"x3"}`, "x3")
        ]
        for (const sequence of seqs) yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence })
        const count = (name: string) => Effect.promise(() => manager.streams.info(name).then((info) => info.state.messages))

        const onlyB = yield* jetworker("dlq", "list", ...dlqStream, "--subject", stream.subject("b"), ...server)
        assert.strictEqual(onlyB.code, 0, onlyB.stderr)
        assert.include(onlyB.stdout, "#3 DeadLettered DeliveriesExhausted")
        assert.notInclude(onlyB.stdout, "#1 ")
        const wildcard = yield* jetworker("dlq", "list", ...dlqStream, "--subject", `${stream.subjectPrefix}.*`, "--reason", "DeliveriesExhausted", "--json", ...server)
        assert.deepStrictEqual((JSON.parse(wildcard.stdout) as ReadonlyArray<{ readonly sequence: number }>).map((r) => r.sequence), [1, 2, 3])
        const otherReason = yield* jetworker("dlq", "list", ...dlqStream, "--reason", "PermanentError", ...server)
        assert.include(otherReason.stdout, "no dead letters in")
        const future = yield* jetworker("dlq", "list", ...dlqStream, "--since", "2999-01-01T00:00:00Z", ...server)
        assert.include(future.stdout, "no dead letters in")
        const badTime = yield* jetworker("dlq", "list", ...dlqStream, "--since", "yesterday-ish", ...server)
        assert.strictEqual(badTime.code, 2)

        const shown = yield* jetworker("dlq", "show", ...dlqStream, "--sequence", "1", ...server)
        assert.strictEqual(shown.code, 0, shown.stderr)
        assert.include(shown.stdout, `subject:    ${stream.subject("a")}`)
        assert.include(shown.stdout, `payload (11 bytes):\n{"id":"x1"}`)

        const nothingNamed = yield* jetworker("dlq", "replay", ...dlqStream, ...server)
        assert.strictEqual(nothingNamed.code, 2)
        assert.include(nothingNamed.stderr, "name the dead letters")
        const unconfirmed = yield* jetworker("dlq", "purge", ...dlqStream, "--subject", stream.subject("a"), ...server)
        assert.strictEqual(unconfirmed.code, 1)
        assert.include(unconfirmed.stderr, "2 dead letter(s) selected; without a terminal to confirm, pass --yes")
        const dryRun = yield* jetworker("dlq", "purge", ...dlqStream, "--subject", stream.subject("a"), "--dry-run", ...server)
        assert.strictEqual(dryRun.code, 0)
        assert.include(dryRun.stdout, `would purge 2 dead letter(s) of ${stream.deadLetterStream}`)
        assert.strictEqual(yield* count(stream.deadLetterStream), 3, "nothing changed")

        const third = yield* DeadLetter.read(stream.deadLetterStream, 3)
        const replayed = yield* jetworker("dlq", "replay", ...dlqStream, "--subject", stream.subject("b"), "--yes", ...server)
        assert.strictEqual(replayed.code, 0, replayed.stderr)
        assert.include(replayed.stdout, `replayed 1 of 1 dead letter(s) of ${stream.deadLetterStream}`)
        assert.strictEqual(yield* count(stream.stream), 4, "the replay is stored in the source stream")
        // A replay that is retried sends the same deterministic Nats-Msg-Id: stored once.
        const retried = yield* Effect.promise(() =>
          jetstream.publish(stream.subject("b"), new TextEncoder().encode(`{"id":"x3"}`), { msgID: DeadLetter.replayId(third) })
        )
        assert.isTrue(retried.duplicate)
        assert.strictEqual(yield* count(stream.stream), 4)

        const purged = yield* jetworker("dlq", "purge", ...dlqStream, "--all", "--yes", "--rate", "100", ...server)
        assert.strictEqual(purged.code, 0, purged.stderr)
        assert.include(purged.stdout, `purged 2 of 2 dead letter(s) of ${stream.deadLetterStream}`)
        assert.include(purged.stderr, "purge: 2/2")
        assert.strictEqual(yield* count(stream.deadLetterStream), 0)
      }), 120_000)

    it.effect("dlq recover stores a message the broker gave up on in the dead-letter stream as it is (never created, limits kept; an unknown stream or consumer is reported), dlq list shows it with its cause, dlq replay sends it back once", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const seq = yield* stream.publish("a", `{"id":"o1"}`, "o1")
        const recoverArgs = (source: string, consumer: string) =>
          ["dlq", "recover", "--stream", source, "--consumer", consumer, "--sequence", String(seq), "--server", natsUrl]
        const exists = (name: string) => Effect.promise(() => manager.streams.info(name).then(() => true, () => false))

        // No dead-letter stream yet (no worker started): recover does not create one.
        const noDeadLetterStream = yield* jetworker(...recoverArgs(stream.stream, stream.consumer))
        assert.strictEqual(noDeadLetterStream.code, 1, noDeadLetterStream.stderr)
        assert.include(noDeadLetterStream.stderr, `dead-letter stream ${stream.deadLetterStream}: does not exist, and dlq recover does not create it`)
        assert.isFalse(yield* exists(stream.deadLetterStream))
        // A mistyped stream leaves no stray <NAME>_DLQ and names the stream.
        const typo = `${stream.stream}X`
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(`${typo}_DLQ`).catch(() => false)))
        const mistyped = yield* jetworker(...recoverArgs(typo, stream.consumer))
        assert.strictEqual(mistyped.code, 1, mistyped.stderr)
        assert.include(mistyped.stderr, `recover ${typo}#${seq}: stream not found`)
        assert.isFalse(yield* exists(`${typo}_DLQ`))
        // The dead-letter stream as the operator set it up (7 days, 10 MiB); a misspelt consumer stores nothing.
        yield* DeadLetter.ensure(DeadLetter.destination(stream.stream, stream.consumer), { maxAge: "7 days", maxBytes: 10 * 1024 * 1024 })
        const misspelt = yield* jetworker(...recoverArgs(stream.stream, "wroker"))
        assert.strictEqual(misspelt.code, 1, misspelt.stderr)
        assert.include(misspelt.stderr, `consumer ${stream.stream}/wroker: consumer not found`)

        const recover = yield* jetworker(...recoverArgs(stream.stream, stream.consumer))
        assert.strictEqual(recover.code, 0, recover.stderr)
        assert.include(recover.stdout, `stored ${stream.stream}#${seq} as dead letter ${stream.deadLetterStream}#1`)
        const limits = (yield* Effect.promise(() => manager.streams.info(stream.deadLetterStream))).config
        assert.deepStrictEqual([limits.max_age, limits.max_bytes], [7 * 24 * 3600 * 1e9, 10 * 1024 * 1024], "its limits are kept")

        const list = yield* jetworker("dlq", "list", "--stream", stream.deadLetterStream, "--server", natsUrl)
        assert.strictEqual(list.code, 0, list.stderr)
        assert.include(list.stdout, "#1 DeadLettered DeliveriesExhausted")
        assert.include(list.stdout, `from ${stream.stream}/${stream.consumer}#${seq} (subject ${stream.subject("a")}`)
        assert.include(list.stdout, `payload: {"id":"o1"}`)
        const json = yield* jetworker("dlq", "list", "--stream", stream.deadLetterStream, "--json", "--server", natsUrl)
        const rows = JSON.parse(json.stdout) as ReadonlyArray<{ readonly sequence: number; readonly reason: string; readonly sourceSequence: number }>
        assert.deepStrictEqual(rows.map((r) => [r.sequence, r.reason, r.sourceSequence]), [[1, "DeliveriesExhausted", seq]])

        const replay = yield* jetworker("dlq", "replay", "--stream", stream.deadLetterStream, "--sequence", "1", "--server", natsUrl)
        assert.strictEqual(replay.code, 0, replay.stderr)
        assert.include(replay.stdout, `stored as ${stream.stream}#${seq + 1}`)
        const messages = (name: string) => Effect.promise(() => manager.streams.info(name).then((info) => info.state.messages))
        assert.deepStrictEqual([yield* messages(stream.stream), yield* messages(stream.deadLetterStream)], [2, 0])
        const empty = yield* jetworker("dlq", "list", "--stream", stream.deadLetterStream, "--server", natsUrl)
        assert.include(empty.stdout, `no dead letters in ${stream.deadLetterStream}`)

        // Operator errors: the dead letter is gone (1), the server cannot be reached (2).
        const again = yield* jetworker("dlq", "replay", "--stream", stream.deadLetterStream, "--sequence", "1", "--server", natsUrl)
        assert.strictEqual(again.code, 1)
        assert.include(again.stderr, "jetworker dlq replay:")
        const unreachable = yield* jetworker("dlq", "list", "--stream", stream.deadLetterStream, "--server", "nats://127.0.0.1:1")
        assert.strictEqual(unreachable.code, 2)
        assert.include(unreachable.stderr, "jetworker dlq list:")
      }), 120_000)

    it.effect("dlq purge and replay take only a dead-letter stream: a source stream is refused (exit 2, naming its dead-letter stream) and a message without dead-letter headers is never selected; --sequence takes no filter; an empty --json run is no dry run; list says when more match; a missing stream is named", () =>
      Effect.gen(function*() {
        const { stream, deadLetterStream, stored } = yield* deadLetters(3)
        const { manager, jetstream } = yield* NatsConnection.NatsConnection
        const server = ["--server", natsUrl]
        const count = (name: string) => Effect.promise(() => manager.streams.info(name).then((info) => info.state.messages))

        for (const args of [["purge", "--sequence", "2", "--yes"], ["purge", "--all", "--yes"], ["replay", "--sequence", "2"], ["replay", "--all", "--yes"]]) {
          const refused = yield* jetworker("dlq", ...args, "--stream", stream, ...server)
          assert.strictEqual(refused.code, 2, `${args.join(" ")}: ${refused.stdout}${refused.stderr}`)
          assert.include(refused.stderr, `${stream} is not a dead-letter stream`)
          assert.include(refused.stderr, `the dead letters of ${stream}'s consumers are in ${deadLetterStream}`)
        }
        assert.strictEqual(yield* count(stream), 3, "no message of the source stream is deleted or replayed")

        const filtered = yield* jetworker("dlq", "purge", "--stream", deadLetterStream, "--sequence", "1", "--consumer", "other", "--yes", ...server)
        assert.strictEqual(filtered.code, 2)
        assert.include(filtered.stderr, "--sequence names one dead letter; it takes no filter")
        const withAll = yield* jetworker("dlq", "replay", "--stream", deadLetterStream, "--sequence", "1", "--all", ...server)
        assert.strictEqual(withAll.code, 2)
        assert.strictEqual(yield* stored, 3)

        const limited = yield* jetworker("dlq", "list", "--stream", deadLetterStream, "--limit", "2", ...server)
        assert.strictEqual(limited.code, 0, limited.stderr)
        assert.include(limited.stdout, "more dead letters match than --limit 2; the next from --from 3")
        const limitedJson = yield* jetworker("dlq", "list", "--stream", deadLetterStream, "--limit", "2", "--json", ...server)
        assert.strictEqual((JSON.parse(limitedJson.stdout) as ReadonlyArray<unknown>).length, 2)
        assert.include(limitedJson.stderr, "more dead letters match than --limit 2")
        const all = yield* jetworker("dlq", "list", "--stream", deadLetterStream, "--limit", "3", ...server)
        assert.notInclude(all.stdout, "more dead letters match")

        const none = yield* jetworker("dlq", "purge", "--stream", deadLetterStream, "--reason", "PermanentError", "--yes", "--json", ...server)
        assert.strictEqual(none.code, 0, none.stderr)
        assert.deepStrictEqual(JSON.parse(none.stdout), { action: "purge", selected: 0, done: 0, stored: [], failed: [], count: 0, next: null })
        const missing = `${deadLetterStream}_MISSING`
        const notFound = yield* jetworker("dlq", "list", "--stream", missing, ...server)
        assert.strictEqual(notFound.code, 1)
        assert.include(notFound.stderr, `list ${missing}: stream not found`)

        // A message an operator put in the dead-letter stream, without dead-letter headers: never purged.
        const stray = yield* Effect.promise(() => jetstream.publish(DeadLetter.destination(stream, "worker").subject, new TextEncoder().encode("{}")))
        const purged = yield* jetworker("dlq", "purge", "--stream", deadLetterStream, "--all", "--yes", "--rate", "1000", ...server)
        assert.strictEqual(purged.code, 0, purged.stderr)
        assert.include(purged.stdout, `purged 3 of 3 dead letter(s) of ${deadLetterStream}`)
        const strayPurge = yield* jetworker("dlq", "purge", "--stream", deadLetterStream, "--sequence", String(stray.seq), "--yes", ...server)
        assert.strictEqual(strayPurge.code, 2)
        assert.include(strayPurge.stderr, `#${stray.seq} has no Jetworker-Stream header`)
        assert.strictEqual(yield* stored, 1, "the message without dead-letter headers is kept")
      }), 120_000)

    it.effect("dlq --since and --until take ISO 8601 only (a date, or a date-time with its offset): anything else Date.parse would read (--since 2 is February 2001) is refused with exit 2 and nothing is selected", () =>
      Effect.gen(function*() {
        const { deadLetterStream, stored } = yield* deadLetters(1)
        const server = ["--server", natsUrl]
        for (const [flag, value] of [["--since", "2"], ["--until", "Dec 1"], ["--since", "2026-12-01T10:00:00"]] as const) {
          const refused = yield* jetworker("dlq", "purge", "--stream", deadLetterStream, flag, value, "--yes", ...server)
          assert.strictEqual(refused.code, 2, `${flag} ${value} was accepted (exit ${refused.code}): ${refused.stdout} ${refused.stderr}`)
          assert.include(refused.stderr, `${flag} ${JSON.stringify(value)}: --since and --until take an ISO 8601 date`)
        }
        assert.strictEqual(yield* stored, 1, "nothing purged")
        const taken = yield* jetworker("dlq", "list", "--stream", deadLetterStream, "--since", "2000-01-01", "--until", "2999-01-01T00:00:00.5+01:00", "--json", ...server)
        assert.strictEqual(taken.code, 0, taken.stderr)
        assert.strictEqual((JSON.parse(taken.stdout) as ReadonlyArray<unknown>).length, 1)
        // The forms, without a process each.
        assert.strictEqual(DeadLetters.parseTime("2026-12-01"), Date.UTC(2026, 11, 1))
        assert.strictEqual(DeadLetters.parseTime("2026-12-01T10:00Z"), Date.UTC(2026, 11, 1, 10))
        assert.strictEqual(DeadLetters.parseTime("2026-12-01T10:00:00.250-01:30"), Date.UTC(2026, 11, 1, 11, 30, 0, 250))
        for (const bad of ["2", "12", "Dec 1", "2026-12-01T10:00:00", "2026-02-30", "2026-12-01T24:00Z", "2026-12-01 10:00Z", "yesterday"]) {
          assert.isUndefined(DeadLetters.parseTime(bad), bad)
        }
      }).pipe(Effect.scoped), 60_000)

    it.effect("dlq show refuses a message that is not a dead letter (a source stream's, or one without dead-letter headers) as replay and purge do: exit 2, saying so, instead of showing it with empty fields", () =>
      Effect.gen(function*() {
        const { deadLetterStream, stream } = yield* deadLetters(1)
        const server = ["--server", natsUrl]
        for (const json of [[], ["--json"]]) {
          const refused = yield* jetworker("dlq", "show", "--stream", stream, "--sequence", "1", ...json, ...server)
          assert.strictEqual(refused.code, 2, `shown as a dead letter (exit ${refused.code}):\n${refused.stdout}`)
          assert.strictEqual(refused.stdout, "")
          assert.include(refused.stderr, `jetworker dlq show: ${stream}#1 is not a dead letter (it has no Jetworker-Stream header), nothing shown`)
          assert.include(refused.stderr, `its consumers' dead letters are in ${deadLetterStream}`)
        }
        const shown = yield* jetworker("dlq", "show", "--stream", deadLetterStream, "--sequence", "1", ...server)
        assert.strictEqual(shown.code, 0, shown.stderr)
        assert.include(shown.stdout, `source:     ${stream}/worker#1`)
      }).pipe(Effect.scoped), 60_000)

    it.effect("Ctrl-C in a bulk run says how many were done (exit 130)", () =>
      Effect.gen(function*() {
        const { deadLetterStream, stored } = yield* deadLetters(10)
        const child = yield* ChildWorker.spawn({
          script: bin,
          args: ["dlq", "purge", "--stream", deadLetterStream, "--all", "--yes", "--rate", "2", "--server", natsUrl]
        })
        yield* until(stored, (n) => n < 10, "20 seconds")
        yield* child.kill("SIGINT")
        const exit = yield* child.waitForExit("20 seconds")
        const stderr = (yield* child.stderr).join("\n")
        assert.strictEqual(exit.code, 130, stderr)
        const reported = /interrupted: purged (\d+) of 10 dead letter\(s\) of /.exec(stderr)
        assert.isNotNull(reported, stderr)
        // The delete in flight when the signal came may have been done without being counted.
        const purged = 10 - (yield* stored)
        assert.include([purged, purged - 1], Number(reported![1]))
      }), 60_000)
  })

  it.live("the NATS commands log in as NATS_USER/NATS_PASSWORD say, --server replacing only the servers, and an empty NATS_URL is unset; refused credentials, a server that does not answer and one without JetStream exit 2", () =>
    Effect.gen(function*() {
      const secret = "cli-pw-never-printed-41f"
      const server = yield* NatsServer.make({ config: `authorization { user: "op", password: "${secret}" }` })
      const connection = yield* NatsConnection.make({ servers: server.url, user: "op", password: Redacted.make(secret) })
      const { deadLetterStream } = yield* deadLetters(1).pipe(Effect.provideService(NatsConnection.NatsConnection, connection))
      const list = ["dlq", "list", "--stream", deadLetterStream]
      const login = { NATS_USER: "op", NATS_PASSWORD: secret }

      const loggedIn = yield* jetworkerEnv({ ...login, NATS_URL: "nats://127.0.0.1:1" }, ...list, "--server", server.url)
      assert.strictEqual(loggedIn.code, 0, loggedIn.stderr)
      assert.include(loggedIn.stdout, "#1 DeadLettered DeliveriesExhausted")
      const fromEnv = yield* jetworkerEnv({ ...login, NATS_URL: server.url }, ...list)
      assert.strictEqual(fromEnv.code, 0, fromEnv.stderr)
      const refused = yield* jetworkerEnv({ NATS_USER: "op", NATS_PASSWORD: "wrong" }, ...list, "--server", server.url)
      assert.strictEqual(refused.code, 2, refused.stderr)
      assert.include(refused.stderr, "refused the credentials")
      assert.notInclude(loggedIn.stdout + loggedIn.stderr + refused.stderr, secret)
      // Unset, the default server (the shared one), which has no such stream.
      const emptyUrl = yield* jetworkerEnv({ NATS_URL: "" }, ...list)
      assert.strictEqual(emptyUrl.code, 1, emptyUrl.stderr)
      assert.include(emptyUrl.stderr, `list ${deadLetterStream}: stream not found`)

      // A server that accepts the connection and never answers: the connect times out.
      const sockets: Array<Net.Socket> = []
      const silent = yield* Effect.acquireRelease(
        Effect.callback<Net.Server>((resume) => {
          const listener = Net.createServer((socket) => void sockets.push(socket))
          listener.listen(0, "127.0.0.1", () => resume(Effect.succeed(listener)))
        }),
        (listener) => Effect.sync(() => {
          for (const socket of sockets) socket.destroy()
          listener.close()
        })
      )
      const noAnswer = yield* jetworker(...list, "--server", `nats://127.0.0.1:${(silent.address() as Net.AddressInfo).port}`)
      assert.strictEqual(noAnswer.code, 2, noAnswer.stderr)
      assert.include(noAnswer.stderr, "could not connect to")
      const withoutJetStream = yield* NatsServer.make({ config: "jetstream: disabled" })
      const noJetStream = yield* jetworker(...list, "--server", withoutJetStream.url)
      assert.strictEqual(noJetStream.code, 2, noJetStream.stderr)
      assert.include(noJetStream.stderr, "nats-server -js")
    }), 120_000)

  it.live("a connection lost in the middle of a purge stops the run at once, says how many were done and exits 2; log lines go to stderr, so --json stays one document", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make()
      const connection = yield* NatsConnection.make({ servers: server.url, maxReconnectAttempts: 0, drainTimeout: "1 second" })
      const { deadLetterStream, stored } = yield* deadLetters(20).pipe(Effect.provideService(NatsConnection.NatsConnection, connection))
      const child = yield* ChildWorker.spawn({
        script: bin,
        args: ["dlq", "purge", "--stream", deadLetterStream, "--all", "--yes", "--rate", "2", "--json", "--server", server.url]
      })
      yield* until(stored, (n) => n < 20, "20 seconds")
      yield* server.stop("SIGKILL")
      const exit = yield* child.waitForExit("20 seconds")
      const stdout = (yield* child.lines).join("\n")
      const stderr = (yield* child.stderr).join("\n")
      assert.strictEqual(exit.code, 2, stdout + stderr)
      assert.include(stderr, "nats connection disconnect", "the log line is on stderr")
      const result = JSON.parse(stdout) as DeadLetters.BulkResult
      assert.isAtLeast(result.done, 1)
      assert.isAtMost(result.failed.length, 1, "it stops at the first one that failed")
      assert.isBelow(result.done + result.failed.length, 20, "the rest are not tried")
      assert.include(result.stopped, "lost the connection")
      assert.include(stderr, `stopped, ${result.done} of 20 purged`)
    }), 60_000)
})

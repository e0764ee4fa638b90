/**
 * `jetworker contract check`, `diff` and `apply` (INT-NATS-002) as an operator and CI run them on
 * the real NATS: a child process, its exit code and output, the live stream after it. Each case
 * was a gap a review found (its reproductions failed 6 of 6 before the fix); the doc comment of
 * each says what happened before.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { ChildWorker } from "@jetworker/testing"
import type { ConsumerConfig, StreamConfig } from "@nats-io/jetstream"
import { Effect } from "effect"
import { rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const bin = fileURLToPath(new URL("../packages/cli/src/bin/jetworker.ts", import.meta.url))

const jetworker = (...args: Array<string>) =>
  Effect.gen(function*() {
    const child = yield* ChildWorker.spawn({ script: bin, args: [...args, "--server", natsUrl] })
    const exit = yield* child.waitForExit("30 seconds")
    return { code: exit.code, stdout: (yield* child.lines).join("\n"), stderr: (yield* child.stderr).join("\n") }
  }).pipe(Effect.scoped)

/**
 * A fresh stream `CGAP_<id>` (subjects `<name>.>`), created on the server as `stream` and
 * `consumers` say (the live state a platform or an earlier deploy left), and a contract file
 * for it (`contract(name, subject)` gives its JSON); both removed with the scope.
 */
const fixture = (
  stream: Partial<StreamConfig>,
  consumers: ReadonlyArray<Partial<ConsumerConfig>>,
  contract: (name: string, subjects: string) => unknown
) =>
  Effect.gen(function*() {
    const name = `CGAP_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
    const subjects = `${name.toLowerCase()}.>`
    const { manager } = yield* NatsConnection.NatsConnection
    yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
    yield* Effect.promise(() => manager.streams.add({ name, subjects: [subjects], ...stream }))
    for (const consumer of consumers) yield* Effect.promise(() => manager.consumers.add(name, consumer))
    const file = join(tmpdir(), `jw-contract-gaps-${process.pid}-${name}.json`)
    writeFileSync(file, JSON.stringify(contract(name, subjects)))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(file, { force: true })))
    return { name, subjects, file }
  })

/** A consumer declaration named `c` that {@link liveConsumer} fits, with `extra` settings. */
const consumerContract = (extra: Record<string, unknown> = {}) => ({
  name: "c",
  ackWait: "30 seconds",
  maxDeliver: 11,
  maxAckPending: 1000,
  ...extra,
  expect: { attempts: 5, concurrency: 8, prefetch: 8 }
})

/** The live consumer that fits {@link consumerContract}, with `extra` settings. */
const liveConsumer = (extra: Partial<ConsumerConfig> = {}): Partial<ConsumerConfig> => ({
  durable_name: "c",
  ack_policy: "explicit" as ConsumerConfig["ack_policy"],
  ack_wait: 30_000_000_000,
  max_deliver: 11,
  max_ack_pending: 1000,
  ...extra
})

const contractOf = (stream: Record<string, unknown>, consumers: ReadonlyArray<unknown>) => ({
  version: "1",
  ownership: "service",
  stream: { duplicateWindow: "2 minutes", ...stream },
  consumers
})

interface Report {
  readonly ok: boolean
  readonly findings: ReadonlyArray<{ readonly severity: string; readonly check: string; readonly message: string }>
}

describe("jetworker contract: what the check, the plan and the apply must not let pass", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    /**
     * Before: a live push consumer passed `check` (ok, no findings) though nats.js cannot pull from
     * it ("not a pull consumer"), and `apply` "updated" it and left it push.
     */
    it.effect("INT-NATS-002: a push consumer (deliver_subject set) is an error of check, and apply refuses it", () =>
      Effect.gen(function*() {
        const { file, name } = yield* fixture(
          {},
          [liveConsumer({ deliver_subject: `gap.push.${crypto.randomUUID().slice(0, 8)}` })],
          (name, subjects) => contractOf({ name, subjects: [subjects] }, [consumerContract()])
        )
        const check = yield* jetworker("contract", "check", "--contract", file, "--json")
        assert.strictEqual(check.code, 1, check.stdout + check.stderr)
        const report = JSON.parse(check.stdout) as Report
        assert.isFalse(report.ok)
        const push = report.findings.find((f) => f.check === "deliver_subject")
        assert.strictEqual(push?.severity, "error", check.stdout)
        assert.include(push?.message, `consumer ${name}/c is a push consumer`)
        assert.include(push?.message, "delete the consumer and declare it again as a pull consumer")
        const apply = yield* jetworker("contract", "apply", "--contract", file, "--yes")
        assert.strictEqual(apply.code, 1, apply.stdout + apply.stderr)
        assert.include(apply.stderr, "not applied (Refused)")
        const { manager } = yield* NatsConnection.NatsConnection
        const live = yield* Effect.promise(() => manager.consumers.info(name, "c"))
        assert.isString(live.config.deliver_subject, "still the push consumer it was")
      }))

    /**
     * Before: a consumer whose replay policy is `original` (the requirement's "replay mode") gave
     * no finding, though the server paces its deliveries at the publish rate.
     */
    it.effect("INT-NATS-002: a replay policy other than instant is an error of check (it cannot change in place)", () =>
      Effect.gen(function*() {
        const { file } = yield* fixture(
          {},
          [liveConsumer({ replay_policy: "original" as ConsumerConfig["replay_policy"] })],
          (name, subjects) => contractOf({ name, subjects: [subjects] }, [consumerContract()])
        )
        const run = yield* jetworker("contract", "check", "--contract", file, "--json")
        assert.strictEqual(run.code, 1, run.stdout + run.stderr)
        const replay = (JSON.parse(run.stdout) as Report).findings.find((f) => f.check === "replay_policy")
        assert.strictEqual(replay?.severity, "error", run.stdout)
        assert.include(replay?.message, "has replay policy original")
      }))

    /**
     * Before: a declared deliverPolicy the live consumer does not have passed `check` (exit 0) and
     * `diff` said "nothing to change"; NATS 2.9 cannot change it in place.
     */
    it.effect("INT-NATS-002: a declared deliverPolicy the live consumer lacks is drift check and diff report; one the contract leaves out is not compared", () =>
      Effect.gen(function*() {
        const { file, name } = yield* fixture(
          {},
          [liveConsumer({ deliver_policy: "all" as ConsumerConfig["deliver_policy"] })],
          (name, subjects) => contractOf({ name, subjects: [subjects] }, [consumerContract({ deliverPolicy: "new" })])
        )
        const check = yield* jetworker("contract", "check", "--contract", file)
        assert.strictEqual(check.code, 1, check.stdout + check.stderr)
        assert.include(check.stdout, `ERROR   consumer ${name}/c [deliver_policy]`)
        assert.include(check.stdout, "has deliver policy all, the declaration new")
        const diff = yield* jetworker("contract", "diff", "--contract", file)
        assert.strictEqual(diff.code, 1, diff.stdout + diff.stderr)
        assert.include(diff.stdout, `! consumer ${name}/c deliver_policy: all -> new cannot change in place`)

        const undeclared = yield* fixture(
          {},
          [liveConsumer({ deliver_policy: "new" as ConsumerConfig["deliver_policy"] })],
          (name, subjects) => contractOf({ name, subjects: [subjects] }, [consumerContract()])
        )
        const fits = yield* jetworker("contract", "check", "--contract", undeclared.file)
        assert.strictEqual(fits.code, 0, fits.stdout + fits.stderr)
      }))

    /**
     * Before: lowering maxMessages below what the stream holds was a plain `~ max_msgs: -1 -> 2`,
     * and `apply --yes` deleted 3 of 5 unprocessed messages and exited 0.
     */
    it.effect("a lower maxMessages is marked DELETES DATA with how many go; apply refuses it without --allow-data-loss (exit 1, nothing deleted) and makes it with", () =>
      Effect.gen(function*() {
        const { file, name, subjects } = yield* fixture(
          {},
          [],
          (name, subjects) => contractOf({ name, subjects: [subjects], maxMessages: 2 }, [])
        )
        const { jetstream, manager } = yield* NatsConnection.NatsConnection
        for (let i = 0; i < 5; i++) yield* Effect.promise(() => jetstream.publish(subjects.replace(">", "e"), new TextEncoder().encode(`${i}`)))
        const stored = Effect.promise(() => manager.streams.info(name).then((info) => info.state.messages))

        const diff = yield* jetworker("contract", "diff", "--contract", file)
        assert.strictEqual(diff.code, 1)
        assert.include(
          diff.stdout,
          `~ stream ${name} max_msgs: -1 -> 2 DELETES DATA\n    set max_msgs of stream ${name} to 2 (now -1): deletes the oldest 3 of the 5 stored messages`
        )
        assert.include(diff.stdout, "1 change(s) can delete stored messages: contract apply makes them only with --allow-data-loss")
        const json = yield* jetworker("contract", "diff", "--contract", file, "--json")
        const planned = JSON.parse(json.stdout) as ReadonlyArray<{ readonly setting: string; readonly destructive?: boolean }>
        assert.deepStrictEqual(planned.map((change) => [change.setting, change.destructive]), [["max_msgs", true]])

        const dryRun = yield* jetworker("contract", "apply", "--contract", file, "--dry-run")
        assert.strictEqual(dryRun.code, 1, "the apply would refuse it")
        assert.include(dryRun.stderr, "it would not apply (DataLoss)")
        const refused = yield* jetworker("contract", "apply", "--contract", file, "--yes", "--json")
        assert.strictEqual(refused.code, 1, refused.stdout + refused.stderr)
        const why = JSON.parse(refused.stdout) as { applied: boolean; reason: string; message: string; changes: ReadonlyArray<{ setting: string }> }
        assert.strictEqual(why.applied, false)
        assert.strictEqual(why.reason, "DataLoss")
        assert.include(why.message, "deletes the oldest 3 of the 5 stored messages")
        assert.include(why.message, "--allow-data-loss")
        assert.deepStrictEqual(why.changes.map((change) => change.setting), ["max_msgs"])
        assert.strictEqual(yield* stored, 5, "nothing deleted")

        assert.strictEqual((yield* jetworker("contract", "apply", "--contract", file, "--dry-run", "--allow-data-loss")).code, 0)
        assert.strictEqual(yield* stored, 5, "a dry run deletes nothing")
        const allowed = yield* jetworker("contract", "apply", "--contract", file, "--yes", "--allow-data-loss")
        assert.strictEqual(allowed.code, 0, allowed.stdout + allowed.stderr)
        assert.include(allowed.stdout, "applied 1 change(s)")
        assert.strictEqual(yield* stored, 2)
      }))

    /**
     * Before: `apply --dry-run` of a plan holding a change the server cannot make in place exited
     * 0, though the apply is refused.
     */
    it.effect("contract apply --dry-run exits 1 when the apply would be refused (storage cannot change in place), 0 when it would apply", () =>
      Effect.gen(function*() {
        const { file } = yield* fixture(
          { storage: "memory" as StreamConfig["storage"] },
          [],
          (name, subjects) => contractOf({ name, subjects: [subjects], storage: "file" }, [])
        )
        const run = yield* jetworker("contract", "apply", "--contract", file, "--dry-run")
        assert.include(run.stdout, "cannot change in place")
        assert.strictEqual(run.code, 1, run.stdout + run.stderr)
        assert.include(run.stderr, "it would not apply (Refused)")

        const applicable = yield* fixture(
          {},
          [],
          (name, subjects) => contractOf({ name, subjects: [subjects], duplicateWindow: "1 minute" }, [])
        )
        const fine = yield* jetworker("contract", "apply", "--contract", applicable.file, "--dry-run", "--json")
        assert.strictEqual(fine.code, 0, fine.stdout + fine.stderr)
        const document = JSON.parse(fine.stdout) as { applied: boolean; changes: ReadonlyArray<{ setting: string }> }
        assert.isFalse(document.applied)
        assert.deepStrictEqual(document.changes.map((change) => change.setting), ["duplicate_window"])
      }))

    /** Before: a refused `apply --yes --json` printed nothing on stdout (the reason only on stderr). */
    it.effect("contract apply --json that is refused prints one JSON document: applied false, the reason, the message and the changes", () =>
      Effect.gen(function*() {
        const { file } = yield* fixture(
          { storage: "memory" as StreamConfig["storage"] },
          [],
          (name, subjects) => contractOf({ name, subjects: [subjects], storage: "file" }, [])
        )
        const run = yield* jetworker("contract", "apply", "--contract", file, "--yes", "--json")
        assert.strictEqual(run.code, 1, run.stdout + run.stderr)
        const parsed = JSON.parse(run.stdout) as {
          applied: boolean
          reason: string
          message: string
          changes: ReadonlyArray<{ action: string; setting: string }>
        }
        assert.strictEqual(parsed.applied, false)
        assert.strictEqual(parsed.reason, "Refused")
        assert.include(parsed.message, "cannot change in place")
        assert.deepStrictEqual(parsed.changes.map((change) => [change.action, change.setting]), [["refuse", "storage"]])

        // Not confirmed (no terminal, no --yes): the same document.
        const applicable = yield* fixture(
          {},
          [],
          (name, subjects) => contractOf({ name, subjects: [subjects], duplicateWindow: "1 minute" }, [])
        )
        const unconfirmed = yield* jetworker("contract", "apply", "--contract", applicable.file, "--json")
        assert.strictEqual(unconfirmed.code, 1)
        const notConfirmed = JSON.parse(unconfirmed.stdout) as { applied: boolean; reason: string }
        assert.deepStrictEqual([notConfirmed.applied, notConfirmed.reason], [false, "NotConfirmed"])
      }))
  })
})

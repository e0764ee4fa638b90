/**
 * The `jetworker` command as an operator runs it: a child process on the real files, its exit
 * code and output.
 */
import { assert, describe, it } from "@effect/vitest"
import { ChildWorker } from "@jetworker/testing"
import { Effect } from "effect"
import { readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const bin = fileURLToPath(new URL("../packages/cli/src/bin/jetworker.ts", import.meta.url))
const reference = fileURLToPath(new URL("../examples/ledger/deploy/deployment.yaml", import.meta.url))

const jetworker = (...args: Array<string>) =>
  Effect.gen(function*() {
    const child = yield* ChildWorker.spawn({ script: bin, args })
    const exit = yield* child.waitForExit("30 seconds")
    return { code: exit.code, stdout: (yield* child.lines).join("\n"), stderr: (yield* child.stderr).join("\n") }
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
      for (const args of [["--help"], ["config", "--help"], ["config", "check", "--help"]]) {
        const run = yield* jetworker(...args)
        assert.strictEqual(run.code, 0, args.join(" "))
        assert.include(run.stdout, "USAGE")
      }
    }))
})

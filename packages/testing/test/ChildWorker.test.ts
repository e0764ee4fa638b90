import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { fileURLToPath } from "node:url"
import * as ChildWorker from "../src/ChildWorker.ts"

const ticker = fileURLToPath(new URL("./fixtures/ticker.ts", import.meta.url))
const bound = "10 seconds"

describe("ChildWorker", () => {
  it.live("finds printed lines, past or future, and passes args and env", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker, env: { TICKER_NAME: "jet" } })
      assert.isAbove(worker.pid, 0)
      assert.strictEqual(yield* worker.waitForLine((line) => line === "ready", bound), "ready")
      assert.strictEqual(yield* worker.waitForLine((line) => line === "tick 5", bound), "tick 5")
      // Already printed: found in the history at once.
      assert.strictEqual(yield* worker.waitForLine((line) => line.startsWith("hello"), "1 millis"), "hello jet")
      const lines = yield* worker.lines
      assert.deepStrictEqual(lines.slice(0, 3), ["hello jet", "ready", "tick 1"])
      assert.include(yield* worker.stderr, "ticker started")
    }))

  it.live("keeps only the most recent maxLines lines", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker, args: ["--ticks", "30"], maxLines: 5 })
      yield* worker.waitForLine((line) => line === "tick 30", bound)
      assert.deepStrictEqual(yield* worker.lines, ["tick 26", "tick 27", "tick 28", "tick 29", "tick 30"])
    }))

  it.live("a child killed with SIGKILL exits with signal SIGKILL", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker })
      yield* worker.waitForLine((line) => line === "ready", bound)
      yield* worker.kill("SIGKILL")
      const status = yield* worker.waitForExit(bound)
      assert.deepStrictEqual(status, { code: null, signal: "SIGKILL" })
      assert.deepStrictEqual(yield* worker.exit, status)
    }))

  it.live("a child that ends by itself reports its exit code", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker, args: ["--ticks", "3", "--exit-code", "3"] })
      assert.deepStrictEqual(yield* worker.waitForExit(bound), { code: 3, signal: null })
      assert.deepStrictEqual((yield* worker.lines).slice(-1), ["tick 3"])
      // Its stdout has closed, so a line that never came fails at once, not at the timeout.
      const error = yield* Effect.flip(worker.waitForLine((line) => line === "tick 4", bound))
      assert.strictEqual(error.reason, "OutputEnded")
    }))

  it.live("a line timeout carries the recent stdout and stderr", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker, args: ["--ticks", "30"] })
      yield* worker.waitForLine((line) => line === "tick 30", bound)
      const error = yield* Effect.flip(worker.waitForLine((line) => line === "never printed", "200 millis"))
      assert.strictEqual(error._tag, "ChildWorkerError")
      assert.strictEqual(error.reason, "LineTimeout")
      assert.deepStrictEqual(error.recentStdout, Array.from({ length: 20 }, (_, i) => `tick ${i + 11}`))
      assert.deepStrictEqual(error.recentStderr, ["ticker started"])
      assert.include(error.message, "tick 30")
      assert.include(error.message, "ticker started")
      assert.strictEqual((yield* worker.lines).length, 32)
    }))

  it.live("closing the scope kills a child that still runs", () =>
    Effect.gen(function*() {
      const worker = yield* Effect.scoped(Effect.gen(function*() {
        const worker = yield* ChildWorker.spawn({ script: ticker })
        yield* worker.waitForLine((line) => line === "ready", bound)
        return worker
      }))
      // The finalizer has already waited for the exit, so this is settled.
      assert.deepStrictEqual(yield* worker.waitForExit("1 millis"), { code: null, signal: "SIGKILL" })
      assert.throws(() => process.kill(worker.pid, 0), /ESRCH/)
    }))

  it.live("a missing script fails with ScriptNotFound", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(ChildWorker.spawn({ script: "does-not-exist.ts", cwd: import.meta.dirname }))
      assert.strictEqual(error.reason, "ScriptNotFound")
      assert.isFalse(error.isRetryable)
    }))

  // Failed before: NaN kept every line (the ring never exceeds it, so it grew without bound) and
  // 0 or -1 kept none; the spawn went ahead.
  it.live("a maxLines that is not a positive integer (NaN, 0, -1, 2.5) fails the spawn with InvalidOptions, nothing started", () =>
    Effect.gen(function*() {
      for (const maxLines of [Number.NaN, 0, -1, 2.5]) {
        const error = yield* Effect.flip(Effect.scoped(ChildWorker.spawn({ script: ticker, maxLines })))
        assert.strictEqual(error.reason, "InvalidOptions", String(maxLines))
        assert.include(error.message, `maxLines must be a positive integer such as 10000, got ${maxLines}`)
        assert.isFalse(error.isRetryable)
      }
    }))
})

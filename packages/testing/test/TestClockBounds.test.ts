/**
 * The harness's bounded waits run in real time also under `TestClock` (what `it.effect`
 * provides), as Eventually's do: a child process or a server runs in real time, and under the test
 * clock a bound on the fiber's clock would never run out (the test would hang until the runner's
 * own timeout).
 *
 * Failed before: ChildWorker's `waitForLine` and `waitForExit`, and NatsServer's wait for "ready"
 * (`readyTimeout`) and for a SIGTERM'd server to exit (`stopTimeout`), timed out on the fiber's
 * clock: under `TestClock` each hung past its bound.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { ChildWorker, Eventually, NatsServer } from "../src/index.ts"

const ticker = fileURLToPath(new URL("./fixtures/ticker.ts", import.meta.url))

/** A stand-in "nats-server" running `body` (a shell script), removed with the scope. */
const fakeServer = (body: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const dir = mkdtempSync(join(tmpdir(), "testing-bounds-"))
      const binary = join(dir, "fake-server")
      writeFileSync(binary, `#!/bin/sh\n${body}\n`)
      chmodSync(binary, 0o755)
      return { dir, binary }
    }),
    ({ dir }) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )

/** Never says it is ready. */
const stuckServer = fakeServer("exec sleep 600")
/** Says it is ready, then ignores SIGTERM (only SIGKILL ends it). */
const deafServer = fakeServer(`trap '' TERM\necho "Server is ready" >&2\nwhile true; do sleep 1; done`)

/** How `effect` ended, or "hung" once 5 real seconds have passed (the guard runs on the real clock). */
const orHung = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const never = yield* Deferred.make<void>()
    return yield* Effect.raceFirst(
      Effect.match(effect, {
        onFailure: (e) => {
          const error = e as { readonly reason?: string; readonly _tag?: string; readonly message?: string }
          return `failed ${error.reason ?? `${error._tag} ${error.message}`}`
        },
        onSuccess: () => "succeeded"
      }),
      Effect.as(Effect.ignore(Eventually.deferred("the guard", never, "5 seconds")), "hung")
    )
  })

describe("bounded waits of ChildWorker and NatsServer under TestClock", () => {
  it.effect("ChildWorker.waitForLine with a 300 ms bound fails with LineTimeout in real time", () =>
    Effect.gen(function*() {
      // Ticks 3 times, then stays alive and silent.
      const worker = yield* ChildWorker.spawn({ script: ticker, args: ["--ticks", "3"] })
      const started = Date.now()
      const result = yield* orHung(worker.waitForLine((line) => line === "never printed", "300 millis"))
      assert.strictEqual(result, "failed LineTimeout", `after ${Date.now() - started} ms`)
    }), 20_000)

  it.effect("ChildWorker.waitForExit with a 300 ms bound fails with ExitTimeout in real time", () =>
    Effect.gen(function*() {
      const worker = yield* ChildWorker.spawn({ script: ticker, args: ["--ticks", "3"] })
      const started = Date.now()
      const result = yield* orHung(worker.waitForExit("300 millis"))
      assert.strictEqual(result, "failed ExitTimeout", `after ${Date.now() - started} ms`)
    }), 20_000)

  it.effect("NatsServer: a server that never says ready fails after readyTimeout (300 ms) in real time", () =>
    Effect.gen(function*() {
      const { binary } = yield* stuckServer
      const started = Date.now()
      const result = yield* orHung(Effect.scoped(NatsServer.make({ binary, readyTimeout: "300 millis" })))
      assert.match(result, /^failed NatsServerError.*not ready within/, `after ${Date.now() - started} ms: ${result}`)
    }), 20_000)

  it.effect("NatsServer: stop(SIGTERM) of a server that ignores it kills it after stopTimeout (300 ms) in real time", () =>
    Effect.gen(function*() {
      const { binary } = yield* deafServer
      const result = yield* orHung(Effect.scoped(Effect.gen(function*() {
        const server = yield* NatsServer.make({ binary, stopTimeout: "300 millis" })
        yield* server.stop("SIGTERM")
        // Stopped: start launches it again (it would do nothing while the old process ran).
        yield* server.start
      })))
      assert.strictEqual(result, "succeeded")
    }), 20_000)
})

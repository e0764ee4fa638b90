/**
 * The worker's duration settings are checked at start-up: one that is not a positive, finite
 * duration stops the process before it serves anything, with one `worker.invalid_settings` line
 * naming the variable and the value, instead of a worker that runs wrong (a liveness probe that
 * answers 503 forever, a start-up that has already timed out).
 */
import { assert, describe, layer } from "@effect/vitest"
import { ChildWorker, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("Worker settings", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("a duration that is not positive and finite stops start-up, naming the variable: HEALTH_MAX_EVENT_LOOP_LAG, STARTUP_TIMEOUT, SHUTDOWN_*", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const env = workerEnv(settings, schema.name, databaseUrl, natsUrl)
        const cases = [
          ["HEALTH_MAX_EVENT_LOOP_LAG", "0 millis", "HEALTH_MAX_EVENT_LOOP_LAG must be a positive, finite duration, got \"0 millis\""],
          ["HEALTH_MAX_EVENT_LOOP_LAG", "-5 seconds", "HEALTH_MAX_EVENT_LOOP_LAG must be a positive, finite duration, got \"-5 seconds\""],
          ["HEALTH_MAX_EVENT_LOOP_LAG", "Infinity", "HEALTH_MAX_EVENT_LOOP_LAG must be a positive, finite duration, got \"Infinity\""],
          ["STARTUP_TIMEOUT", "0 millis", "STARTUP_TIMEOUT must be a positive, finite duration, got \"0 millis\""],
          ["STARTUP_TIMEOUT", "-1 seconds", "STARTUP_TIMEOUT must be a positive, finite duration, got \"-1 seconds\""],
          ["SHUTDOWN_CLOSE", "-1 seconds", "SHUTDOWN_CLOSE must not be negative, got \"-1 seconds\""]
        ] as const
        for (const [name, value, text] of cases) {
          const invalid = yield* ChildWorker.spawn({ script: W.fixture, env: { ...env, [name]: value } })
          assert.deepStrictEqual(yield* invalid.waitForExit("15 seconds"), { code: 1, signal: null }, `${name}=${value}`)
          const logs = W.jsonLines(yield* invalid.lines)
          const failed = W.withMessage(logs, "worker.invalid_settings")
          assert.strictEqual(failed.length, 1, `${name}=${value}: ${JSON.stringify(logs)}`)
          assert.include(String(failed[0]!.error), text, `${name}=${value}`)
          assert.include(String(failed[0]!.error), name, `${name}=${value}: the variable is named`)
          assert.strictEqual(W.withMessage(logs, "health.listening").length, 0, `${name}=${value}: refused before serving`)
        }
      }), 90_000)
  })
})

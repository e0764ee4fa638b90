/**
 * The reference worker's default retry policy against a database outage: a soak that cut the
 * PostgreSQL link for 4-7 s dead-lettered transfers (9 of 3000) under the old defaults (5 attempts
 * from 200 ms: some 3 s of delays in all). The delays between its attempts, at the low end of the
 * jitter (0.8), must add up to more than a 10 s outage.
 */
import { assert, describe, it } from "@effect/vitest"
import { Retry } from "@jetworker/core"
import { ConfigProvider, Duration, Effect } from "effect"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"

describe("the reference worker's retry policy", () => {
  it.effect("BE-JOB-003: with the defaults, the delays between a transfer's attempts outlast a 10 s database outage", () =>
    Effect.gen(function*() {
      const defaults = yield* Effect.provideService(LedgerWorker.settings, ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} }))
      const exact = { ...LedgerWorker.retryPolicy(defaults), jitter: false }
      let total = 0
      for (let attempt = 1; attempt < exact.attempts; attempt++) total += Duration.toMillis(yield* Retry.delayAfter(exact, attempt))
      // The jitter spreads each delay over 0.8 to 1.2 of it.
      assert.isAbove(0.8 * total, 10_000, `${exact.attempts} attempts, ${total} ms of delays in all`)
    }))
})

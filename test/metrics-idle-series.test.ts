/**
 * `/metrics` on a healthy, idle ledger worker (child process, real NATS and PostgreSQL). The README
 * lists what it serves: "`jetworker_in_flight`, `jetworker_held` (deliveries held while a
 * dependency is down), `jetworker_paused` (1 while the consumer is paused on one)". An operator
 * alerts on `jetworker_paused == 1` or `jetworker_held > 0` and graphs `jetworker_in_flight`; a
 * series absent until its first change reads as "no data" (and `absent()` alerts fire). Before,
 * an idle worker served only the lag and ack-pending gauges: each of these was created on its first
 * update. The counters too: a counter series that first appears at its first increment is invisible
 * to `increase()`/`rate()` (Prometheus takes a new series' first sample as its baseline), so
 * `increase(jetworker_stranded[10m]) > 0` never fired for the first stranded message after a start.
 */
import { assert, describe, layer } from "@effect/vitest"
import { TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { parsePrometheusText } from "./support/prometheus.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("/metrics on an idle worker", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("once ready, the consumer's gauges jetworker_in_flight, jetworker_held and jetworker_paused are served, at 0", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        const body = (yield* worker.get("/metrics")).body
        const samples = parsePrometheusText(body)
        const served = samples.filter((s) => s.name.startsWith("jetworker_")).map((s) => `${s.name}${JSON.stringify(s.labels)} ${s.value}`)
        for (const name of ["jetworker_in_flight", "jetworker_held", "jetworker_paused"]) {
          const sample = samples.find((s) => s.name === name && s.labels.consumer === settings.consumer)
          assert.strictEqual(sample?.value, 0, `${name} for consumer ${settings.consumer}; served: ${served.join("; ")}`)
        }
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
      }))

    it.effect("once ready, the counters jetworker_outcomes (each outcome), jetworker_redeliveries, jetworker_retries and jetworker_stranded are served at 0, so increase() sees the first one after a start", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const worker = yield* W.start({ ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget })
        yield* W.waitReady(worker)
        const samples = parsePrometheusText((yield* worker.get("/metrics")).body)
        const served = samples.filter((s) => s.name.startsWith("jetworker_")).map((s) => `${s.name}${JSON.stringify(s.labels)} ${s.value}`)
        const missing: Array<string> = []
        const expect = (name: string, labels: Record<string, string>) => {
          const sample = samples.find((s) =>
            s.name === name && s.labels.consumer === settings.consumer && Object.entries(labels).every(([k, v]) => s.labels[k] === v)
          )
          if (sample?.value !== 0) missing.push(`${name}${JSON.stringify(labels)}`)
        }
        for (const outcome of ["Committed", "Duplicate", "Expired", "Rejected", "DeadLettered", "Released"]) {
          expect("jetworker_outcomes", { outcome })
        }
        expect("jetworker_redeliveries", {})
        expect("jetworker_retries", {})
        expect("jetworker_stranded", {})
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        assert.deepStrictEqual(missing, [], `not served at 0 for consumer ${settings.consumer}; served: ${served.join("; ")}`)
      }))
  })
})

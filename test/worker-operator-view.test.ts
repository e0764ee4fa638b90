/**
 * What an operator reads from a running ledger worker (child process, real NATS and PostgreSQL)
 * across its phases: `/healthz/ready` and `/healthz/live` running, after a PostgreSQL loss and
 * back, while draining (BE-SHUT-002: readiness 503 with phase `stopping` at the signal, liveness
 * still 200); `/metrics` counters equal to the outcomes the worker reports and its gauges back to
 * 0 once idle; every line the process writes one JSON object with the fixed keys, nothing on
 * stderr, and each dependency change logged once. Found sound by a review and kept as a guard.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Eventually, TestDatabase } from "@jetworker/testing"
import { Effect } from "effect"
import { ledgerStream, transfer, twoAccounts, workerEnv } from "./support/ledger.ts"
import { parsePrometheusText, type Sample } from "./support/prometheus.ts"
import { databaseProxy, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

interface ReadyBody {
  readonly ready: boolean
  readonly phase: string
  readonly components: ReadonlyArray<{ readonly name: string; readonly kind: string; readonly up: boolean; readonly reason?: string }>
}

const value = (samples: ReadonlyArray<Sample>, name: string, labels: Record<string, string>) =>
  samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value

/** The fixture's own lines (not the worker's): `outcome {...}`, `received {...}`, `crash at ...`. */
const isFixtureLine = (line: string) => /^(outcome|received|blocking|crash at) /.test(line)

describe("probes, metrics and logs across the worker's phases", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "150 seconds" })((it) => {
    it.effect("BE-SHUT-002: readiness and liveness per phase; /metrics outcomes equal the reported outcomes; gauges back to 0; every line JSON", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const { p, a, b } = yield* twoAccounts("rvw-health")
        const { proxy, url } = yield* databaseProxy
        const consumer = settings.consumer
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, url, natsUrl),
          SHUTDOWN_BUDGET: "12 seconds",
          SHUTDOWN_READINESS_GRACE: "200 millis",
          SHUTDOWN_CLOSE: "1500 millis",
          SHUTDOWN_TELEMETRY: "500 millis",
          SHUTDOWN_RESERVE: "500 millis"
        })
        yield* W.waitReady(worker)
        const running = yield* worker.get("/healthz/ready")
        const runningBody = JSON.parse(running.body) as ReadyBody
        assert.strictEqual(runningBody.phase, "running")
        assert.isTrue(runningBody.components.every((c) => c.up), running.body)
        assert.includeMembers(runningBody.components.map((c) => c.name), ["postgres", "nats"], running.body)
        assert.strictEqual((yield* worker.get("/healthz/live")).status, 200)

        // Work of each kind: committed, rejected (not JSON), a duplicate (same transfer id, other msg id).
        yield* stream.publish("eur", transfer(`${p}.ok1`, a, b, 1_00), `${p}.ok1`)
        yield* stream.publish("eur", "not json", `${p}.bad`)
        yield* stream.publish("eur", transfer(`${p}.ok1`, a, b, 1_00), `${p}.ok1-again`)
        yield* Eventually.holds("three outcomes", Effect.map(W.outcomes(worker), (o) => o.length >= 3), "20 seconds")

        // A dependency loss: readiness down, naming postgres; back up when restored.
        yield* proxy.cut
        const down = yield* Eventually.poll(
          "readiness down with postgres cut",
          worker.get("/healthz/ready"),
          (r) => r.status === 503,
          { timeout: "20 seconds", interval: "100 millis" }
        )
        const downBody = JSON.parse(down.body) as ReadyBody
        assert.strictEqual(downBody.phase, "running", down.body)
        const pg = downBody.components.find((c) => c.name === "postgres")
        assert.isFalse(pg?.up, down.body)
        assert.isString(pg?.reason, down.body)
        assert.strictEqual((yield* worker.get("/healthz/live")).status, 200, "a dependency loss is not being wedged")
        // A transfer during the outage is held; the consumer is paused.
        yield* stream.publish("eur", transfer(`${p}.ok2`, a, b, 1_00), `${p}.ok2`)
        yield* Eventually.poll("paused gauge 1", Effect.map(worker.get("/metrics"), (r) => parsePrometheusText(r.body)), (s) =>
          value(s, "jetworker_paused", { consumer }) === 1, { timeout: "20 seconds", interval: "100 millis" })
        yield* proxy.restore
        yield* W.waitReady(worker, "20 seconds")
        yield* Eventually.holds(
          "the held transfer commits",
          Effect.map(W.outcomes(worker), (o) => o.some((x) => x.eventId === `${p}.ok2` && x.tag === "Committed")),
          "30 seconds"
        )

        // Idle again: gauges at 0, counters equal the outcomes the worker reported.
        const idle = yield* Eventually.poll(
          "gauges back to 0",
          Effect.map(worker.get("/metrics"), (r) => parsePrometheusText(r.body)),
          (s) =>
            value(s, "jetworker_in_flight", { consumer }) === 0 && (value(s, "jetworker_held", { consumer }) ?? 0) === 0 &&
            value(s, "jetworker_paused", { consumer }) === 0,
          { timeout: "10 seconds", interval: "100 millis" }
        ).pipe(Effect.catchTag("WaitTimeout", (e) =>
          Effect.flatMap(worker.get("/metrics"), (r) =>
            Effect.die(new Error(`${e.message}\n${r.body.split("\n").filter((l) => /in_flight|held|paused/.test(l)).join("\n")}`)))
        ))
        const reported = yield* W.outcomes(worker)
        const byTag = new Map<string, number>()
        for (const o of reported) byTag.set(o.tag, (byTag.get(o.tag) ?? 0) + 1)
        const scraped = Object.fromEntries(
          idle.filter((s) => s.name === "jetworker_outcomes" && s.labels.consumer === consumer && s.value > 0).map((s) => [s.labels.outcome, s.value])
        )
        assert.deepStrictEqual(scraped, Object.fromEntries(byTag), `reported: ${JSON.stringify(reported)}`)

        // Draining: a slow transfer in flight, SIGTERM; readiness 503 phase stopping, live 200, in_flight 1.
        const slow = `${p}.slow`
        yield* W.makeSlow(slow, 2_500)
        yield* stream.publish("eur", transfer(slow, a, b, 1_00), slow)
        yield* W.waitReceived(worker, slow)
        yield* worker.child.kill("SIGTERM")
        const draining = yield* Eventually.poll("readiness 503 at the signal", worker.get("/healthz/ready"), (r) => r.status === 503, {
          timeout: "2 seconds",
          interval: "20 millis"
        })
        assert.strictEqual((JSON.parse(draining.body) as ReadyBody).phase, "stopping", draining.body)
        assert.strictEqual((yield* worker.get("/healthz/live")).status, 200)
        const drainingMetrics = parsePrometheusText((yield* worker.get("/metrics")).body)
        assert.strictEqual(value(drainingMetrics, "jetworker_in_flight", { consumer }), 1)
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const outcomes = yield* W.outcomes(worker)
        assert.isTrue(outcomes.some((o) => o.eventId === slow && o.tag === "Committed"), JSON.stringify(outcomes))

        // Every line the process wrote: one JSON object with the fixed keys, nothing on stderr.
        const lines = yield* worker.child.lines
        const notJson = lines.filter((l) => !isFixtureLine(l)).filter((l) => {
          try {
            const v = JSON.parse(l) as Record<string, unknown>
            return typeof v !== "object" || v === null || typeof v.timestamp !== "string" || typeof v.level !== "string" ||
              typeof v.message !== "string"
          } catch {
            return true
          }
        })
        assert.deepStrictEqual(notJson, [])
        assert.deepStrictEqual(lines.filter((l) => l.includes("[object Object]")), [])
        assert.deepStrictEqual(yield* worker.child.stderr, [])
        const logs = yield* worker.logs
        assert.strictEqual(logs.filter((l) => l.event === "dependency.down" && l.dependency === "postgres").length, 1)
        assert.strictEqual(logs.filter((l) => l.event === "dependency.up" && l.dependency === "postgres").length, 1)
      }).pipe(Effect.scoped))
  })
})

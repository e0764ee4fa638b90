import { assert, describe, it } from "@effect/vitest"
import { ConfigCheck } from "@jetworker/cli"
import { Duration, Effect } from "effect"

/** A Deployment with one container; `env`, probes and grace as given. */
const manifest = (options: {
  readonly env?: Record<string, string>
  readonly grace?: number
  readonly readiness?: string
  readonly liveness?: string
  readonly preStop?: string
}) => `
apiVersion: v1
kind: Service
metadata:
  name: other
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: w
spec:
  template:
    spec:
${options.grace === undefined ? "" : `      terminationGracePeriodSeconds: ${options.grace}\n`}      containers:
        - name: worker
          ports:
            - name: health
              containerPort: 8080
          env:
${Object.entries(options.env ?? {}).map(([k, v]) => `            - name: ${k}\n              value: "${v}"`).join("\n")}
            - name: SECRET
              valueFrom:
                secretKeyRef: { name: s, key: k }
${options.readiness ?? `          readinessProbe:
            httpGet: { path: /healthz/ready, port: health }
            periodSeconds: 1
            failureThreshold: 1`}
${options.liveness ?? `          livenessProbe:
            httpGet: { path: /healthz/live, port: 8080 }`}
${options.preStop ?? ""}
`

const levels = (report: ConfigCheck.Report) => Object.fromEntries(report.findings.map((f) => [f.check, f.level]))

describe("ConfigCheck", () => {
  it.effect("BE-SHUT-002: the configuration check passes when application, probe and orchestrator timings agree", () =>
    Effect.gen(function*() {
      const report = yield* ConfigCheck.check({
        manifest: manifest({ grace: 30, env: { SHUTDOWN_READINESS_GRACE: "2 seconds" } }),
        ackWait: Duration.seconds(30)
      })
      assert.deepStrictEqual(levels(report), {
        settings: "ok",
        "budget-under-grace": "ok",
        "readiness-probe": "ok",
        "liveness-probe": "ok",
        "drain-under-ack-wait": "ok"
      })
      assert.isTrue(report.ok)
      assert.strictEqual(report.workload, "Deployment/w")
    }))

  it.effect("BE-SHUT-004: the configuration check finds a budget that does not fit the orchestrator's kill deadline, defaults included", () =>
    Effect.gen(function*() {
      // No terminationGracePeriodSeconds: Kubernetes' 30 s; a 10 s preStop sleep plus the 25 s default budget.
      const report = yield* ConfigCheck.check({
        manifest: manifest({ preStop: `          lifecycle:\n            preStop:\n              exec:\n                command: ["sh", "-c", "sleep 10"]` }),
        ackWait: Duration.seconds(30)
      })
      assert.strictEqual(levels(report)["budget-under-grace"], "error")
      assert.match(report.findings.find((f) => f.check === "budget-under-grace")!.message, /10 s \+ SHUTDOWN_BUDGET 25 s = 35 s >= terminationGracePeriodSeconds 30 s \(default\)/)
      assert.isFalse(report.ok)
    }))

  it.effect("a readiness grace shorter than the probe needs to notice, or probes on the wrong path or port, are errors", () =>
    Effect.gen(function*() {
      const slowProbe = yield* ConfigCheck.check({
        manifest: manifest({
          grace: 40,
          readiness: `          readinessProbe:\n            httpGet: { path: /healthz/ready, port: health }`
        })
      })
      assert.strictEqual(levels(slowProbe)["readiness-probe"], "error", "defaults 10 s x 3 > 1 s grace")
      const wrong = yield* ConfigCheck.check({
        manifest: manifest({
          grace: 40,
          env: { HEALTH_PORT: "9090" },
          liveness: `          livenessProbe:\n            httpGet: { path: /health, port: 9090 }`
        })
      })
      assert.deepInclude(levels(wrong), { "readiness-probe": "error", "liveness-probe": "error" })
    }))

  it.effect("a drain that outlives the AckWait is an error; an unknown AckWait or a setting from a secret is a warning", () =>
    Effect.gen(function*() {
      const long = yield* ConfigCheck.check({
        manifest: manifest({ grace: 40, env: { ACK: "10 seconds" } }),
        ackWaitEnv: "ACK"
      })
      assert.strictEqual(levels(long)["drain-under-ack-wait"], "error")
      assert.match(long.findings.find((f) => f.check === "drain-under-ack-wait")!.message, /19 s > AckWait 10 s/)
      const unknown = yield* ConfigCheck.check({ manifest: manifest({ grace: 40 }) })
      assert.strictEqual(levels(unknown)["drain-under-ack-wait"], "warning")
      assert.isTrue(unknown.ok, "warnings alone pass")
      const secret = yield* ConfigCheck.check({ manifest: manifest({ grace: 40 }).replace("name: SECRET", "name: SHUTDOWN_BUDGET") })
      assert.isTrue(secret.findings.some((f) => f.level === "warning" && f.message.includes("SHUTDOWN_BUDGET comes from valueFrom")))
    }))

  // Before: "-5 seconds" read as "AckWait -5 s" (a drain never fits a negative lease) and
  // "Infinity" passed, though no consumer has such an AckWait.
  it.effect("an AckWait that is not a positive, finite duration is an error naming the variable and the value", () =>
    Effect.gen(function*() {
      for (const value of ["-5 seconds", "0 seconds", "Infinity", "soon"]) {
        const report = yield* ConfigCheck.check({ manifest: manifest({ grace: 40, env: { ACK: value } }), ackWaitEnv: "ACK" })
        assert.strictEqual(levels(report)["drain-under-ack-wait"], "error", value)
        assert.strictEqual(
          report.findings.find((f) => f.check === "drain-under-ack-wait")!.message,
          `ACK = ${JSON.stringify(value)} is not a positive, finite duration (e.g. "30 seconds")`
        )
      }
    }))

  it.effect("settings that do not parse or do not fit are errors that name the setting", () =>
    Effect.gen(function*() {
      const bad = yield* ConfigCheck.check({ manifest: manifest({ grace: 40, env: { SHUTDOWN_BUDGET: "soon" } }) })
      assert.isFalse(bad.ok)
      assert.match(bad.findings[0]!.message, /SHUTDOWN_BUDGET/)
      const tight = yield* ConfigCheck.check({ manifest: manifest({ grace: 40, env: { SHUTDOWN_BUDGET: "5 seconds" } }) })
      assert.match(tight.findings.find((f) => f.level === "error")!.message, /leaves no drain share/)
    }))

  it.effect("a manifest without a workload, or without the named container, cannot be checked", () =>
    Effect.gen(function*() {
      const none = yield* ConfigCheck.check({ manifest: "kind: Service\nmetadata: { name: s }\n" }).pipe(Effect.flip)
      assert.match(none.message, /no Deployment or StatefulSet/)
      const missing = yield* ConfigCheck.check({ manifest: manifest({}), container: "sidecar" }).pipe(Effect.flip)
      assert.match(missing.message, /no container "sidecar" \(it has "worker"\)/)
    }))
})

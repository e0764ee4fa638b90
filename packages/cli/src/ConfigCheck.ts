/**
 * Checks a worker's shutdown and probe settings against the orchestrator's manifest that runs
 * it (a Kubernetes Deployment or StatefulSet), so that the application's, the probes' and the
 * orchestrator's timings agree (BE-SHUT-002, BE-SHUT-004). The settings are read from the
 * container's environment in the manifest as the worker reads them (`Worker.readSettings`: its
 * defaults, its checks), so a setting left out is checked at the value the process would really
 * use, and a variable set twice at its last entry, as the pod does.
 *
 * The checks, each `ok`, `warning` or `error` with the numbers that decided it:
 *
 * - `settings`: the worker would start with the settings: every check `Worker.run` makes on them
 *   (`Worker.readSettings`), each refusal an error worded as the worker's `worker.invalid_settings`
 *   line (the variable and the value given); with any, the other checks are not made;
 * - `budget-under-grace`: preStop hook + `SHUTDOWN_BUDGET` stay below
 *   `terminationGracePeriodSeconds` (default 30), so the process exits before the forced kill
 *   (the budget's reserve is the margin inside it);
 * - `readiness-probe`: the readiness probe asks `/healthz/ready` on `HEALTH_PORT`, and the
 *   readiness grace lasts at least `periodSeconds × failureThreshold` (defaults 10 × 3), so the
 *   orchestrator sees the pod unready before it goes away;
 * - `liveness-probe`: the liveness probe, when there is one, asks `/healthz/live` on `HEALTH_PORT`
 *   (none is a warning);
 * - `drain-under-ack-wait`: the drain share (running work may finish until readiness grace +
 *   drain after the signal) ends within the consumer's AckWait, so work still running at the end
 *   of the drain is cut before the broker could hand its message to another instance.
 *
 * It reads and computes only: no cluster API, no broker.
 *
 * @since 0.1.0
 */
import { Worker } from "@jetworker/node"
import { ConfigProvider, Data, Duration, Effect, Result } from "effect"
import * as Yaml from "effect/encoding/Yaml"

/** How one check ended. */
export type Level = "ok" | "warning" | "error"

/** One check's result. */
export interface Finding {
  readonly check: string
  readonly level: Level
  readonly message: string
}

/** What was checked and what was found. */
export interface Report {
  readonly workload: string
  readonly container: string
  readonly findings: ReadonlyArray<Finding>
  /** Whether no finding is an error. */
  readonly ok: boolean
}

/** The manifest could not be read as a workload with the container asked for. */
export class ManifestError extends Data.TaggedError("ManifestError")<{ readonly message: string }> {}

/** What to check. */
export interface Options {
  /** The manifest's text: YAML, one or more documents separated by `---`. */
  readonly manifest: string
  /** The container that runs the worker. Default: the workload's only container. */
  readonly container?: string | undefined
  /** The consumer's AckWait, when known from elsewhere (the contract, the live consumer). */
  readonly ackWait?: Duration.Duration | undefined
  /** The container's environment variable that holds the AckWait (e.g. `LEDGER_ACK_WAIT`). */
  readonly ackWaitEnv?: string | undefined
}

type Json = Record<string, unknown>

const isObject = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const at = (value: unknown, ...path: Array<string>): unknown => {
  let current = value
  for (const key of path) {
    if (!isObject(current)) return undefined
    current = current[key]
  }
  return current
}

const documents = (text: string): Array<unknown> =>
  text.split(/^---[ \t]*$/m).map((part) => part.trim()).filter((part) => part !== "" && !/^(#.*\s*)+$/.test(part))
    .map((part) => Yaml.parse(part))

interface Probe {
  readonly path: string | undefined
  readonly port: number | string | undefined
  readonly periodSeconds: number
  readonly failureThreshold: number
}

const probeOf = (container: Json, name: string): Probe | undefined => {
  const probe = container[name]
  if (!isObject(probe)) return undefined
  const path = at(probe, "httpGet", "path")
  const port = at(probe, "httpGet", "port")
  const period = probe.periodSeconds
  const failures = probe.failureThreshold
  return {
    path: typeof path === "string" ? path : undefined,
    port: typeof port === "number" || typeof port === "string" ? port : undefined,
    periodSeconds: typeof period === "number" ? period : 10,
    failureThreshold: typeof failures === "number" ? failures : 3
  }
}

/** The seconds a preStop hook that runs `sleep N` (exec or the native sleep action) waits. */
const preStopSeconds = (container: Json): number => {
  const native = at(container, "lifecycle", "preStop", "sleep", "seconds")
  if (typeof native === "number") return native
  const command = at(container, "lifecycle", "preStop", "exec", "command")
  if (Array.isArray(command)) {
    const match = /sleep\s+(\d+(?:\.\d+)?)/.exec(command.map(String).join(" "))
    if (match !== null) return Number(match[1])
  }
  return 0
}

const seconds = (millis: number) => `${Math.round(millis) / 1000} s`

/** Runs every check on `options.manifest`. */
export const check = (options: Options): Effect.Effect<Report, ManifestError> =>
  Effect.gen(function*() {
    const docs = yield* Effect.try({
      try: () => documents(options.manifest),
      catch: (error) => new ManifestError({ message: `the manifest is not YAML: ${String(error)}` })
    })
    const workload = docs.find((doc) => {
      const kind = at(doc, "kind")
      return kind === "Deployment" || kind === "StatefulSet"
    })
    if (workload === undefined) {
      return yield* new ManifestError({ message: "the manifest holds no Deployment or StatefulSet" })
    }
    const workloadName = `${String(at(workload, "kind"))}/${String(at(workload, "metadata", "name") ?? "?")}`
    const pod = at(workload, "spec", "template", "spec")
    const containers = (at(pod, "containers") ?? []) as Array<unknown>
    const candidates = containers.filter(isObject)
    const container = options.container === undefined
      ? (candidates.length === 1 ? candidates[0] : undefined)
      : candidates.find((c) => c.name === options.container)
    if (container === undefined) {
      return yield* new ManifestError({
        message: options.container === undefined
          ? `${workloadName} has ${candidates.length} containers; name the worker's with --container`
          : `${workloadName} has no container ${JSON.stringify(options.container)} (it has ${
            candidates.map((c) => JSON.stringify(c.name)).join(", ")
          })`
      })
    }
    const containerName = String(container.name ?? "?")
    const findings: Array<Finding> = []
    const add = (check: string, level: Level, message: string) => findings.push({ check, level, message })

    // The container's literal environment; values from secrets or config maps cannot be read here.
    // A name given twice takes its last entry, as in the pod (the API server warns that it "hides
    // previous definition").
    const env: Record<string, string> = {}
    const seen = new Set<string>()
    for (const entry of (Array.isArray(container.env) ? container.env : []) as Array<unknown>) {
      if (!isObject(entry) || typeof entry.name !== "string") continue
      const checked = /^(SHUTDOWN_|HEALTH_|STARTUP_|LOG_LEVEL$|LOG_BUFFER_BYTES$)/.test(entry.name) ||
        entry.name === options.ackWaitEnv
      if (checked && seen.has(entry.name)) {
        add("settings", "warning", `${entry.name} is set more than once; its last entry, which the pod uses, is checked`)
      }
      seen.add(entry.name)
      delete env[entry.name]
      if (typeof entry.value === "string") env[entry.name] = entry.value
      else if (typeof entry.value === "number" || typeof entry.value === "boolean") env[entry.name] = String(entry.value)
      else if (checked) {
        add("settings", "warning", `${entry.name} comes from valueFrom and cannot be checked here; its default is assumed`)
      }
    }

    // The worker's own reading and checks, so that what it refuses at start cannot pass here.
    const read = yield* Effect.result(
      Worker.readSettings().pipe(Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env })))
    )
    if (Result.isFailure(read)) {
      for (const problem of read.failure.problems) {
        add("settings", "error", problem.nextStep === undefined ? problem.error : `${problem.error}; ${problem.nextStep}`)
      }
      return { workload: workloadName, container: containerName, findings, ok: false }
    }
    const { budget: b, settings } = read.success
    add(
      "settings",
      "ok",
      `budget ${seconds(b.totalMillis)}: readiness grace ${seconds(b.readinessGraceMillis)}, drain ${
        seconds(b.drainMillis)
      }, close ${seconds(b.closeMillis)}, telemetry ${seconds(b.telemetryMillis)}, reserve ${seconds(b.reserveMillis)}`
    )

    // The orchestrator's kill deadline.
    const grace = at(pod, "terminationGracePeriodSeconds")
    const graceMillis = (typeof grace === "number" ? grace : 30) * 1000
    const preStopMillis = preStopSeconds(container) * 1000
    const needed = preStopMillis + b.totalMillis
    add(
      "budget-under-grace",
      needed < graceMillis ? "ok" : "error",
      `preStop ${seconds(preStopMillis)} + SHUTDOWN_BUDGET ${seconds(b.totalMillis)} = ${seconds(needed)} ${
        needed < graceMillis ? "<" : ">="
      } terminationGracePeriodSeconds ${seconds(graceMillis)}${typeof grace === "number" ? "" : " (default)"}${
        needed < graceMillis ? "" : ": the process would be killed before its shutdown ends"
      }`
    )

    const healthPort = settings.healthPort
    const portMatches = (probe: Probe) => {
      if (healthPort === "off") return false
      if (typeof probe.port === "number") return probe.port === healthPort
      const named = ((container.ports ?? []) as Array<unknown>).find((p) => isObject(p) && p.name === probe.port)
      return isObject(named) && named.containerPort === healthPort
    }

    const readiness = probeOf(container, "readinessProbe")
    if (readiness === undefined) {
      add("readiness-probe", "error", "the container has no readinessProbe; nothing would see the shutdown start")
    } else if (readiness.path !== "/healthz/ready" || !portMatches(readiness)) {
      add(
        "readiness-probe",
        "error",
        `the readinessProbe asks ${readiness.path ?? "(no httpGet path)"} on port ${String(readiness.port)}; ` +
          `the worker serves /healthz/ready on HEALTH_PORT ${String(healthPort)}`
      )
    } else {
      const observe = readiness.periodSeconds * readiness.failureThreshold * 1000
      add(
        "readiness-probe",
        b.readinessGraceMillis >= observe ? "ok" : "error",
        `SHUTDOWN_READINESS_GRACE ${seconds(b.readinessGraceMillis)} ${b.readinessGraceMillis >= observe ? ">=" : "<"} ` +
          `periodSeconds ${readiness.periodSeconds} x failureThreshold ${readiness.failureThreshold} = ${seconds(observe)}` +
          (b.readinessGraceMillis >= observe ? "" : ": the pod may go away before it is seen unready")
      )
    }

    const liveness = probeOf(container, "livenessProbe")
    if (liveness === undefined) {
      add("liveness-probe", "warning", "the container has no livenessProbe; a wedged worker would not be restarted")
    } else if (liveness.path !== "/healthz/live" || !portMatches(liveness)) {
      add(
        "liveness-probe",
        "error",
        `the livenessProbe asks ${liveness.path ?? "(no httpGet path)"} on port ${String(liveness.port)}; ` +
          `the worker serves /healthz/live on HEALTH_PORT ${String(healthPort)}`
      )
    } else {
      add("liveness-probe", "ok", `the livenessProbe asks /healthz/live on port ${String(healthPort)}`)
    }

    const ackWaitRaw = options.ackWaitEnv === undefined ? undefined : env[options.ackWaitEnv]
    const parsed = ackWaitRaw === undefined ? undefined : Duration.fromInput(ackWaitRaw as Duration.Input)
    const ackMillis = parsed !== undefined
      ? (parsed._tag === "Some" ? Duration.toMillis(parsed.value) : Number.NaN)
      : options.ackWait === undefined
      ? undefined
      : Duration.toMillis(options.ackWait)
    const drainEnd = b.readinessGraceMillis + b.drainMillis
    if (ackMillis === undefined) {
      add(
        "drain-under-ack-wait",
        "warning",
        `the consumer's AckWait is unknown (give --ack-wait, or --ack-wait-env naming the container's variable)`
      )
    } else if (!(ackMillis > 0) || !Number.isFinite(ackMillis)) {
      // A lease is positive and finite: a negative one would read as a drain that never fits, and
      // an infinite one as a drain that always does.
      add(
        "drain-under-ack-wait",
        "error",
        `${options.ackWaitEnv ?? "--ack-wait"} = ${ackWaitRaw !== undefined ? JSON.stringify(ackWaitRaw) : `${ackMillis} ms`} ` +
          `is not a positive, finite duration (e.g. "30 seconds")`
      )
    } else {
      add(
        "drain-under-ack-wait",
        drainEnd <= ackMillis ? "ok" : "error",
        `readiness grace + drain = ${seconds(drainEnd)} ${drainEnd <= ackMillis ? "<=" : ">"} AckWait ${seconds(ackMillis)}` +
          (drainEnd <= ackMillis ? "" : ": work could outlive its lease on a broker that stopped answering")
      )
    }

    return { workload: workloadName, container: containerName, findings, ok: findings.every((f) => f.level !== "error") }
  })

/** The report as text for a person: one line per finding. */
export const format = (report: Report): string => {
  const mark: Record<Level, string> = { ok: "ok   ", warning: "WARN ", error: "ERROR" }
  const width = Math.max(...report.findings.map((f) => f.check.length))
  return [
    `config check of ${report.workload}, container ${report.container}:`,
    ...report.findings.map((f) => `  ${mark[f.level]} ${f.check.padEnd(width)}  ${f.message}`),
    report.ok ? "the settings agree with the manifest" : "the settings DISAGREE with the manifest"
  ].join("\n")
}

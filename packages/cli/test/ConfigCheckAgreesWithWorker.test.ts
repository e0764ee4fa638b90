/**
 * `jetworker config check` refuses what the worker refuses: a setting `Worker.run` stops at
 * (exit 1, one `worker.invalid_settings` line) is a `settings` error in the check, worded as the
 * worker's line, so CI cannot approve a pod that cannot start.
 *
 * Before: the check only read `Worker.settings` and ran `Lifecycle.makeBudget`, so
 * `HEALTH_HOST=0.0.0.0:8080`, `STARTUP_TIMEOUT=0 seconds`, `LOG_BUFFER_BYTES=1000` and
 * `HEALTH_MAX_EVENT_LOOP_LAG=0 seconds` passed it ("the settings agree with the manifest", exit 0)
 * while the worker refused them; `HEALTH_PORT=abc` came out as probe errors on "HEALTH_PORT NaN";
 * a value that did not parse read `ConfigError(SchemaError(...))`. Both now go through
 * `Worker.readSettings`.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigCheck } from "@jetworker/cli"
import { Worker } from "@jetworker/node"
import { ConfigProvider, Effect } from "effect"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"

const reference = readFileSync(
  fileURLToPath(new URL("../../../examples/ledger/deploy/deployment.yaml", import.meta.url)),
  "utf8"
)

/** The reference manifest with `name` set to `value`: its entry replaced, or one added. */
const manifestWith = (name: string, value: string): string => {
  const entry = new RegExp(`(- name: ${name}\\n\\s+value: )"[^"]*"`)
  return entry.test(reference)
    ? reference.replace(entry, `$1"${value}"`)
    : reference.replace("          env:\n", `          env:\n            - name: ${name}\n              value: "${value}"\n`)
}

/** The reference container's literal environment (the worker's settings in it), and `name=value`. */
const referenceEnv = (name: string, value: string): Record<string, string> => ({
  SHUTDOWN_BUDGET: "25 seconds",
  SHUTDOWN_READINESS_GRACE: "3 seconds",
  SHUTDOWN_CLOSE: "3 seconds",
  SHUTDOWN_TELEMETRY: "2 seconds",
  SHUTDOWN_RESERVE: "1 second",
  STARTUP_TIMEOUT: "60 seconds",
  HEALTH_PORT: "8080",
  [name]: value
})

/** Runs `effect` with `process.stdout.write` captured; returns its result and the JSON lines written. */
const capturingStdout = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const original = process.stdout.write
      const chunks: Array<string> = []
      process.stdout.write = ((chunk: string | Uint8Array, ...rest: Array<unknown>) => {
        chunks.push(typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8"))
        const callback = rest.find((arg) => typeof arg === "function") as (() => void) | undefined
        if (callback !== undefined) queueMicrotask(callback)
        return true
      }) as typeof process.stdout.write
      return { original, chunks }
    }),
    ({ chunks }) =>
      Effect.map(effect, (result) => ({
        result,
        lines: chunks.join("").split("\n").filter((line) => line !== "").map((line) => JSON.parse(line) as Record<string, unknown>)
      })),
    ({ original }) => Effect.sync(() => void (process.stdout.write = original))
  )

/** The worker's refusal of `env`: exit 1 and exactly one `worker.invalid_settings` line, as the check words it. */
const workerRefusal = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const { lines, result } = yield* capturingStdout(
      Worker.run(Effect.void).pipe(Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env })))
    )
    const refused = lines.filter((line) => line.message === "worker.invalid_settings")
    assert.strictEqual(result, Worker.exitCodes.failure, JSON.stringify(lines))
    assert.strictEqual(refused.length, 1, JSON.stringify(lines))
    const { error, nextStep } = refused[0]!
    return nextStep === undefined ? String(error) : `${String(error)}; ${String(nextStep)}`
  })

describe("jetworker config check agrees with the worker's own refusals", () => {
  for (
    const [name, value, shown] of [
      ["HEALTH_HOST", "0.0.0.0:8080", `"0.0.0.0:8080"`],
      ["STARTUP_TIMEOUT", "0 seconds", `got "0 seconds"`],
      ["LOG_BUFFER_BYTES", "1000", `got "1000"`],
      ["LOG_BUFFER_BYTES", "abc", `got "abc"`],
      ["HEALTH_MAX_EVENT_LOOP_LAG", "0 seconds", `got "0 seconds"`],
      ["HEALTH_MAX_EVENT_LOOP_LAG", "Infinity", `got "Infinity"`],
      ["HEALTH_PORT", "abc", `got "abc"`],
      ["HEALTH_PORT", "70000", `got "70000"`],
      ["SHUTDOWN_BUDGET", "soon", `got "soon"`],
      ["SHUTDOWN_BUDGET", "5 seconds", "SHUTDOWN_BUDGET"]
    ] as const
  ) {
    it.live(`${name}=${JSON.stringify(value)}: the worker refuses it, and the check reports the worker's line as a settings error`, () =>
      Effect.gen(function*() {
        const refusal = yield* workerRefusal(referenceEnv(name, value))
        assert.include(refusal, name, "the worker names the variable")
        assert.include(refusal, shown, "the worker names the value given")

        const report = yield* ConfigCheck.check({ manifest: manifestWith(name, value), ackWaitEnv: "LEDGER_ACK_WAIT" })
        const errors = report.findings.filter((f) => f.level === "error")
        assert.isFalse(report.ok, ConfigCheck.format(report))
        assert.deepStrictEqual(errors, [{ check: "settings", level: "error", message: refusal }], ConfigCheck.format(report))
        assert.notInclude(ConfigCheck.format(report), "NaN")
        assert.include(ConfigCheck.format(report), "the settings DISAGREE with the manifest")
      }))
  }

  it.effect("every problem is reported, each as its own settings error, in the order the worker checks them", () =>
    Effect.gen(function*() {
      const manifest = manifestWith("HEALTH_HOST", "localhost:8080").replace(
        /(- name: STARTUP_TIMEOUT\n\s+value: )"[^"]*"/,
        `$1"0 seconds"`
      )
      const report = yield* ConfigCheck.check({ manifest, ackWaitEnv: "LEDGER_ACK_WAIT" })
      assert.deepStrictEqual(report.findings.map((f) => [f.check, f.level, f.message.split(" ")[0]]), [
        ["settings", "error", "HEALTH_HOST"],
        ["settings", "error", "STARTUP_TIMEOUT"]
      ])
    }))

  it.effect("a variable set twice is checked at its last entry, which the pod uses, with a warning", () =>
    Effect.gen(function*() {
      // An entry added before the reference's own STARTUP_TIMEOUT "60 seconds": hidden by it in the pod.
      const manifest = reference.replace(
        "          env:\n",
        `          env:\n            - name: STARTUP_TIMEOUT\n              value: "0 seconds"\n`
      )
      const report = yield* ConfigCheck.check({ manifest, ackWaitEnv: "LEDGER_ACK_WAIT" })
      assert.isTrue(report.ok, ConfigCheck.format(report))
      assert.deepInclude(report.findings, {
        check: "settings",
        level: "warning",
        message: "STARTUP_TIMEOUT is set more than once; its last entry, which the pod uses, is checked"
      })
    }))

  it.effect("the reference manifest's settings are the ones the worker starts with", () =>
    Effect.gen(function*() {
      const report = yield* ConfigCheck.check({ manifest: reference, ackWaitEnv: "LEDGER_ACK_WAIT" })
      assert.isTrue(report.ok, ConfigCheck.format(report))
      const read = yield* Worker.readSettings().pipe(
        Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: referenceEnv("LOG_LEVEL", "Info") }))
      )
      assert.strictEqual(read.budget.totalMillis, 25_000)
    }))
})

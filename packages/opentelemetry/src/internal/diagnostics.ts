/**
 * The OpenTelemetry SDK's diagnostics (a failed export) as `telemetry.error` lines: rate limited,
 * and without the credentials or header values they may quote.
 */
import { ErrorSummary } from "@jetworker/core"
import type { DiagLogger } from "@opentelemetry/api"
import { type Context, Effect, Redacted } from "effect"
import type { Headers } from "./headers.ts"

// The SDK reports failed exports through its diagnostic logger. Its lines go to the loggers in
// effect where this layer is built (under `Worker.runMain`, the stdout JSON logger filtered by
// LOG_LEVEL), never to the loggers this layer adds (the OTLP log exporter, which may be the one
// failing), rate limited, and without the credentials of any URL they quote or the value of any
// OTLP header (`secrets`): a collector's error body may quote the API key it refused.
const MAX_ERRORS_PER_MINUTE = 10
export const boundedDiagLogger = (context: Context.Context<never>, secrets: ReadonlyArray<string>): DiagLogger => {
  const log = (effect: Effect.Effect<void>) => void Effect.runForkWith(context)(effect)
  let windowStart = 0
  let written = 0
  let suppressed = 0
  const write = (level: "Error" | "Warn") => (message: string, ...args: Array<unknown>) => {
    const now = Date.now()
    if (now - windowStart >= 60_000) {
      if (suppressed > 0) log(Effect.logWarning("telemetry.error").pipe(Effect.annotateLogs({ suppressed })))
      windowStart = now
      written = 0
      suppressed = 0
    }
    if (written >= MAX_ERRORS_PER_MINUTE) {
      suppressed++
      return
    }
    written++
    const detail = args.map((a) => (a instanceof Error ? a.message : typeof a === "string" ? a : safeJson(a))).join(" ")
    // Redacted before the cut, so no part of a secret is left at the end.
    const error = ErrorSummary.withoutCredentials(redactIn(`${message} ${detail}`.trim(), secrets)).slice(0, 1_000)
    log((level === "Error" ? Effect.logError : Effect.logWarning)("telemetry.error").pipe(Effect.annotateLogs({ error })))
  }
  const ignore = () => undefined
  return { error: write("Error"), warn: write("Warn"), info: ignore, debug: ignore, verbose: ignore }
}

/**
 * The forms a header value can take in a diagnostic: as sent, percent-encoded (as configured), and
 * escaped once or twice in JSON (an error body inside a serialised error). Values under 4
 * characters are left alone: they are no secret, and replacing them would garble every line.
 */
export const secretForms = (headers: ReadonlyArray<Headers | undefined>): ReadonlyArray<string> => {
  const forms = new Set<string>()
  for (const set of headers) {
    for (const secret of Object.values(set ?? {})) {
      const value = Redacted.value(secret)
      if (value.length < 4) continue
      const once = JSON.stringify(value).slice(1, -1)
      for (const form of [value, encodeURIComponent(value), once, JSON.stringify(once).slice(1, -1)]) forms.add(form)
    }
  }
  // Longest first: a form containing another is replaced whole.
  return [...forms].sort((a, b) => b.length - a.length)
}

export const redactIn = (text: string, secrets: ReadonlyArray<string>): string =>
  secrets.reduce((out, secret) => out.split(secret).join("<redacted>"), text)

const safeJson = (value: unknown): string => {
  try {
    return JSON.stringify(value)
  } catch {
    return String(value)
  }
}

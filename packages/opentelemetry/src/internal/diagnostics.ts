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
    const detail = args.map(detailOf).join(" ")
    // Redacted before the cut, so no part of a secret is left at the end.
    const text = oneLine(`${textOf(message)} ${detail}`)
    const error = ErrorSummary.withoutCredentials(redactIn(text, secrets)).slice(0, 1_000)
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

// A diagnostic is an operator's log line: the message, code and data of the error it quotes, on
// one line, never a stack trace (many lines of frames that say nothing about the export). The SDK
// hands over errors (OTLPExporterError, with `code` and `data`), error-like objects, and its
// default error handler's JSON of an error, `stack` included.

/** One argument of a diagnostic as text: an error by its message and fields, an object as JSON, stacks left out. */
const detailOf = (value: unknown): string => {
  try {
    if (typeof value === "string") return textOf(value)
    if (value instanceof Error) {
      const fields = errorFields(value, false)
      return Object.keys(fields).length === 0 ? value.message : `${value.message} ${safeJson(fields)}`
    }
    return safeJson(value)
  } catch {
    // A hostile value (a getter or proxy trap that throws): nothing more can be said of it safely.
    return "[unreadable]"
  }
}

/** `text`, or, when it is an error serialised as JSON (the SDK's default error handler's), that JSON without stacks. */
const textOf = (text: string): string => {
  if (!/^\s*[{[]/.test(text)) return text
  try {
    return safeJson(JSON.parse(text))
  } catch {
    return text
  }
}

/**
 * What JSON shows of an `Error`, which it would show as `{}`: its message (when asked), own fields
 * (an OTLPExporterError's `code` and `data`) and cause, never its stack or name.
 */
const errorFields = (error: Error, withMessage: boolean): Record<string, unknown> => {
  const fields: Record<string, unknown> = withMessage ? { message: error.message } : {}
  for (const key of Object.keys(error)) {
    if (key !== "stack" && key !== "message" && key !== "name") fields[key] = (error as unknown as Record<string, unknown>)[key]
  }
  if (error.cause !== undefined) fields.cause = error.cause
  return fields
}

/** `value` as JSON without any `stack`, at any depth, and with the errors in it shown by {@link errorFields}. */
const safeJson = (value: unknown): string => {
  const seen = new Set<Error>()
  try {
    return JSON.stringify(value, (key, field: unknown) => {
      // A stack, and the source of an error's class (the SDK's JSON of an error copies inherited
      // properties, `constructor` among them), say nothing about the export.
      if (key === "stack" || key === "constructor") return undefined
      if (field instanceof Error) {
        // An error that is its own cause, or its cause's, is shown once.
        if (seen.has(field)) return "[Circular]"
        seen.add(field)
        return errorFields(field, true)
      }
      return field
    }) ?? String(value)
  } catch {
    try {
      return String(value)
    } catch {
      return "[unreadable]"
    }
  }
}

/** A V8 stack frame (`\n    at f (file.js:1:1)`), as written and as escaped in a JSON string. */
const STACK_FRAME = /\r?\n[ \t]+at [^\r\n]*|(?:\\r)?\\n[ \t]+at (?:[^"\\]|\\[^nr])*/g
const LINE_BREAK = /\s*[\r\n\u2028\u2029]+\s*/g

/** `text` on one line: stack frames quoted in it dropped, line breaks made blanks. */
const oneLine = (text: string): string => text.replace(STACK_FRAME, "").replace(LINE_BREAK, " ").trim()

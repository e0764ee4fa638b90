/**
 * The one log format of a worker process: one JSON object per line on stdout, with a fixed set of
 * top-level keys and the log annotations flattened beside them, so an operator reads every
 * outcome, lifecycle event and error with `jq` and without the source code:
 *
 * ```json
 * {"timestamp":"2026-11-30T12:00:00.000Z","level":"INFO","message":"shutdown.completed","result":"success","durationMs":812}
 * ```
 *
 * - `timestamp` (ISO 8601, UTC), `level` (`DEBUG`, `INFO`, `WARN`, `ERROR`, `FATAL`) and
 *   `message` (a string) are always there;
 * - every log annotation becomes a key of its own (one that would shadow a key of this list is
 *   written as `annotation.<key>`);
 * - `traceId` and `spanId`: the current span's, on lines written inside one (the handling of a
 *   delivery, a publish);
 * - `details`: the further arguments of a log call, when there are any;
 * - `cause`: the pretty-printed cause, when the line carries one.
 *
 * `Redacted` values print as `<redacted>`; bigints as strings. It deliberately adds no fiber id;
 * lines written outside any span (the lifecycle events) carry no trace or span id.
 *
 * @since 0.2.0
 */
import { Cause, Context, Layer, Logger, Redacted, References, Tracer } from "effect"
import * as LifecycleEvents from "./internal/lifecycleEvents.ts"

const RESERVED = new Set(["timestamp", "level", "message", "traceId", "spanId", "details", "cause"])

const replacer = (_key: string, value: unknown): unknown => {
  if (typeof value === "bigint") return value.toString()
  if (Redacted.isRedacted(value)) return "<redacted>"
  if (value instanceof Error) return { name: value.name, message: value.message }
  return value
}

const stringify = (value: unknown): string => {
  try {
    return JSON.stringify(value, replacer)
  } catch {
    return JSON.stringify(String(value))
  }
}

const text = (value: unknown): string =>
  typeof value === "string" ? value : Redacted.isRedacted(value) ? "<redacted>" : stringify(value)

const LEVEL: Record<string, string> = {
  All: "ALL",
  Trace: "TRACE",
  Debug: "DEBUG",
  Info: "INFO",
  Warn: "WARN",
  Warning: "WARN",
  Error: "ERROR",
  Fatal: "FATAL",
  None: "NONE"
}

/** Formats one log call as a JSON line (without the newline). */
export const formatter: Logger.Logger<unknown, string> = Logger.make(({ cause, date, fiber, logLevel, message }) => {
  const parts = Array.isArray(message) ? message : [message]
  const line: Record<string, unknown> = {
    timestamp: date.toISOString(),
    level: LEVEL[logLevel] ?? String(logLevel).toUpperCase(),
    message: parts.length === 0 ? "" : text(parts[0])
  }
  const annotations = fiber.getRef(References.CurrentLogAnnotations)
  for (const key of Object.keys(annotations)) {
    line[RESERVED.has(key) ? `annotation.${key}` : key] = annotations[key]
  }
  // The current span, if any: lines written while a delivery is processed carry its trace.
  const span = Context.getOption(fiber.context, Tracer.ParentSpan)
  if (span._tag === "Some") {
    line.traceId = span.value.traceId
    line.spanId = span.value.spanId
  }
  if (parts.length > 1) line.details = parts.length === 2 ? parts[1] : parts.slice(1)
  if (cause.reasons.length > 0) line.cause = Cause.pretty(cause)
  return stringify(line)
})

/** Bytes of lines held for stdout at most, by default: 8 MiB (see {@link make}). */
export const defaultMaxBufferedBytes = 8 * 1024 * 1024

/** Options of {@link make}. */
export interface Options {
  /**
   * Bytes of lines the process holds for stdout at most, from 64 KiB: past it, new lines are
   * dropped (and counted) until the reader catches up. Default: {@link defaultMaxBufferedBytes}.
   */
  readonly maxBufferedBytes?: number | undefined
}

/**
 * A logger writing each line to stdout. Writes to a pipe are asynchronous: a log reader that
 * stops reading would otherwise let the lines pile up in memory without end. So past
 * `maxBufferedBytes` waiting for stdout, a new line is dropped and counted, and the first line
 * written once there is room again is a `log.dropped` warning with the count. The lifecycle
 * events are never dropped (see `LOG_LEVEL` in `Worker`).
 */
export const make = (options: Options = {}): Logger.Logger<unknown, void> => {
  const limit = options.maxBufferedBytes ?? defaultMaxBufferedBytes
  let dropped = 0
  return Logger.make((options) => {
    const stdout = process.stdout
    // The lifecycle events pass whatever the backlog: few, and the operator's record of the
    // process (exactly one shutdown.started and one shutdown.completed, BE-SHUT-007).
    if (stdout.writableLength >= limit && !LifecycleEvents.isLifecycleEvent(options)) {
      dropped++
      return
    }
    const line = formatter.log(options)
    if (dropped > 0) {
      stdout.write(`${stringify({ timestamp: new Date().toISOString(), level: "WARN", message: "log.dropped", dropped, maxBufferedBytes: limit })}\n`)
      dropped = 0
    }
    stdout.write(`${line}\n`)
  })
}

/** {@link make} with the default bound. */
export const logger: Logger.Logger<unknown, void> = make()

/** Replaces the default loggers with {@link logger}. */
export const layer: Layer.Layer<never> = Logger.layer([logger])

/** Replaces the default loggers with a logger of {@link make}(`options`). */
export const layerWith = (options: Options): Layer.Layer<never> => Logger.layer([make(options)])

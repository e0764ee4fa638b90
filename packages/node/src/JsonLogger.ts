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
 * `Redacted` values print as `<redacted>`; bigints as strings; an `Error` as its name, message,
 * `code` (when it has one) and `cause`, without its stack; a value inside itself as
 * `[Circular]` where it recurs, and one whose `toJSON` (or getter) throws as
 * `[unserialisable: <reason>]`, so that a line is always one JSON object with its fixed keys and
 * every annotation. It deliberately adds no fiber id;
 * lines written outside any span (the lifecycle events) carry no trace or span id.
 *
 * @since 0.1.0
 */
import { Cause, Context, Layer, Logger, Redacted, References, Tracer } from "effect"
import * as LifecycleEvents from "./internal/lifecycleEvents.ts"

const RESERVED = new Set(["timestamp", "level", "message", "traceId", "spanId", "details", "cause"])

const replacer = (value: unknown): unknown => {
  if (typeof value === "bigint") return value.toString()
  if (Redacted.isRedacted(value)) return "<redacted>"
  if (value instanceof Error) {
    // The code (a driver's ECONNREFUSED, PostgreSQL's SQLSTATE) and the chain of causes say what
    // to do; the stack stays out of the line.
    const out: Record<string, unknown> = { name: value.name, message: value.message }
    const code: unknown = (value as { readonly code?: unknown }).code
    if (typeof code === "string" || typeof code === "number") out.code = code
    if (value.cause !== undefined) out.cause = value.cause
    return out
  }
  return value
}

const reasonOf = (error: unknown): string => {
  try {
    return error instanceof Error ? error.message : String(error)
  } catch {
    return "unknown"
  }
}

const unserialisable = (error: unknown): string => `[unserialisable: ${reasonOf(error)}]`

/**
 * `value` made safe for `JSON.stringify`, in the order `JSON.stringify` itself goes (`toJSON`,
 * then {@link replacer}, then the children): a value that is its own ancestor becomes
 * `"[Circular]"`, a `toJSON` or a getter that throws `"[unserialisable: <reason>]"`. Only ancestors
 * count, so a value shared by two keys is printed twice, as `JSON.stringify` would.
 */
const toJsonSafe = (value: unknown, key: string, ancestors: Set<object>): unknown => {
  let current = value
  if ((typeof current === "object" && current !== null) || typeof current === "bigint") {
    const toJSON: unknown = (current as { readonly toJSON?: unknown }).toJSON
    if (typeof toJSON === "function") {
      try {
        current = toJSON.call(current, key)
      } catch (error) {
        return unserialisable(error)
      }
    }
  }
  // The value itself counts as an ancestor too: the replacer gives an Error a new object each time.
  if (typeof value === "object" && value !== null && ancestors.has(value)) return "[Circular]"
  current = replacer(current)
  if (typeof current !== "object" || current === null) return current
  if (ancestors.has(current)) return "[Circular]"
  if (current instanceof Number || current instanceof String || current instanceof Boolean) return current.valueOf()
  const parent = current
  const original = typeof value === "object" && value !== null && value !== parent ? value : undefined
  ancestors.add(parent)
  if (original !== undefined) ancestors.add(original)
  try {
    if (Array.isArray(parent)) return parent.map((item: unknown, index) => toJsonSafe(item, String(index), ancestors))
    // No prototype: a `__proto__` key is data here, not a prototype to set.
    const out: Record<string, unknown> = Object.create(null)
    for (const child of Object.keys(parent)) {
      let item: unknown
      try {
        item = (parent as Record<string, unknown>)[child]
      } catch (error) {
        out[child] = unserialisable(error)
        continue
      }
      out[child] = toJsonSafe(item, child, ancestors)
    }
    return out
  } finally {
    ancestors.delete(parent)
    if (original !== undefined) ancestors.delete(original)
  }
}

/**
 * `JSON.stringify(value)` with cycles and throwing `toJSON`s written as markers; it throws only on
 * a structure too deep for the stack.
 */
const stringify = (value: unknown): string | undefined => {
  try {
    // The common case, as fast as `JSON.stringify` itself; the walk only for a line it refuses.
    return JSON.stringify(value, (_key, item: unknown) => replacer(item))
  } catch {
    return JSON.stringify(toJsonSafe(value, "", new Set()))
  }
}

const text = (value: unknown): string => {
  if (typeof value === "string") return value
  if (Redacted.isRedacted(value)) return "<redacted>"
  try {
    return stringify(value) ?? String(value)
  } catch (error) {
    return unserialisable(error)
  }
}

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
  try {
    return stringify(line)!
  } catch (error) {
    // Only a structure too deep for the stack gets here: the fixed keys are written all the same.
    return JSON.stringify({ timestamp: line.timestamp, level: line.level, message: line.message, error: unserialisable(error) })
  }
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

/**
 * A JSON-safe, bounded description of why a delivery failed: what the dead-letter record, the
 * outcome and the logs carry instead of the error object itself (errors are never outcomes).
 * It keeps the error's tag, message and its own scalar fields; a defect's summary also keeps the
 * first frames of its stack ({@link ErrorSummary.stack}), for the log line, never the message again.
 *
 * @since 0.1.0
 */
import { Cause } from "effect"

/** Structured cause of a failure, safe to serialise and to show an operator. */
export interface ErrorSummary {
  /** `Failure` for a typed error, `Defect` for an unexpected throw or die, `Interrupted` for interruption. */
  readonly kind: "Failure" | "Defect" | "Interrupted"
  /** The error's `_tag` (or its class name for a defect). */
  readonly tag: string
  /** A one-line human-readable message, at most 500 characters. */
  readonly message: string
  /** The error's own scalar fields (strings, numbers, booleans), at most 20 of them. */
  readonly fields: Readonly<Record<string, string | number | boolean>>
  /**
   * What the error wraps, outermost first (its `reason`, then each `cause`), at most 5 levels:
   * for a PostgreSQL error, the driver's error with its SQLSTATE `code`, `detail` and
   * `constraint`. Absent when the error wraps nothing.
   */
  readonly causes?: ReadonlyArray<CauseSummary> | undefined
  /**
   * A defect's stack frames (the `at ...` lines, without the message it starts with), where it
   * threw: its first 10 lines, at most 2,000 characters. On the outcome and its log line (the
   * `stack` key) so that an operator finds the line of code; never in the dead-letter record.
   * Absent for a typed failure, and for a defect that has no frames (not an `Error`).
   */
  readonly stack?: string | undefined
}

/** One wrapped error of an {@link ErrorSummary}'s chain. */
export interface CauseSummary {
  readonly tag: string
  readonly message: string
  readonly fields: Readonly<Record<string, string | number | boolean>>
}

const MAX_MESSAGE = 500
const MAX_FIELDS = 20
const MAX_FIELD_LENGTH = 200

const oneLine = (text: string, max: number): string => {
  const flat = text.replace(/\s+/g, " ").trim()
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat
}

const MAX_CAUSES = 5

// The engine summarises every handler error and defect, whatever value it is, so nothing here may
// throw: each read of the value (a getter, a proxy's trap, `instanceof`) is guarded, and what
// cannot be read falls back to what can be said safely, the class name or `[object Object]`.

const scalarFields = (value: object): Record<string, string | number | boolean> => {
  const fields: Record<string, string | number | boolean> = {}
  let keys: Array<string>
  try {
    keys = Object.keys(value)
  } catch {
    return fields // a proxy whose `ownKeys` throws
  }
  let count = 0
  for (const key of keys) {
    if (count >= MAX_FIELDS) break
    // Skipped before the read: these getters are not called.
    if (key === "_tag" || key === "message" || key === "stack" || key === "cause") continue
    if (key.startsWith("~")) continue // a library's type marker, not information
    let field: unknown
    try {
      field = (value as Record<string, unknown>)[key]
    } catch {
      continue // a getter that throws costs its field, not the others
    }
    if (typeof field === "string") fields[key] = oneLine(field, MAX_FIELD_LENGTH)
    else if (typeof field === "number" || typeof field === "boolean") fields[key] = field
    else continue
    count++
  }
  return fields
}

/** The name of `value`'s class, unless it is a plain object (or has no class, or it cannot be read). */
const className = (value: object): string | undefined => {
  try {
    const name: unknown = Object.getPrototypeOf(value)?.constructor?.name
    return typeof name === "string" && name !== "" && name !== "Object" ? name : undefined
  } catch {
    return undefined
  }
}

/** How long a tag may be: a tag names a kind of error, and an operator filters on it. */
const MAX_TAG = 100

const tagOf = (value: unknown, fallback: string): string => {
  if (typeof value === "object" && value !== null) {
    try {
      const tag = (value as { readonly _tag?: unknown })._tag
      if (typeof tag === "string") return tag.length > MAX_TAG ? oneLine(tag, MAX_TAG) : tag
      if (value instanceof Error) {
        const name: unknown = value.name
        if (typeof name === "string" && name !== "") return name.length > MAX_TAG ? oneLine(name, MAX_TAG) : name
      }
    } catch {
      // A `_tag` or `name` that cannot be read: the class, below, is what can be said.
    }
    // A die with an instance of some class (a library's internal wrapper, say): its class says more than the fallback.
    return className(value) ?? fallback
  }
  return fallback
}

/** How deep, and how many entries of each object or array, {@link jsonOf} shows. */
const MAX_JSON_DEPTH = 3
const MAX_JSON_ENTRIES = 20

/**
 * `value` as bounded JSON, for an object that has no message of its own: depth, entries and
 * strings are cut (`…`), cycles marked, an `Error` shown by its tag and message (which JSON would
 * drop), values JSON cannot hold (bigint, symbol, function) named, stacks and type markers left out.
 */
const jsonOf = (value: unknown, depth: number, seen: Set<object>): string => {
  switch (typeof value) {
    case "string":
      return JSON.stringify(value.length > MAX_FIELD_LENGTH ? `${value.slice(0, MAX_FIELD_LENGTH - 1)}…` : value)
    case "number":
    case "boolean":
      return JSON.stringify(value)
    case "bigint":
      return JSON.stringify(`${value}n`)
    case "symbol":
      return JSON.stringify(value.toString())
    case "function":
      return JSON.stringify(`[function ${value.name === "" ? "anonymous" : value.name}]`)
  }
  if (typeof value !== "object" || value === null) return "null" // undefined, as JSON shows it in an array
  if (seen.has(value)) return "\"[Circular]\""
  if (depth >= MAX_JSON_DEPTH) return "\"…\""
  seen.add(value)
  try {
    if (Array.isArray(value)) {
      const items = value.slice(0, MAX_JSON_ENTRIES).map((item) => jsonOf(item, depth + 1, seen))
      if (value.length > MAX_JSON_ENTRIES) items.push("\"…\"")
      return `[${items.join(",")}]`
    }
    const entries: Array<readonly [string, unknown]> = value instanceof Error
      ? [["_tag", tagOf(value, "Error")], ["message", value.message]]
      : []
    // One past the limit at most, so that a huge object costs no more than a small one.
    for (const key in value) {
      if (entries.length > MAX_JSON_ENTRIES) break
      if (!Object.hasOwn(value, key) || key === "stack" || key.startsWith("~") || entries.some(([known]) => known === key)) continue
      entries.push([key, (value as Record<string, unknown>)[key]])
    }
    const shown = entries.slice(0, MAX_JSON_ENTRIES).map(([key, field]) => `${JSON.stringify(key)}:${jsonOf(field, depth + 1, seen)}`)
    if (entries.length > MAX_JSON_ENTRIES) shown.push("\"…\":\"…\"")
    return `{${shown.join(",")}}`
  } finally {
    seen.delete(value)
  }
}

/**
 * An object without a message in words: its own `toString` when it has one (effect's data types
 * do), else bounded JSON. `String` alone says "[object Object]", which tells an operator nothing.
 */
const describeObject = (value: object): string => {
  try {
    if (value.toString !== Object.prototype.toString && typeof value.toString === "function") {
      const text = String(value)
      if (text !== "" && !text.startsWith("[object ")) return text
    }
  } catch {
    // A `toString` that throws: the JSON below still says what the object holds.
  }
  try {
    return jsonOf(value, 0, new Set())
  } catch {
    // A getter that throws: the class is all that can be said safely.
    return `[object ${className(value) ?? "Object"}]`
  }
}

const messageOf = (value: unknown): string => {
  if (typeof value !== "object" || value === null) return String(value)
  try {
    const message = (value as { readonly message?: unknown }).message
    if (typeof message === "string") return message
  } catch {
    // A `message` getter (or proxy trap) that throws: nothing else on the object can be trusted.
    return `[object ${className(value) ?? "Object"}]`
  }
  return describeObject(value)
}

const WRAPPING_KEYS = ["reason", "cause"] as const

/** The error `value` wraps: its `reason` (effect's SqlError and its kin) or its `cause`, if an object. */
const wrapped = (value: object): object | undefined => {
  for (const key of WRAPPING_KEYS) {
    try {
      const inner = (value as Record<string, unknown>)[key]
      if (typeof inner === "object" && inner !== null) return inner
    } catch {
      // A getter that throws wraps nothing that can be read; the next key may still.
    }
  }
  return undefined
}

/** The chain under `error`, outermost first, bounded; repeated messages are not repeated. */
const causesOf = (error: object): Array<CauseSummary> => {
  const chain: Array<CauseSummary> = []
  const seen = new Set<object>([error])
  let next = wrapped(error)
  while (next !== undefined && !seen.has(next) && chain.length < MAX_CAUSES) {
    seen.add(next)
    const message = oneLine(messageOf(next), MAX_MESSAGE)
    chain.push({ tag: tagOf(next, "Error"), message, fields: scalarFields(next) })
    next = wrapped(next)
  }
  return chain
}

const MAX_STACK_LINES = 10
const MAX_STACK = 2_000

/**
 * The frames of `value`'s stack (V8's `    at ...` lines), bounded; `undefined` without any. The
 * header, which repeats the message (and whatever it quoted, over any number of lines), is left out.
 */
const framesOf = (value: object): string | undefined => {
  let stack: unknown
  try {
    stack = (value as { readonly stack?: unknown }).stack
  } catch {
    return undefined // a `stack` getter that throws
  }
  if (typeof stack !== "string") return undefined
  const frames: Array<string> = []
  for (const line of stack.split("\n")) {
    if (frames.length >= MAX_STACK_LINES) break
    if (/^\s+at /.test(line)) frames.push(line)
  }
  if (frames.length === 0) return undefined
  const text = frames.join("\n")
  if (text.length <= MAX_STACK) return text
  // Whole frames where they fit; one frame longer than the bound is cut.
  const end = text.lastIndexOf("\n", MAX_STACK)
  return end > 0 ? text.slice(0, end) : `${text.slice(0, MAX_STACK - 1)}…`
}

/** Summarises one error value (a typed failure or a defect), with the chain it wraps. */
export const fromError = (error: unknown, kind: "Failure" | "Defect" = "Failure"): ErrorSummary => {
  const tag = tagOf(error, kind === "Defect" ? "Defect" : "UnknownError")
  const message = oneLine(messageOf(error), MAX_MESSAGE)
  const isObject = typeof error === "object" && error !== null
  const causes = isObject ? causesOf(error) : []
  // Where a defect threw is what an operator needs; a typed error is named by its tag and fields.
  const stack = isObject && kind === "Defect" ? framesOf(error) : undefined
  return {
    kind,
    tag,
    message: message.length > 0 ? message : tag,
    fields: isObject ? scalarFields(error) : {},
    ...(causes.length > 0 ? { causes } : {}),
    ...(stack === undefined ? {} : { stack })
  }
}

/** Summarises a `Cause`, preferring its first typed failure, then its first defect. */
export const fromCause = (cause: Cause.Cause<unknown>): ErrorSummary => {
  for (const reason of cause.reasons) {
    if (reason._tag === "Fail") return fromError(reason.error, "Failure")
  }
  for (const reason of cause.reasons) {
    if (reason._tag === "Die") return fromError(reason.defect, "Defect")
  }
  return { kind: "Interrupted", tag: "Interrupted", message: "the work was interrupted", fields: {} }
}

/** Builds a summary directly, for failures the engine itself detects. */
export const make = (
  tag: string,
  message: string,
  fields: Readonly<Record<string, string | number | boolean>> = {}
): ErrorSummary => ({ kind: "Failure", tag, message: oneLine(message, MAX_MESSAGE), fields })

/**
 * One line for a log's `error` key: `Tag: message`, followed by the innermost wrapped error's
 * message where the outer one does not already say it (for a failed connection, the driver's
 * `connect ECONNREFUSED 127.0.0.1:5433`, which names what to check), and its `code` where no
 * message says it (PostgreSQL's SQLSTATE, as `integer out of range, code 22003`).
 */
export const describe = (summary: ErrorSummary): string => {
  const text = `${summary.tag}: ${summary.message}`
  const last = summary.causes?.[summary.causes.length - 1]
  const innermost = last === undefined || last.message === "" || text.includes(last.message) ? undefined : last.message
  const code = last?.fields.code
  const said = innermost === undefined ? text : `${text} ${innermost}`
  const codeText = (typeof code === "string" && code !== "") || typeof code === "number" ? String(code) : undefined
  const extra = [innermost, codeText === undefined || said.includes(codeText) ? undefined : `code ${codeText}`].filter((part) => part !== undefined)
  return extra.length === 0 ? text : `${text} (${extra.join(", ")})`
}

/**
 * `text` with the credentials of every URL in it removed: `http://user:password@host` becomes
 * `http://host`. Node sends a URL's userinfo as basic auth, so it is a secret, and a library that
 * refuses such a URL quotes it in its error. Everything from `//` to the last `@` before a blank or
 * a quote goes, so a password holding `@` or `/` goes whole too (at worst, more than the userinfo:
 * this is for messages, never for requests).
 */
export const withoutCredentials = (text: string): string => text.replace(/\/\/[^\s"'<>`]*@/g, "//")

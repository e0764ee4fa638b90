/**
 * A duration option read as it was given, before effect parses it: effect turns a NaN (a number,
 * a tuple part, an object field) into a zero duration, so a `Number("oops")` read from config
 * would pass as 0 once parsed, and `Duration.fromInputUnsafe` throws on a string that does not
 * parse. jetworker's packages check their duration options with it, and show the value given in
 * their messages.
 *
 * @since 0.1.0
 */
import { Duration, Option } from "effect"

const isNaNumber = (value: unknown): boolean => typeof value === "number" && Number.isNaN(value)

/** Whether `input` holds a NaN anywhere effect would read one (and silently make it zero). */
const hasNaN = (input: unknown): boolean => {
  if (isNaNumber(input)) return true
  if (Array.isArray(input)) return input.some(isNaNumber)
  if (typeof input === "object" && input !== null && !Duration.isDuration(input)) {
    return Object.values(input).some(isNaNumber)
  }
  return false
}

/** `input` parsed, or `undefined` when it holds a NaN or does not parse (never throws). */
export const parse = (input: Duration.Input): Duration.Duration | undefined =>
  hasNaN(input) ? undefined : Option.getOrUndefined(Duration.fromInput(input))

/** `input` as it was given: `"5 secs"`, `NaN`, `[NaN, 0]`, `{ seconds: NaN }`, `1 second`. */
export const show = (input: unknown): string => {
  if (typeof input === "string") return JSON.stringify(input)
  if (typeof input === "bigint") return `${input}n`
  if (Duration.isDuration(input)) return Duration.format(input)
  if (Array.isArray(input)) return `[${input.map(show).join(", ")}]`
  if (typeof input === "object" && input !== null) {
    return `{ ${Object.entries(input).map(([key, value]) => `${key}: ${show(value)}`).join(", ")} }`
  }
  return String(input)
}

/**
 * The worker's environment variables read as text and checked here, so that a refusal is one line
 * an operator can act on (the variable, what it takes, the value given) rather than effect's
 * schema error (`Expected a valid Duration string at ["SHUTDOWN_BUDGET"]`), which shows neither
 * the value nor an example.
 */
import { DurationInput } from "@jetworker/core"
import { Config, Duration, Effect, type LogLevel, Option, Schema, SchemaIssue } from "effect"

/** A refusal of `name`'s value, worded as `message`; {@link describeConfigError} gives it back as is. */
const refuse = (message: string): Config.ConfigError =>
  new Config.ConfigError(new Schema.SchemaError(new SchemaIssue.InvalidValue({ message })))

/** `name`'s value, or `fallback` when it is unset or empty (an empty variable is an unset one). */
const text = (name: string, fallback: string): Config.Config<string> =>
  Config.option(Config.String(name)).pipe(
    Config.map((value) => Option.isSome(value) && value.value.trim() !== "" ? value.value.trim() : fallback)
  )

/**
 * A duration variable, default `fallback` (its example too). `nonNegative`: a negative value is
 * refused here, naming the variable (the shutdown shares: a sign slip, not a budget).
 */
export const duration = (name: string, fallback: string, options: { readonly nonNegative?: boolean } = {}) =>
  text(name, fallback).pipe(
    Config.mapEffect((raw): Effect.Effect<Duration.Duration, Config.ConfigError> => {
      const parsed = DurationInput.parse(raw as Duration.Input)
      if (parsed === undefined) {
        return Effect.fail(refuse(`${name} must be a duration such as ${JSON.stringify(fallback)}, got ${JSON.stringify(raw)}`))
      }
      if (options.nonNegative === true && Duration.isNegative(parsed)) {
        return Effect.fail(refuse(`${name} must not be negative, got ${JSON.stringify(raw)}`))
      }
      return Effect.succeed(parsed)
    })
  )

/**
 * A port variable: `off`, or 0 to 65535 in digits only (`Number` would also take "1e3", "0x1F90" or
 * " 80 "), default `fallback`. Refused here, so that the refusal names the value given.
 */
export const port = (name: string, fallback: string): Config.Config<number | "off"> =>
  text(name, fallback).pipe(
    Config.mapEffect((raw): Effect.Effect<number | "off", Config.ConfigError> => {
      if (raw.toLowerCase() === "off") return Effect.succeed("off")
      const value = /^\d{1,5}$/.test(raw) ? Number(raw) : Number.NaN
      return value <= 65535
        ? Effect.succeed(value)
        : Effect.fail(refuse(`${name} must be a port (0-65535) or "off", got ${JSON.stringify(raw)}`))
    })
  )

/**
 * An integer variable, default `fallback`: decimal digits, with a fraction or an exponent when the
 * value is still an integer (`1e6`), as effect's `Config.Int` took them. Text that is no integer is
 * refused here, naming the value given and the range (`min` to `max`, checked with the settings).
 */
export const integer = (name: string, fallback: number, range: { readonly min: number; readonly max: number }) =>
  text(name, String(fallback)).pipe(
    Config.mapEffect((raw): Effect.Effect<number, Config.ConfigError> => {
      const value = /^\d+(\.\d+)?(e\+?\d+)?$/i.test(raw) ? Number(raw) : Number.NaN
      return Number.isSafeInteger(value)
        ? Effect.succeed(value)
        : Effect.fail(refuse(`${name} must be an integer from ${range.min} to ${range.max}, got ${JSON.stringify(raw)}`))
    })
  )

/**
 * The text of each variable of `names` that is set (trimmed, an empty one is unset), for a refusal
 * of its value that `settingsProblems` finds to quote what was given.
 */
export const given = (names: Readonly<Record<string, string>>): Config.Config<Readonly<Record<string, string>>> => {
  const options: Record<string, Config.Config<Option.Option<string>>> = {}
  for (const [key, name] of Object.entries(names)) options[key] = Config.option(Config.String(name))
  return Config.all(options).pipe(
    Config.map((values) => {
      const texts: Record<string, string> = {}
      for (const [key, value] of Object.entries(values)) {
        if (Option.isSome(value) && value.value.trim() !== "") texts[key] = value.value.trim()
      }
      return texts
    })
  )
}

const levels: ReadonlyArray<LogLevel.LogLevel> = ["All", "Trace", "Debug", "Info", "Warn", "Error", "Fatal", "None"]

/** `LOG_LEVEL` in any case (`debug`, `WARN`), as the CLI's `--log-level` takes it; default `Info`. */
export const logLevel = (name: string): Config.Config<LogLevel.LogLevel> =>
  text(name, "Info").pipe(
    Config.mapEffect((raw) => {
      const level = levels.find((l) => l.toLowerCase() === raw.toLowerCase())
      return level === undefined
        ? Effect.fail(refuse(`${name} must be one of ${levels.join(", ")} (any case), got ${JSON.stringify(raw)}`))
        : Effect.succeed(level)
    })
  )

/**
 * Why `host` (from `HEALTH_HOST`) is no host to listen on, or `undefined`: a port given with it
 * (`localhost:8080`, an easy mistake) would fail as a host name that does not resolve. An IPv6
 * address has more than one colon and is left alone.
 */
export const hostWithPort = (host: string): string | undefined =>
  /^[^:]+:\d*$/.test(host) || /^\[.*\]:\d*$/.test(host)
    ? `HEALTH_HOST must be a host name or address without a port, got ${JSON.stringify(host)}`
    : undefined

const pathOf = (issue: SchemaIssue.Issue): { readonly path: ReadonlyArray<PropertyKey>; readonly leaf: SchemaIssue.Issue } => {
  if (issue._tag === "Pointer") {
    const inner = pathOf(issue.issue)
    return { path: [...issue.path, ...inner.path], leaf: inner.leaf }
  }
  // A variable decoded from its text (a number, a duration, a redacted string) wraps what was read.
  return issue._tag === "Encoding" ? pathOf(issue.issue) : { path: [], leaf: issue }
}

/**
 * One line for a configuration failure: a refusal worded here as it is; an unset variable as
 * `<NAME> is not set`; anything else as `<NAME>: <effect's text>`.
 */
export const describeConfigError = (error: Config.ConfigError): string => {
  const cause = error.cause
  if (!Schema.isSchemaError(cause)) return cause.message
  const { leaf, path } = pathOf(cause.issue)
  const name = path.map(String).join(".")
  // From the environment every value is text: a string that is not there is an unset variable.
  const unset = leaf._tag === "MissingKey" || (leaf._tag === "InvalidType" && leaf.ast._tag === "String")
  if (unset && name !== "") return `${name} is not set`
  const message = SchemaIssue.makeFormatterDefault()(leaf)
  return name === "" ? message : `${name}: ${message}`
}

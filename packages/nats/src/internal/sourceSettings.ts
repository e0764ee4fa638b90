/**
 * `JetStreamSource`'s durations, checked once when the source is made: in milliseconds, or what
 * is wrong with them (reported by `open`, so `make` never throws).
 */
import { DurationInput } from "@jetworker/core"
import { Duration } from "effect"

// The longest a Node timer waits: a longer one fires at once (and settles, pulls or polls in a loop).
export const MAX_TIMER_MILLIS = 2 ** 31 - 1

/**
 * The shortest pull expiry the intake takes (its idle heartbeat, half the expiry, needs room to be
 * heard), and its default; the contract checks a declared `pullExpires` against the same bounds.
 */
export const MIN_PULL_EXPIRES_MILLIS = 1_000
export const DEFAULT_PULL_EXPIRES_MILLIS = 30_000

// Long enough for a NATS reconnect or a leader election, short enough that a dependency that
// stays away fails the start-up (and the platform restarts the process) rather than hiding.
const DEFAULT_OPEN_RETRY_MILLIS = 30_000

/** `input` in milliseconds, or `undefined` when it does not parse or holds a NaN (see `DurationInput`). */
const millisOf = (input: Duration.Input): number | undefined => {
  const duration = DurationInput.parse(input)
  return duration === undefined ? undefined : Duration.toMillis(duration)
}

/** The durations a source is given, as its options hold them. */
export interface Durations {
  readonly pullExpires?: Duration.Input | undefined
  readonly settleTimeout?: Duration.Input | undefined
  readonly lagInterval?: Duration.Input | undefined
  readonly openRetryTimeout?: Duration.Input | undefined
}

/** The options' durations in milliseconds, checked. */
export interface Settings {
  readonly settleTimeoutMillis: number
  readonly expiresMillis: number
  readonly lagIntervalMillis: number
  readonly openRetryMillis: number
}

/** The durations, or what is wrong with them (one line per option). */
export const settingsOf = (options: Durations): Settings | ReadonlyArray<string> => {
  const problems: Array<string> = []
  const check = (name: string, input: Duration.Input | undefined, fallback: number, min: number, minText: string) => {
    const millis = input === undefined ? fallback : millisOf(input)
    if (millis !== undefined && millis >= min && millis <= MAX_TIMER_MILLIS) return millis
    problems.push(`${name} must be a duration from ${minText} to ${MAX_TIMER_MILLIS} ms, got ${DurationInput.show(input)}`)
    return fallback
  }
  // 0 would have every confirmation time out before its reply.
  const settleTimeoutMillis = check("settleTimeout", options.settleTimeout, 5_000, 1, "1 millisecond")
  // Shorter pulls only cost requests; the idle heartbeat (half the expiry) needs room to be heard.
  const expiresMillis = check("pullExpires", options.pullExpires, DEFAULT_PULL_EXPIRES_MILLIS, MIN_PULL_EXPIRES_MILLIS, "1 second")
  // Each tick is a consumer-info request to the JetStream API (and a MaxDeliver recovery round):
  // faster than 10 a second floods the server for a gauge read every few seconds.
  const lagIntervalMillis = check("lagInterval", options.lagInterval, 10_000, 100, "100 milliseconds")
  // 0: a single try of each opening request.
  const openRetryMillis = check("openRetryTimeout", options.openRetryTimeout, DEFAULT_OPEN_RETRY_MILLIS, 0, "0")
  return problems.length > 0 ? problems : { settleTimeoutMillis, expiresMillis, lagIntervalMillis, openRetryMillis }
}

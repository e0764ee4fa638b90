/**
 * Retry policies: how many attempts a message gets and how long to wait between them, built on
 * `Schedule` (exponential growth, 80–120% jitter, a cap, a finite number of attempts).
 *
 * Attempts are counted outside local memory, so the budget holds across crashes and restarts: by an
 * `AttemptStore` when the context has one (failed attempts of the handler only, so releases spend
 * nothing), otherwise by the broker's delivery count (attempt `n` is the `n`-th delivery). After a transient failure the
 * engine may retry a few times inside the same delivery (`inProcess`, short delays only, while the
 * lease is comfortably held); once those are spent the message is naked with the delay for its
 * attempt, and when the last attempt fails the outcome is `DeadLettered`. A handler therefore runs
 * at most `attempts × (1 + inProcess.times)` times.
 *
 * @since 0.1.0
 */
import { Duration, Effect, Schedule } from "effect"
import * as DurationInput from "./DurationInput.ts"

/** A validated retry policy. Build it with {@link exponential}. */
export interface RetryPolicy {
  /** Failed attempts a message gets before it is dead-lettered (at least 1). */
  readonly attempts: number
  /** Delay before the second attempt. */
  readonly base: Duration.Duration
  /** Growth of the delay per attempt. */
  readonly factor: number
  /** Upper bound of any delay, jitter included. */
  readonly cap: Duration.Duration
  /** Whether delays are spread by a random factor of 0.8 to 1.2. */
  readonly jitter: boolean
  /** Extra quick retries inside one delivery, before it is naked. */
  readonly inProcess: {
    /** How many (0 turns them off). */
    readonly times: number
    /** Only delays up to this long are waited in process; longer ones become a nak. */
    readonly maxDelay: Duration.Duration
  }
}

/** Options of {@link exponential}; every field has a default. */
export interface ExponentialOptions {
  /** Delay before the second attempt. Default: 200 millis. */
  readonly base?: Duration.Input | undefined
  /** Growth per attempt. Default: 2. */
  readonly factor?: number | undefined
  /** Largest delay. Default: 30 seconds. */
  readonly cap?: Duration.Input | undefined
  /** Deliveries before dead-lettering, 1 to 1000. Default: 5. */
  readonly attempts?: number | undefined
  /** Random spread of each delay (0.8–1.2). Default: true. */
  readonly jitter?: boolean | undefined
  /** Quick retries inside a delivery, 0 to 10. Default: 2. */
  readonly inProcessRetries?: number | undefined
  /** Longest delay waited in process, finite and not negative (0: none). Default: 1 second. */
  readonly inProcessMaxDelay?: Duration.Input | undefined
}

/** A problem found while validating options; collected, never thrown. */
export interface OptionProblem {
  readonly option: string
  readonly problem: string
}

/** The default policy: 5 attempts, 200 ms doubling to at most 30 s, jittered, 2 in-process retries. */
export const defaultPolicy: RetryPolicy = {
  attempts: 5,
  base: Duration.millis(200),
  factor: 2,
  cap: Duration.seconds(30),
  jitter: true,
  inProcess: { times: 2, maxDelay: Duration.seconds(1) }
}

/**
 * Inputs of {@link exponential} that are no usable duration (they do not parse, or hold a NaN that
 * effect would read as zero), by the stand-in duration put in their place: {@link validate} finds
 * them there and reports them as given. Keyed by the stand-in, so a policy spread with a valid
 * field in its place (`{ ...policy, base }`) is valid again.
 */
const invalidInputs = new WeakMap<Duration.Duration, unknown>()

/** `input` parsed, `fallback` when not given, or a stand-in (of the fallback's length) remembering an invalid input. */
const durationField = (input: Duration.Input | undefined, fallback: Duration.Duration): Duration.Duration => {
  if (input === undefined) return fallback
  const parsed = DurationInput.parse(input)
  if (parsed !== undefined) return parsed
  // A fresh object: the stand-in must be this field's alone.
  const standIn = Duration.millis(Duration.toMillis(fallback))
  invalidInputs.set(standIn, input)
  return standIn
}

/**
 * An exponential, jittered, capped policy with a finite number of attempts. Never throws:
 * out-of-range options are kept as given, and a duration that does not parse (`"5 secs"` cast from
 * config) or holds a NaN is replaced by its default and remembered; {@link validate} reports all of
 * them (the consumer refuses to start with them).
 *
 * ```ts
 * import { Retry } from "@jetworker/core"
 *
 * // 8 attempts in all: 500 ms, 1 s, 2 s ... at most 1 minute apart, jittered; the first two
 * // retries in the same process (short delays), the rest through a delayed redelivery.
 * const retry = Retry.exponential({ attempts: 8, base: "500 millis", cap: "1 minute", inProcessRetries: 2, inProcessMaxDelay: "2 seconds" })
 * ```
 */
export const exponential = (options: ExponentialOptions = {}): RetryPolicy => ({
  attempts: options.attempts ?? defaultPolicy.attempts,
  base: durationField(options.base, defaultPolicy.base),
  factor: options.factor ?? defaultPolicy.factor,
  cap: durationField(options.cap, defaultPolicy.cap),
  jitter: options.jitter ?? defaultPolicy.jitter,
  inProcess: {
    times: options.inProcessRetries ?? defaultPolicy.inProcess.times,
    maxDelay: durationField(options.inProcessMaxDelay, defaultPolicy.inProcess.maxDelay)
  }
})

/**
 * Problems with a policy (empty when it is usable), each naming the option and the value got:
 * `attempts` 1 to 1000, `inProcessRetries` 0 to 10, `factor` 1 to 10, `base` at least 1
 * millisecond, `cap` at least `base`, `inProcessMaxDelay` not negative; durations finite, and
 * parsable without a NaN when given to {@link exponential}.
 */
export const validate = (policy: RetryPolicy): ReadonlyArray<OptionProblem> => {
  const problems: Array<OptionProblem> = []
  const intIn = (option: string, value: number, min: number, max: number) => {
    if (!Number.isInteger(value) || value < min || value > max) {
      problems.push({ option, problem: `must be an integer from ${min} to ${max}, got ${value}` })
    }
  }
  /** Reports a duration `exponential` could not use; whether it did. */
  const unusable = (option: string, duration: Duration.Duration): boolean => {
    if (!invalidInputs.has(duration)) return false
    problems.push({ option, problem: `must be a duration such as "200 millis", got ${DurationInput.show(invalidInputs.get(duration))}` })
    return true
  }
  intIn("retry.attempts", policy.attempts, 1, 1000)
  intIn("retry.inProcessRetries", policy.inProcess.times, 0, 10)
  if (!(Number.isFinite(policy.factor) && policy.factor >= 1 && policy.factor <= 10)) {
    problems.push({ option: "retry.factor", problem: `must be from 1 to 10, got ${policy.factor}` })
  }
  if (!unusable("retry.base", policy.base) && (!Duration.isFinite(policy.base) || Duration.toMillis(policy.base) < 1)) {
    problems.push({ option: "retry.base", problem: `must be a finite duration of at least 1 millisecond, got ${Duration.format(policy.base)}` })
  }
  if (!unusable("retry.cap", policy.cap) && (!Duration.isFinite(policy.cap) || Duration.isLessThan(policy.cap, policy.base))) {
    problems.push({ option: "retry.cap", problem: `must be finite and at least retry.base, got ${Duration.format(policy.cap)}` })
  }
  const maxDelay = policy.inProcess.maxDelay
  // A negative bound would quietly turn in-process retries off: no delay is that short.
  if (!unusable("retry.inProcessMaxDelay", maxDelay) && (!Duration.isFinite(maxDelay) || Duration.isNegative(maxDelay))) {
    problems.push({ option: "retry.inProcessMaxDelay", problem: `must be a finite duration, not negative, got ${Duration.format(maxDelay)}` })
  }
  return problems
}

/** The delays of `policy` as a `Schedule`: exponential, jittered when asked, then capped. Unbounded. */
export const delays = (policy: RetryPolicy): Schedule.Schedule<Duration.Duration> => {
  const grown = Schedule.exponential(policy.base, policy.factor)
  const spread = policy.jitter ? Schedule.jittered(grown) : grown
  return Schedule.modifyDelay(spread, ({ duration }) => Effect.succeed(Duration.min(duration, policy.cap)))
}

/**
 * The in-process retry schedule for one delivery: the policy's delays, at most
 * `inProcess.times` of them, and only while the next delay is at most `inProcess.maxDelay`.
 */
export const inProcessSchedule = (policy: RetryPolicy): Schedule.Schedule<Duration.Duration> =>
  delays(policy).pipe(
    Schedule.upTo({ times: policy.inProcess.times }),
    Schedule.while(({ duration }) => Duration.isLessThanOrEqualTo(duration, policy.inProcess.maxDelay))
  )

/**
 * The delay before attempt `attempt + 1`, i.e. the nak delay after attempt `attempt` failed
 * (1-based, as the broker counts deliveries), in whole milliseconds. Steps the policy's schedule
 * `attempt` times.
 */
export const delayAfter = (policy: RetryPolicy, attempt: number): Effect.Effect<Duration.Duration> =>
  Effect.gen(function*() {
    const step = yield* Schedule.toStep(delays(policy))
    let delay = policy.base
    const steps = Math.max(1, Math.min(attempt, 64))
    for (let i = 0; i < steps; i++) {
      const result = yield* Effect.result(step(0, undefined))
      if (result._tag === "Success") delay = result.success[1]
    }
    // Whole milliseconds: the broker takes no finer delay, and logs stay readable.
    return Duration.millis(Math.round(Duration.toMillis(delay)))
  })

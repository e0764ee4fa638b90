/**
 * Bounded waits on observable state, for tests: re-read a probe until it satisfies a condition,
 * or await a signal, and fail with a {@link WaitTimeout} naming what was awaited (and, for
 * {@link poll}, the last value the probe returned) when the bound runs out. The alternative to sleeping in a test: the wait ends as soon as the state is there.
 *
 * Every bound runs on the real clock, also under `TestClock` (as `it.effect` provides it): a
 * wait on real services must end in real time, and under the test clock its bound would never
 * run out (the test would hang until the runner's own timeout).
 *
 * A bound must be a finite duration, 0 or more: one that is not (a string that does not parse, a
 * NaN, which effect would read as 0, a negative or an infinite one) fails the wait at once with a
 * {@link WaitTimeout} naming it, before anything is awaited.
 *
 * @since 0.1.0
 */
import { DurationInput } from "@jetworker/core"
import { Clock, Data, Deferred, Duration, Effect, Schedule } from "effect"
import type { TestClock } from "effect/testing"

/**
 * A bounded wait that ran out; the message says what was awaited, for how long and, for
 * {@link poll}, what the probe last returned. Also the
 * failure of a wait whose bound is not a finite duration (the message then names the bound).
 */
export class WaitTimeout extends Data.TaggedError("WaitTimeout")<{ readonly message: string }> {}

/** Runs `effect` on the real clock, also under `TestClock` (its `withLive`). */
export const inRealTime = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Clock.clockWith((clock) => {
    const test = clock as Partial<TestClock.TestClock>
    return typeof test.withLive === "function" ? test.withLive(effect) : effect
  })

/** `timeout` parsed, or the {@link WaitTimeout} refusing it when it is not a finite duration of 0 or more. */
const checkTimeout = (what: string, timeout: Duration.Input): Duration.Duration | WaitTimeout => {
  const parsed = DurationInput.parse(timeout)
  return parsed !== undefined && Duration.isFinite(parsed) && Duration.toMillis(parsed) >= 0
    ? parsed
    : new WaitTimeout({
      message: `cannot wait for ${what}: timeout must be a finite duration such as "15 seconds", 0 or more, ` +
        `got ${DurationInput.show(timeout)}`
    })
}

const ranOut = (what: string, timeout: Duration.Duration, saw = "") =>
  new WaitTimeout({ message: `waited ${Duration.format(timeout)} for ${what}${saw}` })

/** Longest rendering of a probed value in a {@link WaitTimeout}: enough to see why, not a dump. */
const maxShown = 200

/** `value` as JSON where it can be (else `String`), cut to {@link maxShown} characters. */
const shorten = (value: unknown): string => {
  let text: string
  try {
    // `undefined` and functions have no JSON.
    text = JSON.stringify(value) ?? String(value)
  } catch {
    // A bigint or a cycle.
    text = String(value)
  }
  return text.length > maxShown ? `${text.slice(0, maxShown)}… (${text.length} characters)` : text
}

/**
 * Re-runs `probe` every `interval` (default 20 millis; finite, above zero) until `done` holds for
 * its value, at most `timeout` (default 15 seconds); returns that value. The {@link WaitTimeout}
 * of a wait that ran out ends with the value the probe returned last (as JSON, shortened), e.g.
 * `waited 15s for the order to ship; saw {"status":"pending"}`.
 */
export const poll = <A, E, R>(
  what: string,
  probe: Effect.Effect<A, E, R>,
  done: (value: A) => boolean,
  options: { readonly timeout?: Duration.Input | undefined; readonly interval?: Duration.Input | undefined } = {}
): Effect.Effect<A, E | WaitTimeout, R> => pollShowing(what, probe, done, options, true)

/** {@link poll}, telling what the probe last returned only when `show` (a boolean check's is always `false`). */
const pollShowing = <A, E, R>(
  what: string,
  probe: Effect.Effect<A, E, R>,
  done: (value: A) => boolean,
  options: { readonly timeout?: Duration.Input | undefined; readonly interval?: Duration.Input | undefined },
  show: boolean
): Effect.Effect<A, E | WaitTimeout, R> => {
  const timeout = checkTimeout(what, options.timeout ?? "15 seconds")
  if (timeout instanceof WaitTimeout) return Effect.fail(timeout)
  const interval = DurationInput.parse(options.interval ?? "20 millis")
  // 0 would re-run the probe in a hot loop.
  if (interval === undefined || !Duration.isFinite(interval) || !(Duration.toMillis(interval) > 0)) {
    return Effect.fail(
      new WaitTimeout({
        message: `cannot wait for ${what}: interval must be a finite duration above zero such as "20 millis", ` +
          `got ${DurationInput.show(options.interval)}`
      })
    )
  }
  return Effect.suspend(() => {
    // The last value probed, for the timeout's message; each wait has its own.
    let last: { readonly value: A } | undefined
    const saw = () => !show ? "" : last === undefined ? "; saw nothing (the probe had not returned yet)" : `; saw ${shorten(last.value)}`
    return inRealTime(probe.pipe(
      Effect.tap((value) =>
        Effect.sync(() => {
          last = { value }
        })
      ),
      Effect.repeat({ schedule: Schedule.spaced(interval), until: done }),
      Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.suspend(() => Effect.fail(ranOut(what, timeout, saw()))) })
    ))
  })
}

/** Re-runs `check` until it is true, at most `timeout` (default 15 seconds). */
export const holds = <E, R>(
  what: string,
  check: Effect.Effect<boolean, E, R>,
  timeout: Duration.Input = "15 seconds"
): Effect.Effect<void, E | WaitTimeout, R> => Effect.asVoid(pollShowing(what, check, (ok) => ok, { timeout }, false))

/** Awaits `deferred`, at most `timeout` (default 15 seconds). */
export const deferred = <A>(
  what: string,
  deferred: Deferred.Deferred<A>,
  timeout: Duration.Input = "15 seconds"
): Effect.Effect<A, WaitTimeout> => {
  const bound = checkTimeout(what, timeout)
  if (bound instanceof WaitTimeout) return Effect.fail(bound)
  return inRealTime(
    Deferred.await(deferred).pipe(Effect.timeoutOrElse({ duration: bound, orElse: () => Effect.fail(ranOut(what, bound)) }))
  )
}

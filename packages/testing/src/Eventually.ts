/**
 * Bounded waits on observable state, for tests: re-read a probe until it satisfies a condition,
 * or await a signal, and fail with a {@link WaitTimeout} naming what was awaited when the bound
 * runs out. The alternative to sleeping in a test: the wait ends as soon as the state is there.
 *
 * Every bound runs on the real clock, also under `TestClock` (as `it.effect` provides it): a
 * wait on real services must end in real time, and under the test clock its bound would never
 * run out (the test would hang until the runner's own timeout).
 *
 * @since 0.1.0
 */
import { Clock, Data, Deferred, Duration, Effect, Schedule } from "effect"
import type { TestClock } from "effect/testing"

/** A bounded wait that ran out; the message says what was awaited and for how long. */
export class WaitTimeout extends Data.TaggedError("WaitTimeout")<{ readonly message: string }> {}

/** Runs `effect` on the real clock, also under `TestClock` (its `withLive`). */
export const inRealTime = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Clock.clockWith((clock) => {
    const test = clock as Partial<TestClock.TestClock>
    return typeof test.withLive === "function" ? test.withLive(effect) : effect
  })

const ranOut = (what: string, timeout: Duration.Input) =>
  new WaitTimeout({ message: `waited ${Duration.format(Duration.fromInputUnsafe(timeout))} for ${what}` })

/**
 * Re-runs `probe` every `interval` (default 20 millis) until `done` holds for its value, at most
 * `timeout` (default 15 seconds); returns that value.
 */
export const poll = <A, E, R>(
  what: string,
  probe: Effect.Effect<A, E, R>,
  done: (value: A) => boolean,
  options: { readonly timeout?: Duration.Input | undefined; readonly interval?: Duration.Input | undefined } = {}
): Effect.Effect<A, E | WaitTimeout, R> => {
  const timeout = options.timeout ?? "15 seconds"
  return inRealTime(probe.pipe(
    Effect.repeat({ schedule: Schedule.spaced(options.interval ?? "20 millis"), until: done }),
    Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.fail(ranOut(what, timeout)) })
  ))
}

/** Re-runs `check` until it is true, at most `timeout` (default 15 seconds). */
export const holds = <E, R>(
  what: string,
  check: Effect.Effect<boolean, E, R>,
  timeout: Duration.Input = "15 seconds"
): Effect.Effect<void, E | WaitTimeout, R> => Effect.asVoid(poll(what, check, (ok) => ok, { timeout }))

/** Awaits `deferred`, at most `timeout` (default 15 seconds). */
export const deferred = <A>(
  what: string,
  deferred: Deferred.Deferred<A>,
  timeout: Duration.Input = "15 seconds"
): Effect.Effect<A, WaitTimeout> =>
  inRealTime(
    Deferred.await(deferred).pipe(Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.fail(ranOut(what, timeout)) }))
  )

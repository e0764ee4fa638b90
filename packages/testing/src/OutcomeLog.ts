/**
 * Collects a consumer's outcomes for assertions, and waits (bounded) until they satisfy a
 * condition: the deterministic alternative to sleeping in a test. Pass `record` as the
 * consumer's `onOutcome`.
 *
 * @since 0.1.0
 */
import { DurationInput, type Outcome } from "@jetworker/core"
import { Deferred, Duration, Effect } from "effect"
import { inRealTime, WaitTimeout } from "./Eventually.ts"

export { WaitTimeout }

/** A growing log of outcomes. */
export interface OutcomeLog {
  /** Appends one outcome (use as `onOutcome`). */
  readonly record: (outcome: Outcome.Outcome) => Effect.Effect<void>
  /** Everything recorded so far, in order. */
  readonly all: Effect.Effect<ReadonlyArray<Outcome.Outcome>>
  /**
   * Waits until `condition` holds for the log, at most `timeout`: a finite duration, 0 or more
   * (anything else fails at once with a `WaitTimeout` naming it, as `Eventually`'s waits do).
   */
  readonly waitUntil: (
    condition: (outcomes: ReadonlyArray<Outcome.Outcome>) => boolean,
    timeout: Duration.Input,
    what?: string
  ) => Effect.Effect<ReadonlyArray<Outcome.Outcome>, WaitTimeout>
}

const LIMIT = 1_000_000

/** Counts outcomes by tag. */
export const countByTag = (outcomes: ReadonlyArray<Outcome.Outcome>): Record<Outcome.Tag, number> => {
  const counts: Record<Outcome.Tag, number> = {
    Committed: 0,
    Duplicate: 0,
    Expired: 0,
    Rejected: 0,
    DeadLettered: 0,
    Released: 0
  }
  for (const outcome of outcomes) counts[outcome._tag]++
  return counts
}

/** A new, empty log. */
export const make: Effect.Effect<OutcomeLog> = Effect.sync(() => {
  const outcomes: Array<Outcome.Outcome> = []
  const waiters = new Set<{
    readonly condition: (outcomes: ReadonlyArray<Outcome.Outcome>) => boolean
    readonly done: Deferred.Deferred<void>
  }>()
  const check = Effect.suspend(() =>
    Effect.forEach([...waiters], (waiter) =>
      waiter.condition(outcomes)
        ? Effect.andThen(Deferred.succeed(waiter.done, undefined), Effect.sync(() => waiters.delete(waiter)))
        : Effect.void, { discard: true })
  )
  return {
    record: (outcome) =>
      Effect.suspend(() => {
        if (outcomes.length < LIMIT) outcomes.push(outcome)
        return check
      }),
    all: Effect.sync(() => [...outcomes]),
    waitUntil: (condition, timeout, what = "the expected outcomes") =>
      Effect.gen(function*() {
        const bound = DurationInput.parse(timeout)
        if (bound === undefined || !Duration.isFinite(bound) || !(Duration.toMillis(bound) >= 0)) {
          return yield* new WaitTimeout({
            message: `cannot wait for ${what}: timeout must be a finite duration such as "15 seconds", 0 or more, ` +
              `got ${DurationInput.show(timeout)}`
          })
        }
        const done = yield* Deferred.make<void>()
        const waiter = { condition, done }
        waiters.add(waiter)
        yield* check
        // Bounded in real time, also under `TestClock` (see `Eventually`).
        yield* inRealTime(Deferred.await(done).pipe(
          Effect.timeoutOrElse({
            duration: bound,
            orElse: () =>
              Effect.fail(
                new WaitTimeout({
                  message: `waited ${Duration.format(bound)} for ${what}; saw ${
                    JSON.stringify(countByTag(outcomes))
                  }`
                })
              )
          }),
          Effect.ensuring(Effect.sync(() => waiters.delete(waiter)))
        ))
        return [...outcomes]
      })
  }
})

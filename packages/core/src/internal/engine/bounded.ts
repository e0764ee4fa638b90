/**
 * Bounded runs: a handler run (`supervised`, at `handlerTimeout`) or an `onOutcome` call, each in a
 * fiber of its own, cut at its bound by the consumer's one deadline watcher (`deadlines.ts`). The
 * run stage, the batch path and the record stage all bound their runs this way.
 */
import { Cause, Effect, Exit, Fiber } from "effect"
import type { Tagged } from "../../Classification.ts"
import type * as Deadlines from "../deadlines.ts"
import type { Shared } from "./shared.ts"
import { HandlerTimeout } from "./types.ts"

/** The bounded runs of one consumer run (`makeBounded`). */
export type BoundedRuns<A, E extends Tagged, R> = ReturnType<typeof makeBounded<A, E, R>>

/** Builds the bounded runs of one consumer run. */
export const makeBounded = <A, E extends Tagged, R>(shared: Shared<A, E, R>) => {
  const { now, deadlines } = shared

  /**
   * Runs `effect` in a fiber of its own, cut at `watcher`'s bound (then `onTimeout`) by the
   * consumer's deadline watcher instead of a timer and a race per run. The run starts at once in
   * the caller's stack, so one that completes without waiting costs no deadline at all. An
   * interruption of the caller (a shutdown past its drain, a lost lease) interrupts the run and
   * waits for it to end, so its transaction has rolled back before the delivery settles.
   */
  const bounded = <X, Y, Z, W, V>(
    effect: Effect.Effect<X, Y, Z>,
    watcher: Deadlines.Deadlines,
    onTimeout: (cutAt: number) => Effect.Effect<W, V>
  ): Effect.Effect<X | W, Y | V, Z> =>
    Effect.suspend(() => {
      const startedAt = now()
      return Effect.flatMap(Effect.forkChild(effect, { startImmediately: true }), (run) => awaitBounded(run, startedAt, watcher, onTimeout))
    })

  /** The end of `bounded`: waits for `run`, started at `startedAt`, cutting it at `watcher`'s bound. */
  const awaitBounded = <X, Y, W, V>(
    run: Fiber.Fiber<X, Y>,
    startedAt: number,
    watcher: Deadlines.Deadlines,
    onTimeout: (cutAt: number) => Effect.Effect<W, V>
  ): Effect.Effect<X | W, Y | V> => {
    const ended = run.pollUnsafe()
    if (ended !== undefined) return ended
    let cutAt: number | undefined
    const entry = watcher.add(startedAt, () => {
      cutAt = now()
      run.interruptUnsafe()
    })
    return Effect.flatMap(
      Effect.onInterrupt(Fiber.await(run), () => Effect.andThen(Fiber.interrupt(run), Effect.sync(() => watcher.withdraw(entry)))),
      (exit): Effect.Effect<X | W, Y | V> => {
        watcher.withdraw(entry)
        return cutAt !== undefined && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onTimeout(cutAt) : exit
      }
    )
  }

  /** A handler run bounded by `handlerTimeout`: past it, `HandlerTimeout` (transient). */
  const supervised = <X, Y, Z>(effect: Effect.Effect<X, Y, Z>, message: string): Effect.Effect<X, Y | HandlerTimeout, Z> =>
    bounded(effect, deadlines, (cutAt) => Effect.fail(new HandlerTimeout({ message, cutAt })))

  return { bounded, awaitBounded, supervised }
}

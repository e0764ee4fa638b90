/**
 * The dependency gate of one consumer run: whether the lifecycle's dependencies the consumer
 * pauses on (`dependencies.pauseOn`) are up. The workers ask it before each take (and wait while
 * one is down), and the run stage asks it after a transient failure whether to hold the delivery
 * until they are back instead of counting the failure (see `Consumer.make`'s `dependencies`).
 * Off (`active` false) without a managed lifecycle or with `pauseOn: "none"`: then it costs
 * nothing on the per-delivery path.
 */
import { Clock, Deferred, Duration, Effect, Exit, Fiber, Option } from "effect"
import type { DependencyDown, LifecycleShape } from "../lifecycleService.ts"
import * as Monotonic from "../monotonic.ts"

/** The gate's view for the workers and the run stage. */
export interface DependencyGate {
  /** Whether the gate can ever close (a managed lifecycle, and dependencies to pause on). */
  readonly active: boolean
  /** Whether no dependency the consumer pauses on is down, as last checked: the intake may take. */
  readonly open: () => boolean
  /** Waits until the gate is open; the first to wait logs the pause, the first to pass the resumption. */
  readonly awaitOpen: Effect.Effect<void>
  /** Logs the pause (`consumer.paused`) unless it is logged already or the gate is open: a delivery is held. */
  readonly notePaused: Effect.Effect<void>
  /** Probes the dependencies now and gives those down (none when the gate is off). */
  readonly probe: Effect.Effect<ReadonlyArray<DependencyDown>>
  /**
   * Waits until the gate is open, at most `millis` (logging the resumption once it is): `"open"`,
   * `"timeout"`, or `"stopped"` once the consumer is stopping ({@link DependencyGate.stop}).
   */
  readonly awaitOpenWithin: (millis: number) => Effect.Effect<"open" | "timeout" | "stopped">
  /**
   * The consumer is stopping: waits in `awaitOpenWithin` end at once (a held delivery is released
   * without counting its failure, instead of holding the drain until its budget runs out), and the
   * pause, if any, ends (`jetworker.paused` back to 0).
   */
  readonly stop: () => void
  /** Whether {@link DependencyGate.stop} was called. */
  readonly stopped: () => boolean
}

const inactive: DependencyGate = {
  active: false,
  open: () => true,
  awaitOpen: Effect.void,
  notePaused: Effect.void,
  probe: Effect.succeed([]),
  awaitOpenWithin: () => Effect.succeed("open"),
  stop: () => undefined,
  stopped: () => false
}

/** What a list of dependencies down says in a log line: their names, and each one's reason. */
export const describeDown = (down: ReadonlyArray<DependencyDown>): string =>
  down.map((d) => `${d.name} (${d.reason})`).join(", ")

/**
 * The gate of consumer `name` on `lifecycle`'s dependencies `pauseOn` (all, those named, or none);
 * `recordPaused` sets the consumer's `jetworker.paused` gauge (1 while paused, 0 after), and
 * `onPause`, when given, is told when a pause begins (true) and when the dependencies are back
 * (false), not when the consumer stops.
 */
export const make = (
  name: string,
  lifecycle: LifecycleShape,
  pauseOn: "all" | ReadonlyArray<string> | undefined,
  clock: Clock.Clock,
  recordPaused: (value: number) => void,
  onPause?: ((paused: boolean) => void) | undefined
): DependencyGate => {
  if (!lifecycle.managed || pauseOn === undefined) return inactive
  const names = pauseOn === "all" ? undefined : pauseOn
  // Set by the first fiber that finds the gate closed, cleared when the dependencies are back:
  // one `consumer.paused` and one `consumer.resumed` line per pause, however many fibers wait.
  let pausedAt: number | undefined
  // Notes the resumption when the dependencies are back, whoever waits meanwhile (a pause that
  // began with a hold may have no fiber waiting at the gate when it ends).
  let watching: Fiber.Fiber<void> | undefined
  let stopped = false
  const stopping = Deferred.makeUnsafe<void>()
  const open = () => lifecycle.dependenciesDown(names).length === 0
  const noteResumed = Effect.suspend(() => {
    if (pausedAt === undefined) return Effect.void
    const pausedMs = Math.round(Monotonic.millis(clock) - pausedAt)
    pausedAt = undefined
    recordPaused(0)
    onPause?.(false)
    // The dependency's `dependency.up` line is written before its state changes (which wakes this
    // fiber), so the cause is logged before its effect.
    return Effect.logInfo(`consumer ${name} resumed after ${pausedMs} ms paused: its dependencies are back`).pipe(
      Effect.annotateLogs({ event: "consumer.resumed", pausedMs })
    )
  })
  const notePaused = Effect.suspend(() => {
    if (pausedAt !== undefined || stopped) return Effect.void
    const down = lifecycle.dependenciesDown(names)
    if (down.length === 0) return Effect.void
    pausedAt = Monotonic.millis(clock)
    recordPaused(1)
    onPause?.(true)
    return Effect.andThen(
      Effect.logWarning(
        `consumer ${name} paused: ${describeDown(down)} down; taking no new deliveries until ${down.length === 1 ? "it is" : "they are"} back`
      ).pipe(Effect.annotateLogs({ event: "consumer.paused", dependencies: down.map((d) => d.name).join(","), reason: describeDown(down) })),
      Effect.flatMap(
        Effect.forkDetach(Effect.andThen(lifecycle.dependenciesUp(names), noteResumed)),
        (fiber) => Effect.sync(() => {
          watching = fiber
        })
      )
    )
  })
  return {
    active: true,
    open,
    awaitOpen: Effect.suspend(() =>
      open() ? noteResumed : Effect.andThen(notePaused, Effect.andThen(lifecycle.dependenciesUp(names), noteResumed))
    ),
    notePaused,
    probe: lifecycle.probeDependencies(names),
    awaitOpenWithin: (millis) =>
      stopped ? Effect.succeed("stopped") : Effect.raceFirst(
        Effect.flatMap(
          Effect.timeoutOption(lifecycle.dependenciesUp(names), Duration.millis(Math.max(0, millis))),
          (opened) => Option.isSome(opened) ? Effect.as(noteResumed, "open" as const) : Effect.succeed("timeout" as const)
        ),
        Effect.as(Deferred.await(stopping), "stopped" as const)
      ),
    stop: () => {
      if (stopped) return
      stopped = true
      Deferred.doneUnsafe(stopping, Exit.void)
      watching?.interruptUnsafe()
      // `onPause` is not told: the source's intake closes next, which ends what it kept.
      if (pausedAt !== undefined) {
        pausedAt = undefined
        recordPaused(0)
      }
    },
    stopped: () => stopped
  }
}

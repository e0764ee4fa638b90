/**
 * The lifecycle service as the engine and the resources see it: its shape, the unmanaged default
 * and the `Lifecycle` reference. Its own module so that both the managed lifecycle (`Lifecycle`)
 * and the resource helpers (`lifecycleResources.ts`) build on it without importing each other;
 * `Lifecycle` re-exports the public names and documents them.
 */
import { Context, Effect, Exit, type Scope } from "effect"
import type { Share } from "./shutdownBudget.ts"

/** A step of the shutdown procedure, in the order they run. */
export type Stage = "readiness" | "intake" | "drain" | "program" | "grace" | "close" | "telemetry"

/** How a stage ended: in time, cut at its share's deadline, or failed. */
export type StageResult = "completed" | "timeout" | "failed"

/** What kind of part a readiness component is. */
export type ComponentKind = "consumer" | "dependency"

/** A part of the process whose state readiness reflects; removed when its scope closes. */
export interface Component {
  /** The part works (a consumer is reserving, a dependency is reachable). */
  readonly up: Effect.Effect<void>
  /** The part does not work now; `reason` is shown on the readiness probe. */
  readonly down: (reason: string) => Effect.Effect<void>
}

/** A dependency that is down, and why (its check's failure). */
export interface DependencyDown {
  readonly name: string
  readonly reason: string
}

/** Options of {@link LifecycleShape.stage}. */
export interface StageOptions {
  /**
   * Epoch millis by which the stage must end when that comes before its share's deadline (a
   * resource's part of the close share); a later value changes nothing.
   */
  readonly endsBy?: number | undefined
}

/** The lifecycle as seen from inside the process. */
export interface LifecycleShape {
  /** Whether a worker manages the process (then stages are logged and deadlines apply). */
  readonly managed: boolean
  /** Epoch millis at which `share` ends, once shutdown has started; `undefined` otherwise. */
  readonly deadline: (share: Share) => number | undefined
  /**
   * Runs `effect` as one stage of the shutdown: bounded by `share`'s deadline, by `options.endsBy`
   * and by the end of the stage it runs in (50 ms before it, so that this stage's line comes
   * first), whichever comes first (cut and abandoned past it), and
   * reported by one `shutdown.stage` line. Inside `effect`, {@link currentDeadline} gives that end.
   * Before shutdown, or unmanaged, it just runs `effect`. Never fails.
   */
  readonly stage: <E>(
    stage: Stage,
    target: string,
    share: Share,
    effect: Effect.Effect<void, E>,
    options?: StageOptions
  ) => Effect.Effect<StageResult>
  /**
   * Registers a part whose state readiness reflects; it starts down ("starting"). A dependency
   * may give `probe`, which checks it now and sets its state (see {@link probeDependencies}).
   */
  readonly component: (name: string, kind: ComponentKind, probe?: Effect.Effect<void>) => Effect.Effect<Component, never, Scope.Scope>
  /**
   * The dependencies that are down now, as their last check (or state change) left them: those
   * named in `names`, or all of them when `names` is `undefined`. Unmanaged: none.
   */
  readonly dependenciesDown: (names: ReadonlyArray<string> | undefined) => ReadonlyArray<DependencyDown>
  /**
   * Checks the dependencies (those named, or all) now, each through its probe if it has one
   * (concurrent calls share a probe in flight; a dependency without one keeps its state), and
   * gives those down. Never fails. Unmanaged: none.
   */
  readonly probeDependencies: (names: ReadonlyArray<string> | undefined) => Effect.Effect<ReadonlyArray<DependencyDown>>
  /** Waits until none of the dependencies named (or none at all) is down; at once when none is. Unmanaged: at once. */
  readonly dependenciesUp: (names: ReadonlyArray<string> | undefined) => Effect.Effect<void>
  /** The names of the dependencies registered now (`component` of kind `dependency`). Unmanaged: none. */
  readonly dependencyNames: () => ReadonlyArray<string>
  /**
   * Epoch millis until which start-up may wait for dependencies; `undefined` means do not wait
   * (unmanaged, or start-up is over: the process has been ready once, or is stopping).
   */
  readonly startupDeadline: () => number | undefined
  /**
   * Registers the flush of a buffered telemetry channel (`traces`, `metrics`, `logs`, ...): the
   * worker runs every registered flush at once as the `telemetry` stage, each bounded by the
   * telemetry share and reported by its own stage line. A flush that fails or overruns does not
   * change the shutdown's result. Removed when the scope closes. Unmanaged: does nothing.
   */
  readonly telemetry: (channel: string, flush: Effect.Effect<void, unknown>) => Effect.Effect<void, never, Scope.Scope>
}

const noComponent: Component = { up: Effect.void, down: () => Effect.void }
const noneDown: ReadonlyArray<DependencyDown> = []

/** The lifecycle outside a worker: nothing is bounded, logged or waited for here. */
export const unmanaged: LifecycleShape = {
  managed: false,
  deadline: () => undefined,
  stage: (_stage, _target, _share, effect) =>
    Effect.exit(effect).pipe(Effect.map((exit): StageResult => (Exit.isSuccess(exit) ? "completed" : "failed"))),
  component: () => Effect.succeed(noComponent),
  dependenciesDown: () => noneDown,
  probeDependencies: () => Effect.succeed(noneDown),
  dependenciesUp: () => Effect.void,
  dependencyNames: () => [],
  startupDeadline: () => undefined,
  telemetry: () => Effect.void
}

/** The lifecycle in effect; unmanaged unless a worker provides a managed one. */
export const Lifecycle = Context.Reference<LifecycleShape>("@jetworker/core/Lifecycle", {
  defaultValue: () => unmanaged
})

/**
 * The end (epoch millis) of the shutdown stage the current fiber runs in, if any: set by a managed
 * lifecycle's `stage` for its effect, so that a stage inside another never outlives it.
 */
export const CurrentStageEnd = Context.Reference<number | undefined>("@jetworker/core/Lifecycle/CurrentStageEnd", {
  defaultValue: () => undefined
})

/**
 * Epoch millis by which work of `share` must end here: the share's deadline, or the end of the
 * stage this runs in when that comes first (a resource's part of the close share). `undefined`
 * before shutdown or unmanaged. A resource's release bounds its own waits by it (e.g. a drain).
 */
export const currentDeadline = (share: Share): Effect.Effect<number | undefined> =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle
    const end = lifecycle.deadline(share)
    if (end === undefined) return undefined
    const enclosing = yield* CurrentStageEnd
    return enclosing === undefined ? end : Math.min(end, enclosing)
  })

/**
 * The process lifecycle as the engine and the resources see it: one shutdown budget split into
 * shares, the deadline of each share once shutdown has started, one `shutdown.stage` log line per
 * stage, the readiness of the parts of the process (consumers, dependencies), and waiting for
 * dependencies at start-up.
 *
 * It does no I/O and handles no signal: `@jetworker/node`'s `Worker.runMain` makes a managed
 * lifecycle, provides it, handles signals, serves the probes and exits. Outside a worker (a test,
 * a script) the default lifecycle is unmanaged: no deadlines (each caller's own bound applies),
 * no stage lines, no waiting for dependencies, and every part counts as ready.
 *
 * The budget's shares are laid end to end from the moment shutdown starts:
 *
 * ```text
 * | readinessGrace | drain | close | telemetry | reserve |
 * ```
 *
 * Intake stops and running work starts draining at once; running work may finish until the end
 * of the drain share (readiness grace + drain after the signal); the process stays up at least the
 * readiness grace (so probes see it unready); resources close by the end of the close share and
 * telemetry is flushed by the end of its share, which leaves the reserve unused by plan. A stage
 * that overruns its share is cut there and makes the shutdown's result `timeout`, except a
 * telemetry flush: telemetry is best effort and never changes the result.
 *
 * @since 0.1.0
 */
import { type Cause, Clock, Data, Deferred, Duration, Effect, Exit, Fiber } from "effect"
import * as DurationInput from "./DurationInput.ts"
import * as ErrorSummary from "./ErrorSummary.ts"
import {
  type Component,
  type ComponentKind,
  CurrentStageEnd,
  type DependencyDown,
  type LifecycleShape,
  type Stage,
  type StageOptions,
  type StageResult,
  unmanaged
} from "./internal/lifecycleService.ts"
import * as Monotonic from "./internal/monotonic.ts"
import { type Budget, type Share, shareEnd } from "./internal/shutdownBudget.ts"

export {
  type Component,
  type ComponentKind,
  currentDeadline,
  type DependencyDown,
  Lifecycle,
  type LifecycleShape,
  type Stage,
  type StageOptions,
  type StageResult,
  unmanaged
} from "./internal/lifecycleService.ts"
export { InvalidCheckInterval, resource, waitFor, type WaitForOptions } from "./internal/lifecycleResources.ts"
export { type Budget, type BudgetOptions, InvalidBudget, makeBudget, type Share, shareEnd } from "./internal/shutdownBudget.ts"

/** Where the process is. */
export type Phase = "starting" | "running" | "stopping"

/** The state of one component, for the readiness probe. */
export interface ComponentStatus {
  readonly name: string
  readonly kind: ComponentKind
  readonly up: boolean
  readonly reason: string | undefined
}

/** What the readiness probe reports. */
export interface Readiness {
  readonly ready: boolean
  readonly phase: Phase
  readonly components: ReadonlyArray<ComponentStatus>
}

/** A lifecycle the worker drives. */
export interface Managed extends LifecycleShape {
  readonly budget: Budget
  /** The process's resources are built (readiness then waits only for its components). */
  readonly started: Effect.Effect<void>
  /** Epoch millis by which the process must first be ready. */
  readonly startupEndsAt: number
  /** Whether the process has been ready at least once (start-up is over). */
  readonly everReady: () => boolean
  /** Waits until the process is ready for the first time. */
  readonly firstReady: Effect.Effect<void>
  /** Shutdown starts now (once; later calls do nothing). Returns whether this call started it. */
  readonly begin: Effect.Effect<boolean>
  /** Epoch millis at which shutdown started, if it has. */
  readonly startedAt: () => number | undefined
  /** Whether some stage overran its share. */
  readonly overran: () => boolean
  /**
   * Whether some stage failed (a resource whose release failed), telemetry aside: the shutdown's
   * result is then `failure`, since the process did not close what it owns.
   */
  readonly stageFailed: () => boolean
  /** Marks an overrun found outside `stage` (e.g. work abandoned at a deadline). */
  readonly markOverrun: Effect.Effect<void>
  /** The readiness probe's view. */
  readonly readiness: () => Readiness
  /** The registered telemetry flushes, by channel. */
  readonly flushes: () => ReadonlyArray<readonly [channel: string, flush: Effect.Effect<void, unknown>]>
}

/** Options of a managed lifecycle. */
export interface ManagedOptions {
  readonly budget: Budget
  /**
   * Bound on start-up: from now until the process is first ready (resources built, consumers
   * reserving). Above zero; `Duration.infinity` is no bound (dependencies are waited for as long
   * as their failures may pass).
   */
  readonly startupTimeout: Duration.Input
  /**
   * When the process counts as ready: `"consumers"` (default) once at least one consumer has
   * started and every component is up; `"started"` once start-up is over and every component is up.
   */
  readonly readyWhen?: "consumers" | "started" | undefined
}

interface ComponentState {
  readonly name: string
  readonly kind: ComponentKind
  up: boolean
  reason: string | undefined
  /** A dependency's check, run now (shared while in flight); `undefined` without one. */
  readonly probe: Effect.Effect<void> | undefined
}

/**
 * One `shutdown.stage` line. A failed stage says why (`error`), at ERROR unless it is a telemetry
 * flush (best effort: it changes no result, so WARN, like a stage cut at its deadline).
 */
const logStage = (
  stage: Stage,
  target: string,
  result: StageResult,
  durationMillis: number,
  failure?: Cause.Cause<unknown>
) =>
  (result === "completed" ? Effect.logInfo : result === "failed" && stage !== "telemetry" ? Effect.logError : Effect.logWarning)(
    "shutdown.stage"
  ).pipe(
    Effect.annotateLogs({
      stage,
      target,
      result,
      durationMs: Math.round(durationMillis),
      ...(failure === undefined ? {} : { error: ErrorSummary.describe(ErrorSummary.fromCause(failure)) })
    })
  )

/**
 * How long a dependency's probe that just ended stands for a new one: the transient failures of a
 * busy consumer (serialization conflicts, a downstream that says "try again") each ask for a probe
 * while the dependency is up, and would otherwise cost a check each. An outage that begins within
 * this window after a probe is seen by the next probe after it, or by the periodic check.
 */
const probeFreshMillis = 500

/**
 * `effect` shared while it runs, and for {@link probeFreshMillis} after: a call made meanwhile waits
 * for the run in flight, or takes the one that just ended, instead of starting another.
 */
const shared = (effect: Effect.Effect<void>): Effect.Effect<void> => {
  let inFlight: Deferred.Deferred<void> | undefined
  let endedAt = Number.NEGATIVE_INFINITY
  return Effect.clockWith((clock) =>
    Effect.suspend(() => {
      if (inFlight !== undefined) return Deferred.await(inFlight)
      if (Monotonic.millis(clock) - endedAt < probeFreshMillis) return Effect.void
      const done = Deferred.makeUnsafe<void>()
      inFlight = done
      return Effect.ensuring(
        effect,
        Effect.sync(() => {
          inFlight = undefined
          endedAt = Monotonic.millis(clock)
          Deferred.doneUnsafe(done, Exit.void)
        })
      )
    })
  )
}

/** How long before its enclosing stage's end a stage inside it ends. */
const nestedStageMarginMillis = 50

/** A `startupTimeout` that is not a duration above zero; the message names the value given. */
export class InvalidStartupTimeout extends Data.TaggedError("InvalidStartupTimeout")<{ readonly message: string }> {}

/**
 * A lifecycle for a worker to drive; its start-up deadline counts from now. Fails with
 * {@link InvalidStartupTimeout} when `startupTimeout` is not a duration above zero (a string that
 * does not parse, a NaN, zero or less): a deadline already past would end start-up at once.
 */
export const makeManaged = (options: ManagedOptions): Effect.Effect<Managed, InvalidStartupTimeout> =>
  Effect.gen(function*() {
    const budget = options.budget
    const startupTimeout = DurationInput.parse(options.startupTimeout)
    if (startupTimeout === undefined || !(Duration.toMillis(startupTimeout) > 0)) {
      return yield* new InvalidStartupTimeout({
        message: `startupTimeout must be a duration above zero such as "60 seconds" (infinity: no bound), ` +
          `got ${DurationInput.show(options.startupTimeout)}`
      })
    }
    const createdAt = yield* Clock.currentTimeMillis
    const startupDeadline = createdAt + Duration.toMillis(startupTimeout)
    const readyWhen = options.readyWhen ?? "consumers"
    const components = new Set<ComponentState>()
    let phase: Phase = "starting"
    let shutdownAt: number | undefined
    let overran = false
    let stageFailed = false

    const deadline = (share: Share): number | undefined =>
      shutdownAt === undefined ? undefined : shutdownAt + shareEnd(budget, share)

    const stage = <E>(stage: Stage, target: string, share: Share, effect: Effect.Effect<void, E>, options?: StageOptions) =>
      Effect.gen(function*() {
        const shareDeadline = deadline(share)
        if (shareDeadline === undefined) return yield* unmanaged.stage(stage, target, share, effect)
        // A stage inside another (a resource's close inside the resources' close) ends a little
        // before it, so that the inner one is cut and its line written before the outer one is cut.
        const enclosing = yield* CurrentStageEnd
        const end = Math.min(shareDeadline, options?.endsBy ?? Infinity, enclosing === undefined ? Infinity : enclosing - nestedStageMarginMillis)
        const start = yield* Clock.currentTimeMillis
        // Detached, so an effect stuck in an uninterruptible region (a finalizer waiting on a
        // black-holed socket) cannot hold the procedure past the deadline: it is abandoned.
        const fiber = yield* Effect.forkDetach(Effect.provideService(effect, CurrentStageEnd, end))
        const exit = yield* Fiber.await(fiber).pipe(Effect.timeoutOption(Duration.millis(Math.max(0, end - start))))
        let result: StageResult
        let failure: Cause.Cause<unknown> | undefined
        if (exit._tag === "None") {
          result = "timeout"
          // Telemetry is best effort: a collector that is slow or gone changes no result.
          if (share !== "telemetry") overran = true
          yield* Effect.forkDetach(Fiber.interrupt(fiber))
        } else if (Exit.isSuccess(exit.value)) {
          result = "completed"
        } else {
          result = "failed"
          failure = exit.value.cause
          if (share !== "telemetry") stageFailed = true
        }
        yield* logStage(stage, target, result, (yield* Clock.currentTimeMillis) - start, failure)
        return result
      })

    // Fibers waiting for dependencies to be up (`dependenciesUp`): each re-checks its own names
    // whenever a dependency comes up or goes away.
    const dependencyWaiters = new Set<() => void>()
    const wakeDependencyWaiters = () => {
      for (const wake of [...dependencyWaiters]) wake()
    }

    const component = (name: string, kind: ComponentKind, probe?: Effect.Effect<void>) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          const state: ComponentState = { name, kind, up: false, reason: "starting", probe: probe === undefined ? undefined : shared(probe) }
          components.add(state)
          return state
        }),
        (state) =>
          Effect.sync(() => {
            components.delete(state)
            wakeDependencyWaiters()
          })
      ).pipe(
        Effect.map((state): Component => ({
          up: Effect.sync(() => {
            state.up = true
            state.reason = undefined
            noteReady()
            if (state.kind === "dependency") wakeDependencyWaiters()
          }),
          down: (reason) =>
            Effect.sync(() => {
              state.up = false
              state.reason = reason
            })
        }))
      )

    const downAmong = (names: ReadonlyArray<string> | undefined): ReadonlyArray<DependencyDown> => {
      const down: Array<DependencyDown> = []
      for (const c of components) {
        if (c.kind === "dependency" && !c.up && (names === undefined || names.includes(c.name))) {
          down.push({ name: c.name, reason: c.reason ?? "down" })
        }
      }
      return down
    }

    const probeDependencies = (names: ReadonlyArray<string> | undefined): Effect.Effect<ReadonlyArray<DependencyDown>> =>
      Effect.suspend(() => {
        const probes: Array<Effect.Effect<void>> = []
        for (const c of components) {
          if (c.kind === "dependency" && c.probe !== undefined && (names === undefined || names.includes(c.name))) probes.push(c.probe)
        }
        return Effect.as(Effect.all(probes, { concurrency: "unbounded", discard: true }), undefined)
      }).pipe(Effect.map(() => downAmong(names)))

    const dependenciesUp = (names: ReadonlyArray<string> | undefined): Effect.Effect<void> =>
      Effect.callback<void>((resume) => {
        if (downAmong(names).length === 0) return resume(Effect.void)
        const wake = () => {
          if (downAmong(names).length > 0) return
          dependencyWaiters.delete(wake)
          resume(Effect.void)
        }
        dependencyWaiters.add(wake)
        return Effect.sync(() => dependencyWaiters.delete(wake))
      })

    // Start-up lasts until the process is first ready (resources built, consumers reserving).
    let everReady = false
    const firstReady = Deferred.makeUnsafe<void>()
    const noteReady = () => {
      if (!everReady && readiness().ready) {
        everReady = true
        Deferred.doneUnsafe(firstReady, Exit.void)
      }
    }

    const readiness = (): Readiness => {
      const list = [...components].map((c) => ({ name: c.name, kind: c.kind, up: c.up, reason: c.reason }))
      const ready = phase === "running" && list.every((c) => c.up) &&
        (readyWhen === "started" || list.some((c) => c.kind === "consumer"))
      return { ready, phase, components: list }
    }

    const flushes = new Set<readonly [string, Effect.Effect<void, unknown>]>()
    const telemetry = (channel: string, flush: Effect.Effect<void, unknown>) =>
      Effect.asVoid(
        Effect.acquireRelease(
          Effect.sync(() => {
            const entry = [channel, flush] as const
            flushes.add(entry)
            return entry
          }),
          (entry) => Effect.sync(() => flushes.delete(entry))
        )
      )

    const managed: Managed = {
      managed: true,
      budget,
      deadline,
      stage,
      component,
      dependenciesDown: downAmong,
      probeDependencies,
      dependenciesUp,
      dependencyNames: () => [...components].flatMap((c) => (c.kind === "dependency" ? [c.name] : [])),
      startupDeadline: () => (everReady || phase === "stopping" ? undefined : startupDeadline),
      startupEndsAt: startupDeadline,
      everReady: () => everReady,
      firstReady: Deferred.await(firstReady),
      started: Effect.sync(() => {
        if (phase === "starting") phase = "running"
        noteReady()
      }),
      begin: Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.sync(() => {
          if (shutdownAt !== undefined) return false
          shutdownAt = now
          phase = "stopping"
          return true
        })),
      startedAt: () => shutdownAt,
      overran: () => overran,
      stageFailed: () => stageFailed,
      markOverrun: Effect.sync(() => {
        overran = true
      }),
      readiness,
      telemetry,
      flushes: () => [...flushes]
    }
    return managed
  })

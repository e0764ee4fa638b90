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
 * @since 0.2.0
 */
import { Cause, Clock, Context, Data, Deferred, Duration, Effect, Exit, Fiber, Layer, Result, Schedule, Scope } from "effect"
import * as DurationInput from "./DurationInput.ts"
import * as ErrorSummary from "./ErrorSummary.ts"

// ---------------------------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------------------------

/** How the shutdown budget is set; every share but the drain is given, the drain gets the rest. */
export interface BudgetOptions {
  /** The whole budget, signal to exit; keep it under the orchestrator's kill deadline. Default: 25 seconds. */
  readonly total?: Duration.Input | undefined
  /** How long the process stays up, unready, so that probes observe it. Default: 1 second. */
  readonly readinessGrace?: Duration.Input | undefined
  /** Closing the resources (NATS drained then closed, SQL pool, HTTP server). Default: 3 seconds. */
  readonly close?: Duration.Input | undefined
  /** Flushing telemetry. Default: 2 seconds. */
  readonly telemetry?: Duration.Input | undefined
  /** Left unused by plan, for the exit itself; must be above zero. Default: 1 second. */
  readonly reserve?: Duration.Input | undefined
}

/** A checked budget, in milliseconds. `drainMillis` is what the other shares leave of the total. */
export interface Budget {
  readonly totalMillis: number
  readonly readinessGraceMillis: number
  readonly drainMillis: number
  readonly closeMillis: number
  readonly telemetryMillis: number
  readonly reserveMillis: number
}

/** A budget whose shares do not fit; says which and why. */
export class InvalidBudget extends Data.TaggedError("InvalidBudget")<{ readonly problems: ReadonlyArray<string> }> {
  override get message(): string {
    return `invalid shutdown budget: ${this.problems.join("; ")}`
  }
}

const toMillis = (
  problems: Array<string>,
  name: string,
  input: Duration.Input | undefined,
  fallback: number
): number => {
  if (input === undefined) return fallback
  // `DurationInput.parse`: a NaN (a `Number(...)` of a bad variable) is refused, not read as 0.
  const duration = DurationInput.parse(input)
  if (duration === undefined || !Duration.isFinite(duration) || Duration.toMillis(duration) < 0) {
    problems.push(`${name} must be a finite duration, got ${String(input)}`)
    return fallback
  }
  return Duration.toMillis(duration)
}

/** Checks `options` and derives the drain share. */
export const makeBudget = (options: BudgetOptions = {}): Result.Result<Budget, InvalidBudget> => {
  const problems: Array<string> = []
  const totalMillis = toMillis(problems, "total", options.total, 25_000)
  const readinessGraceMillis = toMillis(problems, "readinessGrace", options.readinessGrace, 1_000)
  const closeMillis = toMillis(problems, "close", options.close, 3_000)
  const telemetryMillis = toMillis(problems, "telemetry", options.telemetry, 2_000)
  const reserveMillis = toMillis(problems, "reserve", options.reserve, 1_000)
  if (reserveMillis <= 0) problems.push("reserve must be above zero")
  const drainMillis = totalMillis - readinessGraceMillis - closeMillis - telemetryMillis - reserveMillis
  if (problems.length === 0 && drainMillis <= 0) {
    problems.push(
      `total ${totalMillis} ms leaves no drain share after readinessGrace ${readinessGraceMillis} ms, ` +
        `close ${closeMillis} ms, telemetry ${telemetryMillis} ms and reserve ${reserveMillis} ms`
    )
  }
  return problems.length > 0
    ? Result.fail(new InvalidBudget({ problems }))
    : Result.succeed({ totalMillis, readinessGraceMillis, drainMillis, closeMillis, telemetryMillis, reserveMillis })
}

/** A share of the budget that bounds waits: each ends at a deadline counted from the signal. */
export type Share = "readinessGrace" | "drain" | "close" | "telemetry"

/** Milliseconds from the start of shutdown to the end of `share`. */
export const shareEnd = (budget: Budget, share: Share): number => {
  const grace = budget.readinessGraceMillis
  const drain = grace + budget.drainMillis
  const close = drain + budget.closeMillis
  switch (share) {
    case "readinessGrace":
      return grace
    case "drain":
      return drain
    case "close":
      return close
    case "telemetry":
      return close + budget.telemetryMillis
  }
}

// ---------------------------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------------------------

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

/** The lifecycle as seen from inside the process. */
export interface LifecycleShape {
  /** Whether a worker manages the process (then stages are logged and deadlines apply). */
  readonly managed: boolean
  /** Epoch millis at which `share` ends, once shutdown has started; `undefined` otherwise. */
  readonly deadline: (share: Share) => number | undefined
  /**
   * Runs `effect` as one stage of the shutdown: bounded by `share`'s deadline (cut and abandoned
   * past it) and reported by one `shutdown.stage` line. Before shutdown, or unmanaged, it just
   * runs `effect`. Never fails.
   */
  readonly stage: <E>(stage: Stage, target: string, share: Share, effect: Effect.Effect<void, E>) => Effect.Effect<StageResult>
  /** Registers a part whose state readiness reflects; it starts down ("starting"). */
  readonly component: (name: string, kind: ComponentKind) => Effect.Effect<Component, never, Scope.Scope>
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

/** The lifecycle outside a worker: nothing is bounded, logged or waited for here. */
export const unmanaged: LifecycleShape = {
  managed: false,
  deadline: () => undefined,
  stage: (_stage, _target, _share, effect) =>
    Effect.exit(effect).pipe(Effect.map((exit): StageResult => (Exit.isSuccess(exit) ? "completed" : "failed"))),
  component: () => Effect.succeed(noComponent),
  startupDeadline: () => undefined,
  telemetry: () => Effect.void
}

/** The lifecycle in effect; unmanaged unless a worker provides a managed one. */
export const Lifecycle = Context.Reference<LifecycleShape>("@jetworker/core/Lifecycle", {
  defaultValue: () => unmanaged
})

// ---------------------------------------------------------------------------------------------
// A managed lifecycle
// ---------------------------------------------------------------------------------------------

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

    const stage = <E>(stage: Stage, target: string, share: Share, effect: Effect.Effect<void, E>) =>
      Effect.gen(function*() {
        const end = deadline(share)
        if (end === undefined) return yield* unmanaged.stage(stage, target, share, effect)
        const start = yield* Clock.currentTimeMillis
        // Detached, so an effect stuck in an uninterruptible region (a finalizer waiting on a
        // black-holed socket) cannot hold the procedure past the deadline: it is abandoned.
        const fiber = yield* Effect.forkDetach(effect)
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

    const component = (name: string, kind: ComponentKind) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          const state: ComponentState = { name, kind, up: false, reason: "starting" }
          components.add(state)
          return state
        }),
        (state) => Effect.sync(() => components.delete(state))
      ).pipe(
        Effect.map((state): Component => ({
          up: Effect.sync(() => {
            state.up = true
            state.reason = undefined
            noteReady()
          }),
          down: (reason) =>
            Effect.sync(() => {
              state.up = false
              state.reason = reason
            })
        }))
      )

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

// ---------------------------------------------------------------------------------------------
// Helpers for resources and start-up
// ---------------------------------------------------------------------------------------------

/**
 * A {@link resource}'s `checkInterval` that is not a positive, finite duration; the message names
 * the resource and the value given.
 */
export class InvalidCheckInterval extends Data.TaggedError("InvalidCheckInterval")<{ readonly message: string }> {}

/**
 * Wraps a resource's Layer so that the worker's shutdown closes it as one `close` stage named
 * `name`, bounded by the close share (abandoned past it). With `check`, readiness reflects it too:
 * a dependency component, up once built, probed every `checkInterval` (default 5 seconds; each
 * probe bounded by the same) and down while the check fails, dies or is interrupted; each change
 * is logged once (`dependency.down`, a warning with the reason, and `dependency.up`). Probing goes
 * on until the resource is closed, whatever a check did.
 *
 * A `checkInterval` that is not a positive, finite duration (a string that does not parse, a NaN,
 * zero or less, infinite) fails the layer with {@link InvalidCheckInterval} before `layer` is
 * built, under a worker or not.
 */
export const resource = <ROut, E, RIn, X = unknown, CE = unknown>(
  name: string,
  layer: Layer.Layer<ROut, E, RIn>,
  options: {
    readonly check?: Effect.Effect<X, CE, ROut> | undefined
    readonly checkInterval?: Duration.Input | undefined
  } = {}
): Layer.Layer<ROut, E | InvalidCheckInterval, RIn> =>
  Layer.effectContext(
    Effect.gen(function*() {
      // Checked first and whether or not the lifecycle is managed, so that a bad value fails in
      // tests too, not only under a worker; 0 would probe in a hot loop. `DurationInput.parse`: a
      // NaN (a `Number(...)` of a bad variable) is refused, not read as 0.
      const interval = DurationInput.parse(options.checkInterval ?? "5 seconds")
      if (interval === undefined || !(Duration.toMillis(interval) > 0) || !Duration.isFinite(interval)) {
        return yield* new InvalidCheckInterval({
          message: `Lifecycle.resource(${name}): checkInterval must be a positive, finite duration such as "5 seconds", ` +
            `got ${DurationInput.show(options.checkInterval)}`
        })
      }
      const lifecycle = yield* Lifecycle
      const inner = yield* Scope.make()
      yield* Effect.addFinalizer((exit) => lifecycle.stage("close", name, "close", Scope.close(inner, exit)))
      const context = yield* Layer.buildWithScope(layer, inner)
      if (options.check !== undefined && lifecycle.managed) {
        const component = yield* lifecycle.component(name, "dependency")
        yield* component.up
        // Each change is logged once (readiness alone would tell only who asks): a warning when
        // the check starts failing, with why, and a line when it passes again.
        let up = true
        const probe = options.check.pipe(
          Effect.timeout(interval),
          Effect.provideContext(context),
          // On the cause, not only the typed error: a check that throws or whose promise rejects
          // (a defect) is the dependency down too, and must not end the loop, which would leave
          // readiness up for the rest of the process.
          Effect.matchCauseEffect({
            onSuccess: () => {
              if (up) return component.up
              up = true
              return Effect.andThen(
                component.up,
                Effect.logInfo(`dependency ${name} is back`).pipe(Effect.annotateLogs({ event: "dependency.up", dependency: name }))
              )
            },
            onFailure: (cause) => {
              const reason = ErrorSummary.fromCause(cause).message
              if (!up) return component.down(reason)
              up = false
              return Effect.andThen(
                component.down(reason),
                Effect.logWarning(`dependency ${name} is down: ${reason}; readiness is down until its check passes`).pipe(
                  Effect.annotateLogs({ event: "dependency.down", dependency: name, reason })
                )
              )
            }
          })
        )
        yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(interval), probe)))
      }
      return context
    })
  )

/** Options of {@link waitFor}. */
export interface WaitForOptions<E> {
  /** Whether a failure may pass with time (e.g. connection refused). Default: every failure. */
  readonly while?: ((error: E) => boolean) | undefined
}

/**
 * Runs `effect`, the first contact with dependency `name`; under a worker that is still starting,
 * retries it (jittered backoff from 200 ms to 2 s) while the failure may pass and the start-up
 * deadline allows, logging one `startup.waiting` line per failed try. Unmanaged, it runs once.
 */
export const waitFor = <A, E, R>(
  name: string,
  effect: Effect.Effect<A, E, R>,
  options: WaitForOptions<E> = {}
): Effect.Effect<A, E, R> =>
  Lifecycle.use((lifecycle) => {
    const deadline = lifecycle.startupDeadline()
    if (deadline === undefined) return effect
    const retryable = options.while ?? (() => true)
    let attempt = 0
    const schedule = Schedule.exponential("200 millis").pipe(
      Schedule.jittered,
      Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, Duration.seconds(2)))),
      Schedule.setInputType<E>(),
      Schedule.while(({ input, now, duration }) => retryable(input) && now + Duration.toMillis(duration) < deadline)
    )
    return effect.pipe(
      Effect.tapError((error) => {
        attempt++
        const summary = ErrorSummary.fromError(error)
        return Effect.logWarning("startup.waiting").pipe(
          Effect.annotateLogs({ dependency: name, attempt, error: ErrorSummary.describe(summary) })
        )
      }),
      Effect.retry(schedule)
    )
  })

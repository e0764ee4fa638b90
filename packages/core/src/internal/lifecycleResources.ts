/**
 * How resources and dependencies take part in the lifecycle: `resource` closes a resource's layer
 * as a shutdown stage and, with a check, makes it a readiness component; `waitFor` waits for a
 * dependency at start-up. `Lifecycle` re-exports the public names and documents them.
 */
import { Clock, Data, Duration, Effect, Layer, Schedule, Scope } from "effect"
import * as DurationInput from "../DurationInput.ts"
import * as ErrorSummary from "../ErrorSummary.ts"
import { currentDeadline, Lifecycle, type LifecycleShape } from "./lifecycleService.ts"

/** How many `resource`s are built and not yet closed, per lifecycle: each closes within its part. */
const openResources = new WeakMap<LifecycleShape, { count: number }>()

/**
 * Closes one resource as a `close` stage. With `open` resources still to close (this one among
 * them), it may take an equal part of what is left of the close share, the last one all of it:
 * one that hangs (a pool waiting on a black-holed socket) is cut and named by its own line, and
 * leaves time for the others (NATS still drains).
 */
const closeStage = (lifecycle: LifecycleShape, name: string, close: Effect.Effect<void>, open: { count: number }) =>
  Effect.gen(function*() {
    const end = yield* currentDeadline("close")
    const parts = open.count
    open.count--
    if (end === undefined || parts <= 1) return yield* lifecycle.stage("close", name, "close", close)
    const now = yield* Clock.currentTimeMillis
    return yield* lifecycle.stage("close", name, "close", close, { endsBy: now + Math.max(0, end - now) / parts })
  })

/**
 * A {@link resource}'s `checkInterval` that is not a positive, finite duration; the message names
 * the resource and the value given.
 */
export class InvalidCheckInterval extends Data.TaggedError("InvalidCheckInterval")<{ readonly message: string }> {}

/**
 * Wraps a resource's Layer so that the worker's shutdown closes it as one `close` stage named
 * `name`, bounded by the close share (abandoned past it). Resources close one after another; each
 * may take an equal part of what is left of the share among the resources still open, the last
 * one all of it, so that one whose close hangs is named by its own `timeout` line and the others
 * still close in time. A release that waits (a drain) bounds itself by `Lifecycle.currentDeadline`.
 * With `check`, readiness reflects it too:
 * a dependency component, up once built, probed every `checkInterval` (default 5 seconds; each
 * probe bounded by the same) and down while the check fails, dies or is interrupted; each change
 * is logged once (`dependency.down`, a warning with the reason, and `dependency.up`). Probing goes
 * on until the resource is closed, whatever a check did. A consumer whose handler fails while the
 * check still passes probes it at once (one probe at a time, shared), so that an outage pauses
 * the consumer without waiting for the next interval (see `Consumer.make`'s `dependencies`).
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
      let open = openResources.get(lifecycle)
      if (open === undefined) openResources.set(lifecycle, open = { count: 0 })
      const counted = open
      counted.count++
      yield* Effect.addFinalizer((exit) => closeStage(lifecycle, name, Scope.close(inner, exit), counted))
      const context = yield* Layer.buildWithScope(layer, inner)
      if (options.check !== undefined && lifecycle.managed) {
        // The probe below, also run at once when the engine asks (a handler's failure that the
        // dependency's outage may explain): a reference, since the probe needs the component.
        let probeNow: Effect.Effect<void> = Effect.void
        const component = yield* lifecycle.component(name, "dependency", Effect.suspend(() => probeNow))
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
              // The line first: marking it up wakes the consumers paused on it, whose
              // `consumer.resumed` lines must follow the cause.
              return Effect.andThen(
                Effect.logInfo(`dependency ${name} is back`).pipe(Effect.annotateLogs({ event: "dependency.up", dependency: name })),
                component.up
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
        probeNow = probe
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

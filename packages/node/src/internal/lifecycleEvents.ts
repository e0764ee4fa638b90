/**
 * `LOG_LEVEL` for a worker process: it filters every line except the lifecycle events, which are
 * written whatever the level, at their own level. An operator who sets `Warn` to keep only the
 * problems still reads when the process became ready, which port it serves, and exactly one
 * `shutdown.started` and one `shutdown.completed` (BE-SHUT-007).
 *
 * The lifecycle events are the lines named `worker.*`, `startup.*`, `shutdown.*` and `health.*`,
 * plus `telemetry.unavailable`, and the lines whose `event` annotation is `dependency.*` (a
 * dependency's readiness going down and back up: `Warn` must not keep the one without the other),
 * `consumer.paused` or `consumer.resumed` (a consumer pausing on such a dependency, and resuming).
 * They are matched by name because they are written from several modules (the worker, the
 * lifecycle's stages and resources, the health server), none of which knows the level.
 * Effect drops a line below `References.MinimumLogLevel` before any logger sees it, so the fiber's
 * minimum is lowered to `Info` at most (the least severe lifecycle event) and each logger gets the
 * operator's level as a filter of its own.
 */
import { Context, Effect, Logger, LogLevel, References } from "effect"

const NAMESPACES = ["worker.", "startup.", "shutdown.", "health."]
const EVENTS = new Set(["telemetry.unavailable"])
// Lines with a free-text message that name their event in an `event` annotation.
const EVENT_NAMESPACES = ["dependency."]
const EVENT_NAMES = new Set(["consumer.paused", "consumer.resumed"])

/** Whether a log call (its message, or its `event` annotation) is a lifecycle event. */
export const isLifecycleEvent = (options: Logger.Options<unknown>): boolean => {
  const first: unknown = Array.isArray(options.message) ? options.message[0] : options.message
  if (typeof first === "string" && (EVENTS.has(first) || NAMESPACES.some((prefix) => first.startsWith(prefix)))) {
    return true
  }
  const event = options.fiber.getRef(References.CurrentLogAnnotations).event
  return typeof event === "string" && (EVENT_NAMES.has(event) || EVENT_NAMESPACES.some((prefix) => event.startsWith(prefix)))
}

// Loggers that already filter, so that a set wrapped twice (the worker's, then the telemetry
// layer's that merged with it) filters each logger once.
const filtering = new WeakSet<Logger.Logger<unknown, unknown>>()

/** `logger`, passed only the lines at `minimum` or above and the lifecycle events. */
export const atLevel = (logger: Logger.Logger<unknown, unknown>, minimum: LogLevel.LogLevel): Logger.Logger<unknown, unknown> => {
  if (filtering.has(logger)) return logger
  const filtered = Logger.make<unknown, void>((options) => {
    if (LogLevel.isGreaterThanOrEqualTo(options.logLevel, minimum) || isLifecycleEvent(options)) {
      logger.log(options)
    }
  })
  filtering.add(filtered)
  return filtered
}

const filterAll = (loggers: ReadonlySet<Logger.Logger<unknown, unknown>>, minimum: LogLevel.LogLevel) =>
  new Set([...loggers].map((logger) => atLevel(logger, minimum)))

/** The fiber's minimum: lifecycle events (`Info` and above) must reach the loggers. */
const fiberMinimum = (level: LogLevel.LogLevel): LogLevel.LogLevel =>
  LogLevel.isGreaterThan(level, "Info") ? "Info" : level

/** Runs `effect` with the operator's `level`: every logger filters by it, lifecycle events pass. */
export const withLevel = (level: LogLevel.LogLevel) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  effect.pipe(
    Effect.updateService(Logger.CurrentLoggers, (loggers) => filterAll(loggers, level)),
    Effect.provideService(References.MinimumLogLevel, fiberMinimum(level))
  )

/** `context` with the loggers it sets (a telemetry layer's, e.g. OTLP logs) filtered by `level` too. */
export const filterContext = <R>(context: Context.Context<R>, level: LogLevel.LogLevel): Context.Context<R> => {
  // A raw lookup: a context that sets no loggers keeps inheriting the worker's.
  const loggers = Context.getOrUndefined(context, Logger.CurrentLoggers)
  return loggers === undefined ? context : Context.add(context, Logger.CurrentLoggers, filterAll(loggers, level))
}

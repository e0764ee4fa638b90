/**
 * The one entry point of a worker process: `Worker.runMain(program, { layer })`. It builds the
 * process's resources (`layer`, bounded by the start-up timeout, readiness 503 meanwhile), runs
 * `program` with them, serves the health probes and metrics, and runs exactly one shutdown
 * procedure when the first SIGTERM or SIGINT arrives, when `program` fails (a source that failed
 * for good), or when it completes. Then it exits: 0 on `success`, 1 on `failure`, 3 on `timeout`.
 *
 * The shutdown procedure, each step bounded by its share of the budget (see `Lifecycle`) and
 * reported by one `shutdown.stage` JSON line:
 *
 * 1. `shutdown.started` (with the signal); readiness turns 503 (`readiness`);
 * 2. `program` is interrupted: consumers stop reserving and release what they buffered
 *    (`intake`), running handlers finish until the drain share ends and are interrupted after it
 *    (`drain`; their transactions roll back, their messages are released, never acked);
 *    `program` waits for the program to end, at most until the close share ends;
 * 3. the process stays up until the readiness grace has passed (`grace`);
 * 4. the resources close in reverse order of acquisition (`close`, one line per resource wrapped
 *    with `Lifecycle.resource`, one for the resource scope as a whole, one for the health server);
 * 5. telemetry is flushed (`telemetry`, one line per channel: traces, metrics, logs, and the
 *    stdout logger); a slow or unreachable collector is cut at the end of the telemetry share
 *    and changes no result;
 * 6. `shutdown.completed` with `result` (`success`, `timeout` or `failure`), `durationMs`,
 *    `budgetMs` and `signal`. `failure` when the program failed, or when a resource failed to
 *    close (its stage line, `failed`, carries the `error`); a failed telemetry flush changes no
 *    result.
 *
 * A repeated or concurrent signal is logged (`shutdown.signal_ignored`) and changes nothing: it
 * starts no second procedure, closes nothing twice and does not extend any wait. A failing
 * handler never starts a shutdown (the engine turns it into an outcome). Every line the process
 * writes is one JSON object (`JsonLogger`); `LOG_LEVEL` filters all of them but the lifecycle
 * events (`worker.*`, `startup.*`, `shutdown.*`, `health.*`, `telemetry.unavailable`, and the
 * lines with `event` `dependency.*`, `consumer.paused` or `consumer.resumed`), which are always written. There is no separate error
 * reporter: errors are log lines (and, with telemetry, spans).
 *
 * @since 0.1.0
 */
import { ErrorSummary, Lifecycle } from "@jetworker/core"
import {
  Cause,
  Clock,
  Config,
  Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  type LogLevel,
  Result,
  Scope
} from "effect"
import * as HealthServer from "./HealthServer.ts"
import * as LifecycleEvents from "./internal/lifecycleEvents.ts"
import { nextStep } from "./internal/nextStep.ts"
import * as FromEnv from "./internal/settingsFromEnv.ts"
import * as JsonLogger from "./JsonLogger.ts"

/** A stop signal the worker handles. */
export type Signal = "SIGTERM" | "SIGINT"

/** How a shutdown ended. */
export type ShutdownResult = "success" | "timeout" | "failure"

/** The exit code of each result. */
export const exitCodes: Readonly<Record<ShutdownResult, number>> = { success: 0, failure: 1, timeout: 3 }

/** The worker's settings; `settings` reads them from the environment. */
export interface Settings {
  /** `SHUTDOWN_BUDGET`, default `25 seconds`: signal to exit. */
  readonly budget: Duration.Duration
  /** `SHUTDOWN_READINESS_GRACE`, default `1 second`: how long the process stays up, unready. */
  readonly readinessGrace: Duration.Duration
  /** `SHUTDOWN_CLOSE`, default `3 seconds`: the share for closing resources. */
  readonly close: Duration.Duration
  /** `SHUTDOWN_TELEMETRY`, default `2 seconds`: the share for flushing telemetry. */
  readonly telemetry: Duration.Duration
  /** `SHUTDOWN_RESERVE`, default `1 second`: left unused by plan. */
  readonly reserve: Duration.Duration
  /**
   * `STARTUP_TIMEOUT`, default `60 seconds`, positive and finite: bound on building the resources
   * (waiting for dependencies).
   */
  readonly startupTimeout: Duration.Duration
  /** `HEALTH_PORT`, default 8080, from 0 to 65535; 0 picks a free port; `off` serves no probes. */
  readonly healthPort: number | "off"
  /** `HEALTH_HOST`, default `0.0.0.0`. */
  readonly healthHost: string
  /** `HEALTH_MAX_EVENT_LOOP_LAG`, default `5 seconds`, positive and finite: past it `/healthz/live` answers 503. */
  readonly maxEventLoopLag: Duration.Duration
  /**
   * `HEALTH_MAX_CONNECTIONS`, default 64, from 1 to 65535: the health server's open connections at
   * most (probes and scrapes); one past it is closed as soon as it is accepted (see
   * `HealthServer.make`'s `maxConnections`).
   */
  readonly healthMaxConnections: number
  /**
   * `LOG_LEVEL`, default `Info`: the least severe level written (`Debug` adds a line per committed
   * and duplicate message; `Warn` keeps only problems). One of `All`, `Trace`, `Debug`, `Info`,
   * `Warn`, `Error`, `Fatal`, `None`, in any case (`debug`). The lifecycle events (`worker.*`, `startup.*`, `shutdown.*`,
   * `health.*`, `telemetry.unavailable`, and `event` `dependency.*`, `consumer.paused` or
   * `consumer.resumed`) are written whatever the
   * level, at their own level.
   */
  readonly logLevel: LogLevel.LogLevel
  /**
   * `LOG_BUFFER_BYTES`, default 8 MiB (8388608), from 65536 to 1073741824: the bytes of log lines
   * the process holds for stdout at most when its reader falls behind; past it, lines are dropped
   * and counted (`log.dropped`), never held without bound (see `JsonLogger.make`).
   */
  readonly logBufferBytes: number
}

/** The range of `LOG_BUFFER_BYTES`. */
const LOG_BUFFER_BYTES = { min: 65_536, max: 1_073_741_824 }

/** The range of `HEALTH_MAX_CONNECTIONS`. */
const HEALTH_MAX_CONNECTIONS = { min: 1, max: 65_535 }

/** The variable each number or duration of {@link Settings} is read from. */
const VARIABLES = {
  budget: "SHUTDOWN_BUDGET",
  readinessGrace: "SHUTDOWN_READINESS_GRACE",
  close: "SHUTDOWN_CLOSE",
  telemetry: "SHUTDOWN_TELEMETRY",
  reserve: "SHUTDOWN_RESERVE",
  startupTimeout: "STARTUP_TIMEOUT",
  maxEventLoopLag: "HEALTH_MAX_EVENT_LOOP_LAG",
  healthMaxConnections: "HEALTH_MAX_CONNECTIONS",
  logBufferBytes: "LOG_BUFFER_BYTES"
} as const

/** The text each setting was read from, when it came from the environment: quoted in its refusal. */
type Given = Partial<Record<keyof typeof VARIABLES, string>>

/**
 * Why `value`, read from `name`, is outside `range`; `undefined` when it is inside. `text`: what the
 * environment gave, shown rather than the number (a value given in code is shown as it is).
 */
const outOfRange = (
  name: string,
  value: number,
  range: { readonly min: number; readonly max: number },
  text: string | undefined
): string | undefined =>
  value >= range.min && value <= range.max
    ? undefined
    : `${name} must be from ${range.min} to ${range.max}, got ${text === undefined ? String(value) : JSON.stringify(text)}`

/**
 * Why `duration`, read from `name`, cannot be used where only a positive, finite duration makes
 * sense (a lag of 0 fails every liveness probe, a start-up timeout of 0 has already run out);
 * `undefined` when it can. `text`: what the environment gave, shown rather than the duration
 * (`"0 seconds"`, not `0`).
 */
const notPositiveFinite = (name: string, duration: Duration.Duration, text: string | undefined): string | undefined =>
  Duration.isFinite(duration) && Duration.toMillis(duration) > 0
    ? undefined
    : `${name} must be a positive, finite duration, got ${text === undefined ? Duration.format(duration) : JSON.stringify(text)}`

/**
 * Reads {@link Settings} from the environment (managed configuration). A value that cannot be
 * used fails with one line naming the variable, what it takes and the value given (see
 * `describeConfigError`): `LOG_LEVEL` in any case; durations as `"25 seconds"`; the `SHUTDOWN_*`
 * shares not negative; `HEALTH_PORT` a port or `off`; `LOG_BUFFER_BYTES` and
 * `HEALTH_MAX_CONNECTIONS` integers. What the values must be together (a budget whose shares fit,
 * a positive start-up timeout, a buffer and a connection limit within their ranges) is checked by {@link settingsProblems}; {@link readSettings} does both, as `run` does,
 * and quotes in each refusal the text the environment gave (`got "0 seconds"`).
 */
export const settings: Config.Config<Settings> = Config.all({
  budget: FromEnv.duration("SHUTDOWN_BUDGET", "25 seconds", { nonNegative: true }),
  readinessGrace: FromEnv.duration("SHUTDOWN_READINESS_GRACE", "1 second", { nonNegative: true }),
  close: FromEnv.duration("SHUTDOWN_CLOSE", "3 seconds", { nonNegative: true }),
  telemetry: FromEnv.duration("SHUTDOWN_TELEMETRY", "2 seconds", { nonNegative: true }),
  reserve: FromEnv.duration("SHUTDOWN_RESERVE", "1 second", { nonNegative: true }),
  startupTimeout: FromEnv.duration("STARTUP_TIMEOUT", "60 seconds"),
  healthPort: FromEnv.port("HEALTH_PORT", "8080"),
  healthHost: Config.String("HEALTH_HOST").pipe(Config.withDefault("0.0.0.0")),
  maxEventLoopLag: FromEnv.duration("HEALTH_MAX_EVENT_LOOP_LAG", "5 seconds"),
  healthMaxConnections: FromEnv.integer("HEALTH_MAX_CONNECTIONS", HealthServer.defaultMaxConnections, HEALTH_MAX_CONNECTIONS),
  logLevel: FromEnv.logLevel("LOG_LEVEL"),
  logBufferBytes: FromEnv.integer("LOG_BUFFER_BYTES", JsonLogger.defaultMaxBufferedBytes, LOG_BUFFER_BYTES)
})

/** One reason `run` refuses its settings, worded as its `worker.invalid_settings` line. */
export interface SettingsProblem {
  /** One line naming the variable, what it takes and the value given. */
  readonly error: string
  /** What to do, when the error alone does not say it. */
  readonly nextStep?: string | undefined
}

/** The shutdown budget of `settings` (its `SHUTDOWN_*` shares). */
const budgetOf = (s: Settings) =>
  Lifecycle.makeBudget({ total: s.budget, readinessGrace: s.readinessGrace, close: s.close, telemetry: s.telemetry, reserve: s.reserve })

/**
 * Every reason `run` refuses to start with `settings`, in the order it checks them; empty when it
 * would start. This is the one place those checks live: `run` refuses on the first problem, and
 * `jetworker config check` reports each, so the two cannot disagree. Values are shown as they are
 * in `s` (a duration formatted); {@link readSettings} quotes the environment's text instead.
 */
export const settingsProblems = (s: Settings): ReadonlyArray<SettingsProblem> => problemsOf(s, {})

/** {@link settingsProblems}, quoting the text of each setting `given` by the environment. */
const problemsOf = (s: Settings, given: Given): ReadonlyArray<SettingsProblem> => {
  const problems: Array<SettingsProblem> = []
  // Checked before listening: with a port, the host would fail as a name that does not resolve.
  const hostProblem = s.healthPort === "off" ? undefined : FromEnv.hostWithPort(s.healthHost)
  if (hostProblem !== undefined) {
    problems.push({
      error: hostProblem,
      nextStep: "set HEALTH_HOST to the host or address alone (e.g. 0.0.0.0), and the port with HEALTH_PORT"
    })
  }
  // From the environment a port that is not one is refused as it is read; this is one given in code.
  if (s.healthPort !== "off" && !(Number.isInteger(s.healthPort) && s.healthPort >= 0 && s.healthPort <= 65535)) {
    problems.push({ error: `HEALTH_PORT must be a port (0-65535) or "off", got ${s.healthPort}` })
  }
  for (
    const problem of [
      outOfRange("LOG_BUFFER_BYTES", s.logBufferBytes, LOG_BUFFER_BYTES, given.logBufferBytes),
      outOfRange("HEALTH_MAX_CONNECTIONS", s.healthMaxConnections, HEALTH_MAX_CONNECTIONS, given.healthMaxConnections)
    ]
  ) {
    if (problem !== undefined) problems.push({ error: problem })
  }
  for (
    const problem of [
      notPositiveFinite("HEALTH_MAX_EVENT_LOOP_LAG", s.maxEventLoopLag, given.maxEventLoopLag),
      notPositiveFinite("STARTUP_TIMEOUT", s.startupTimeout, given.startupTimeout)
    ]
  ) {
    if (problem !== undefined) problems.push({ error: problem })
  }
  const budget = budgetOf(s)
  if (Result.isFailure(budget)) {
    // The budget names its shares as options, in milliseconds; the operator set them as variables,
    // each named with the text given (a share left to its default is named alone).
    const share = (option: string, key: "budget" | "readinessGrace" | "close" | "telemetry" | "reserve") =>
      `${option} ${VARIABLES[key]}${given[key] === undefined ? "" : ` ${JSON.stringify(given[key])}`}`
    problems.push({
      error: `${budget.failure.message} (${share("total is", "budget")}, ${share("readinessGrace", "readinessGrace")}, ` +
        `${share("close", "close")}, ${share("telemetry", "telemetry")}, ${share("reserve", "reserve")})`
    })
  }
  return problems
}

/** Settings `run` refuses to start with: `problems` holds each reason, never none. */
export class InvalidSettings extends Data.TaggedError("InvalidSettings")<{
  readonly message: string
  readonly problems: ReadonlyArray<SettingsProblem>
}> {}

const invalid = (problems: ReadonlyArray<SettingsProblem>) =>
  new InvalidSettings({ message: problems.map((p) => p.error).join("; "), problems })

/**
 * The settings as `run` takes them: {@link settings} read from the current `ConfigProvider`,
 * `overrides` on top, then checked by {@link settingsProblems}; with their shutdown budget. Fails
 * with {@link InvalidSettings} when `run` would refuse them: one problem when a value cannot be
 * read (worded as `run` writes it), otherwise every problem found, each quoting the text the
 * environment gave for the setting (a value from `overrides` is shown as given in code).
 */
export const readSettings = (
  overrides?: Partial<Settings>
): Effect.Effect<{ readonly settings: Settings; readonly budget: Lifecycle.Budget }, InvalidSettings> =>
  Effect.gen(function*() {
    const read = yield* Effect.result(settings)
    if (Result.isFailure(read)) return yield* invalid([{ error: FromEnv.describeConfigError(read.failure) }])
    const s: Settings = { ...read.success, ...overrides }
    // The environment's text of each setting that `overrides` does not replace, for its refusal.
    const texts = yield* Effect.orElseSucceed(FromEnv.given(VARIABLES), (): Given => ({}))
    const given: Given = Object.fromEntries(
      Object.entries(texts).filter(([key]) => overrides === undefined || !(key in overrides))
    )
    const problems = problemsOf(s, given)
    const budget = budgetOf(s)
    if (problems.length > 0 || Result.isFailure(budget)) return yield* invalid(problems)
    return { settings: s, budget: budget.success }
  })

/** What `runMain` takes besides the program. */
export interface Options<ROut, LE, TE = never> {
  /**
   * Telemetry export (e.g. `Otlp.layerFromEnv` of `@jetworker/opentelemetry`): built first, so
   * that the resources and the program run with its tracer and loggers; its channels register
   * their flushes with the lifecycle, which runs them in the `telemetry` stage, last. A failure to
   * build it is logged and the worker runs without it (telemetry never stops the work).
   * Default: none (logs go to stdout only; metrics are served on `/metrics`).
   */
  readonly telemetry?: Layer.Layer<never, TE> | undefined
  /**
   * The process's resources (NATS connection, SQL pool, ...), built before `program` runs and
   * closed by the shutdown procedure after it ended. Wrap each with `Lifecycle.resource(name, ...)`
   * to get one `close` stage line per resource, bounded by its part of the close share; a layer
   * whose stop talks to a dependency (an outbox relay rolling back its round) is worth wrapping
   * too, so that a hang there is cut and named rather than taking the share. Default: none.
   */
  readonly layer?: Layer.Layer<ROut, LE> | undefined
  /** Settings that override the environment's. Default: all from the environment. */
  readonly settings?: Partial<Settings> | undefined
  /** See `Lifecycle.ManagedOptions.readyWhen`. Default: `"consumers"`. */
  readonly readyWhen?: "consumers" | "started" | undefined
}

/** Building the resources took longer than the start-up timeout. */
export class StartupTimeout extends Data.TaggedError("StartupTimeout")<{ readonly message: string }> {}

const signalIgnored = (signal: Signal) =>
  Effect.runFork(
    Effect.logWarning("shutdown.signal_ignored").pipe(
      Effect.annotateLogs({ signal, reason: "a shutdown procedure is already running" }),
      Effect.provide(JsonLogger.layer)
    )
  )

/** Why the health server could not listen (Node's error code and message), and what to do. */
const describeListenError = (cause: unknown, port: number): { readonly error: string; readonly nextStep: string } => {
  const code = typeof cause === "object" && cause !== null && "code" in cause ? String(cause.code) : undefined
  const text = cause instanceof Error ? cause.message : String(cause)
  switch (code) {
    case "EADDRINUSE":
      return {
        error: `the port is in use (${text})`,
        nextStep: `another process listens on port ${port}: set HEALTH_PORT to a free port (0 picks one), or to "off"`
      }
    case "EACCES":
      return {
        error: `not allowed to listen (${text})`,
        nextStep: `ports below 1024 need privileges: set HEALTH_PORT to a port above 1023`
      }
    case "EADDRNOTAVAIL":
      return { error: `no such address here (${text})`, nextStep: `set HEALTH_HOST to an address of this machine` }
    // The host does not resolve: the port is not the problem.
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return {
        error: `the host does not resolve (${text})`,
        nextStep: `set HEALTH_HOST to a host name or address of this machine (e.g. 0.0.0.0), without a port`
      }
    default:
      return { error: text, nextStep: `set HEALTH_PORT to a free port, or to "off" to run without the health server` }
  }
}

/** Flushes stdout (the JSON log channel): resolves once what was written has been handed to the OS. */
const flushStdout = Effect.callback<void>((resume) => {
  process.stdout.write("", () => resume(Effect.void))
})

/**
 * The whole worker as an Effect: start-up, the wait for a signal or the program's end, the
 * shutdown procedure. Returns the exit code; never fails. `runMain` runs it and exits the process.
 */
export const run = <E, ROut = never, LE = never, TE = never>(
  program: Effect.Effect<unknown, E, ROut>,
  options: Options<ROut, LE, TE> = {}
): Effect.Effect<number> =>
  Effect.gen(function*() {
    const read = yield* Effect.result(readSettings(options.settings))
    if (Result.isFailure(read)) {
      // One line, the first problem: the one start-up stopped at.
      const { error, nextStep }: SettingsProblem = read.failure.problems[0] ?? { error: read.failure.message }
      yield* Effect.logError("worker.invalid_settings").pipe(
        Effect.annotateLogs(nextStep === undefined ? { error } : { error, nextStep })
      )
      return exitCodes.failure
    }
    const s = read.success.settings
    return yield* runWith(program, options, s, read.success.budget).pipe(
      LifecycleEvents.withLevel(s.logLevel),
      Effect.provide(JsonLogger.layerWith({ maxBufferedBytes: s.logBufferBytes }))
    )
  }).pipe(
    Effect.catchCause((cause) => Effect.as(Effect.logError("worker.defect", cause), exitCodes.failure)),
    Effect.provide(JsonLogger.layer)
  )

const runWith = <E, ROut, LE, TE>(
  program: Effect.Effect<unknown, E, ROut>,
  options: Options<ROut, LE, TE>,
  s: Settings,
  budget: Lifecycle.Budget
): Effect.Effect<number> =>
  Effect.gen(function*() {
    const managed = yield* Effect.result(Lifecycle.makeManaged({
      budget,
      startupTimeout: s.startupTimeout,
      readyWhen: options.readyWhen
    }))
    // STARTUP_TIMEOUT was checked with the settings (`settingsProblems`); kept should the lifecycle check more.
    if (Result.isFailure(managed)) {
      yield* Effect.logError("worker.invalid_settings").pipe(
        Effect.annotateLogs({ error: `${managed.failure.message} (STARTUP_TIMEOUT)` })
      )
      return exitCodes.failure
    }
    const lifecycle = managed.success

    // Signals: the first one starts the procedure; any later one (or one that arrives after the
    // procedure started for another reason) is logged and ignored.
    const firstSignal = Deferred.makeUnsafe<Signal>()
    let procedureStarted = false
    const onSignal = (signal: Signal) => () => {
      if (procedureStarted || Deferred.isDoneUnsafe(firstSignal)) return void signalIgnored(signal)
      Deferred.doneUnsafe(firstSignal, Exit.succeed(signal))
    }
    const onTerm = onSignal("SIGTERM")
    const onInt = onSignal("SIGINT")
    process.on("SIGTERM", onTerm)
    process.on("SIGINT", onInt)

    const healthScope = yield* Scope.make()
    if (s.healthPort !== "off") {
      const health = yield* HealthServer.make({
        port: s.healthPort,
        host: s.healthHost,
        maxEventLoopLag: s.maxEventLoopLag,
        maxConnections: s.healthMaxConnections,
        readiness: lifecycle.readiness
      }).pipe(Scope.provide(healthScope), Effect.result)
      if (Result.isFailure(health)) {
        const { error, nextStep } = describeListenError(health.failure.cause, s.healthPort)
        yield* Effect.logError("worker.startup_failed").pipe(
          Effect.annotateLogs({ error: `health server on port ${s.healthPort}: ${error}`, nextStep })
        )
        return exitCodes.failure
      }
    }

    const telemetryScope = yield* Scope.make()
    let telemetryContext = Context.empty()
    if (options.telemetry !== undefined) {
      // `exit`, not `result`: an SDK constructor that throws (a malformed endpoint) is a defect,
      // and telemetry must not stop the work either way.
      const built = yield* Layer.buildWithScope(options.telemetry, telemetryScope).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle),
        Effect.timeoutOption(s.startupTimeout),
        Effect.exit
      )
      if (Exit.isFailure(built) || built.value._tag === "None") {
        const cause = Exit.isFailure(built) ? built.cause : Cause.empty
        // An endpoint's userinfo is a secret the SDK quotes when it throws on the endpoint: the
        // error is written without it, and a cause that quotes it is left out (its stack with it).
        const error = Exit.isFailure(built)
          ? ErrorSummary.withoutCredentials(ErrorSummary.describe(ErrorSummary.fromCause(built.cause)))
          : "not built within the start-up timeout"
        const pretty = Cause.pretty(cause)
        yield* Effect.logError(
          "telemetry.unavailable",
          ErrorSummary.withoutCredentials(pretty) !== pretty ? Cause.empty : cause
        ).pipe(Effect.annotateLogs({ error }))
        // Release what the layer built before it failed (its flushes unregister with it), without
        // waiting on it: a half-built exporter must not hold up the start.
        yield* Effect.forkDetach(Scope.close(telemetryScope, Exit.void))
      } else {
        telemetryContext = LifecycleEvents.filterContext(built.value.value, s.logLevel)
      }
    }

    const resources = yield* Scope.make()
    const layer = (options.layer ?? Layer.empty) as Layer.Layer<ROut, LE>
    const work = yield* Effect.forkDetach(
      Effect.gen(function*() {
        const context = yield* Layer.buildWithScope(layer, resources).pipe(
          Effect.timeoutOrElse({
            duration: s.startupTimeout,
            orElse: () =>
              Effect.fail(
                new StartupTimeout({ message: `resources not ready within ${Duration.format(s.startupTimeout)}` })
              )
          })
        )
        yield* Effect.logInfo("startup.resources_built")
        yield* lifecycle.started
        return yield* Effect.provideContext(program, context)
      }).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provideContext(telemetryContext))
    )

    // A duration: on the monotonic clock, so that a step of the wall clock does not change it.
    const startedAt0 = yield* Clock.monotonicTimeNanos
    yield* Effect.forkDetach(
      Effect.flatMap(lifecycle.firstReady, () =>
        Effect.flatMap(Clock.monotonicTimeNanos, (now) =>
          Effect.logInfo("worker.ready").pipe(Effect.annotateLogs({ startupMs: Number((now - startedAt0) / 1_000_000n) }))))
    )

    // Start-up is bounded as a whole: not ready by the deadline (a dependency that never came,
    // setup that hangs) is a failure.
    const startupExpired = Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sleep(Duration.millis(Math.max(0, lifecycle.startupEndsAt - now)))).pipe(
        Effect.andThen(Effect.suspend(() => (lifecycle.everReady() ? Effect.never : Effect.void))),
        Effect.as({
          signal: undefined,
          exit: Exit.fail(
            new StartupTimeout({ message: `not ready within STARTUP_TIMEOUT ${Duration.format(s.startupTimeout)}` })
          ) as Exit.Exit<unknown, unknown>
        })
      )
    const first = yield* Effect.raceAll([
      Effect.map(Deferred.await(firstSignal), (signal) => ({ signal, exit: undefined as Exit.Exit<unknown, unknown> | undefined })),
      Effect.map(Fiber.await(work), (exit) => ({ signal: undefined, exit: exit as Exit.Exit<unknown, unknown> | undefined })),
      startupExpired
    ])
    procedureStarted = true
    yield* lifecycle.begin
    const startedAt = lifecycle.startedAt()!
    const signal = first.signal
    const reason = signal !== undefined ? "signal" : Exit.isSuccess(first.exit!) ? "completed" : "failure"
    yield* Effect.logInfo("shutdown.started").pipe(
      Effect.annotateLogs({ signal: signal ?? null, reason, budgetMs: budget.totalMillis })
    )
    yield* lifecycle.stage("readiness", "probe", "readinessGrace", Effect.void)

    let programExit = first.exit
    // Whether the procedure interrupted the program: only then is an interruption expected.
    let interruptedHere = false
    yield* lifecycle.stage(
      "program",
      "program",
      "close",
      Effect.suspend(() => {
        const ended = work.pollUnsafe()
        if (ended !== undefined) {
          programExit ??= ended
          return Effect.void
        }
        interruptedHere = true
        return Effect.andThen(
          Fiber.interrupt(work),
          Effect.flatMap(Fiber.await(work), (exit) =>
            Effect.sync(() => {
              // A start-up timeout stays the reason, not the interruption it caused.
              programExit ??= exit
            }))
        )
      })
    )
    // A program that ended interrupted by something else (no signal, no deadline) stopped without
    // finishing its work: a failure, so that the exit code and `shutdown.completed` say so.
    const failure = programExit !== undefined && Exit.isFailure(programExit) &&
        !(interruptedHere && Cause.hasInterruptsOnly(programExit.cause))
      ? programExit.cause
      : undefined
    const failed = failure !== undefined
    if (failure !== undefined) {
      const summary = ErrorSummary.fromCause(failure)
      const next = nextStep(failure)
      yield* Effect.logError("worker.failed", failure).pipe(
        Effect.annotateLogs({ error: ErrorSummary.describe(summary), ...(next === undefined ? {} : { nextStep: next }) })
      )
    }

    const graceEnd = lifecycle.deadline("readinessGrace")!
    // Bounded by the drain share (which ends after the grace), so the wait itself is not an overrun.
    yield* lifecycle.stage(
      "grace",
      "probe",
      "drain",
      Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sleep(Duration.millis(Math.max(0, graceEnd - now))))
    )
    yield* lifecycle.stage("close", "resources", "close", Scope.close(resources, programExit ?? Exit.void))
    if (s.healthPort !== "off") {
      yield* lifecycle.stage("close", "health-server", "close", Scope.close(healthScope, Exit.void))
    }
    // Every channel flushes at once, each bounded by the telemetry share; the stdout logger last
    // of all, so the lines about the flush are written too.
    yield* Effect.forEach(
      lifecycle.flushes(),
      ([channel, flush]) => lifecycle.stage("telemetry", channel, "telemetry", flush),
      { concurrency: "unbounded", discard: true }
    )
    // What follows the telemetry share is counted back from the budget's end, never from now:
    // closing the telemetry scope (the SDK's own shutdown) may use the first half of the reserve,
    // the last stdout flush what is left, so a gone collector or a log reader that stopped
    // reading cannot move the exit past the budget.
    const budgetEnd = startedAt + budget.totalMillis
    const untilMillis = (end: number) =>
      Effect.map(Clock.currentTimeMillis, (now) => Duration.millis(Math.max(0, end - now)))
    const closeTelemetryBy = budgetEnd - budget.reserveMillis / 2
    yield* Effect.forkDetach(Scope.close(telemetryScope, Exit.void)).pipe(
      Effect.flatMap((fiber) =>
        Effect.flatMap(untilMillis(closeTelemetryBy), (left) => Fiber.await(fiber).pipe(Effect.timeoutOption(left)))
      )
    )
    yield* lifecycle.stage("telemetry", "logger", "telemetry", flushStdout)

    // A resource that could not be closed is a failure too: the process did not release what it owns.
    const result: ShutdownResult = failed || lifecycle.stageFailed() ? "failure" : lifecycle.overran() ? "timeout" : "success"
    const durationMs = (yield* Clock.currentTimeMillis) - startedAt
    yield* (result === "success" ? Effect.logInfo : Effect.logError)("shutdown.completed").pipe(
      Effect.annotateLogs({ result, durationMs, budgetMs: budget.totalMillis, signal: signal ?? null })
    )
    yield* Effect.flatMap(untilMillis(budgetEnd), (left) => flushStdout.pipe(Effect.timeoutOption(left)))
    process.off("SIGTERM", onTerm)
    process.off("SIGINT", onInt)
    return exitCodes[result]
  })

/**
 * Runs `program` as the process's worker (see the module's description) and exits the process
 * with the shutdown's exit code. Call it once, at the top of the process's entry file.
 *
 * ```ts
 * import { PgClient } from "@effect/sql-pg"
 * import { Consumer, type IdempotencyStore } from "@jetworker/core"
 * import { NatsConnection } from "@jetworker/nats"
 * import { Worker } from "@jetworker/node"
 * import { Migrations, PgIdempotencyStore } from "@jetworker/sql-pg"
 * import { Config, Layer } from "effect"
 *
 * declare const shipping: Consumer.Consumer<{ readonly id: string }, never, NatsConnection.NatsConnection | IdempotencyStore.IdempotencyStore>
 *
 * // NATS from NATS_URL (and its credentials), PostgreSQL from DATABASE_URL; both close in order on
 * // SIGTERM, after the consumer has drained; the exit code says how the shutdown went.
 * Worker.runMain(Consumer.run(shipping), {
 *   layer: Layer.mergeAll(
 *     NatsConnection.layerConfig({ name: "shipping" }),
 *     // The migrations beneath the store: its layer refuses to build without its table.
 *     PgIdempotencyStore.layer().pipe(
 *       Layer.provide(Migrations.layer),
 *       Layer.provideMerge(PgClient.layerConfig({ url: Config.Redacted("DATABASE_URL") }))
 *     )
 *   )
 * })
 * ```
 */
export const runMain = <E, ROut = never, LE = never, TE = never>(
  program: Effect.Effect<unknown, E, ROut>,
  options: Options<ROut, LE, TE> = {}
): void => {
  Effect.runPromise(run(program, options)).then(
    (code) => process.exit(code),
    () => process.exit(exitCodes.failure)
  )
}

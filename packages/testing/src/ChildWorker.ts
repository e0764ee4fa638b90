/**
 * Runs a Node script in a child process, for crash tests: the test waits for the lines the
 * child prints, kills it with a signal at the moment it chooses, and reads how it exited. The
 * child runs on the same Node as the test (`process.execPath`), so a `.ts` script runs through
 * Node's type stripping. Stdout and stderr are read continuously into bounded rings of lines, so
 * a chatty child never blocks on a full pipe; every wait is bounded, on the real clock also under
 * `TestClock` (a child runs in real time); closing the scope SIGKILLs a child that still runs and
 * waits (bounded) for it to exit.
 *
 * It deliberately does not restart children, talk to them over IPC or stdin, or pass the test
 * runner's Node flags on: the child sees only `script`, `args`, and the test's environment with
 * `env` laid over it.
 *
 * @since 0.1.0
 */
import { DurationInput } from "@jetworker/core"
import { Data, Deferred, Duration, Effect, Exit } from "effect"
import { inRealTime } from "./Eventually.ts"
import type { Scope } from "effect"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"
import type { Readable } from "node:stream"

/** How to start a child. */
export interface SpawnOptions {
  /** The script to run, a `.ts` or `.js` path (relative paths resolve against `cwd`). Required. */
  readonly script: string
  /** Arguments after the script. Default: none. */
  readonly args?: ReadonlyArray<string>
  /** Variables laid over the test's own environment. Default: none (the test's environment as is). */
  readonly env?: Record<string, string>
  /** The child's working directory. Default: the test's `process.cwd()`. */
  readonly cwd?: string
  /**
   * How many recent lines of stdout, and of stderr, are kept: a positive integer (anything else
   * fails the spawn with `InvalidOptions`). Default `10_000`.
   */
  readonly maxLines?: number
}

/**
 * A signal a test may send. `SIGSTOP` pauses the child (its timers, sockets and event loop
 * stand still, as in a long GC pause or a frozen VM) until `SIGCONT`.
 */
export type Signal = "SIGKILL" | "SIGTERM" | "SIGINT" | "SIGSTOP" | "SIGCONT"

/** How a child ended: an exit code, or the signal that killed it. */
export interface ExitStatus {
  readonly code: number | null
  readonly signal: string | null
}

/** A running child; it is killed when the scope that spawned it closes. */
export interface ChildWorker {
  /** The child's process id. */
  readonly pid: number
  /**
   * The first stdout line, already printed or still to come, that satisfies `predicate`, waiting
   * at most `timeout` (a finite duration, 0 or more).
   */
  readonly waitForLine: (
    predicate: (line: string) => boolean,
    timeout: Duration.Input
  ) => Effect.Effect<string, ChildWorkerError>
  /** A snapshot of the stdout lines kept so far (the most recent `maxLines`). */
  readonly lines: Effect.Effect<ReadonlyArray<string>>
  /** A snapshot of the stderr lines kept so far (the most recent `maxLines`). */
  readonly stderr: Effect.Effect<ReadonlyArray<string>>
  /** Sends `signal` to the child; does nothing once it has exited. */
  readonly kill: (signal: Signal) => Effect.Effect<void>
  /** Waits, without bound, until the child has exited and its output is read. */
  readonly exit: Effect.Effect<ExitStatus>
  /** Waits at most `timeout` (a finite duration, 0 or more) for the child to exit. */
  readonly waitForExit: (timeout: Duration.Input) => Effect.Effect<ExitStatus, ChildWorkerError>
}

/** Why a child could not start, or a wait on it did not succeed; carries the child's recent output. */
export class ChildWorkerError extends Data.TaggedError("ChildWorkerError")<{
  /**
   * `ScriptNotFound`: no file at `script`. `SpawnFailed`: the process did not start in time.
   * `LineTimeout`: no matching line within the timeout. `OutputEnded`: stdout closed before a
   * matching line. `ExitTimeout`: the child did not exit within the timeout. `InvalidTimeout`: the
   * timeout of a wait is not a finite duration of 0 or more (a string that does not parse, NaN,
   * negative, infinite); nothing was awaited. `InvalidOptions`: an option of `spawn` is wrong
   * (a `maxLines` that is not a positive integer); nothing was started.
   */
  readonly reason:
    | "ScriptNotFound"
    | "SpawnFailed"
    | "LineTimeout"
    | "OutputEnded"
    | "ExitTimeout"
    | "InvalidTimeout"
    | "InvalidOptions"
  readonly message: string
  /** The last lines of stdout when the error was raised (up to 20). */
  readonly recentStdout: ReadonlyArray<string>
  /** The last lines of stderr when the error was raised (up to 20). */
  readonly recentStderr: ReadonlyArray<string>
  readonly cause?: unknown
}> {
  /** Whether trying again may succeed (only a failed spawn, e.g. EAGAIN). */
  get isRetryable(): boolean {
    return this.reason === "SpawnFailed"
  }
}

const defaultMaxLines = 10_000
const recentLines = 20
/** A line longer than this is cut into pieces, so a child that never prints "\n" stays bounded. */
const maxLineLength = 1_000_000
const spawnTimeout = "10 seconds"
/** After the process exits, how long to wait for its pipes to close (a grandchild may hold them). */
const pipeGrace = 2_000
const finalizerTimeout = "5 seconds"

interface Output {
  readonly ring: Array<string>
  ended: boolean
}

interface Waiter {
  readonly predicate: (line: string) => boolean
  readonly resume: (effect: Effect.Effect<string, ChildWorkerError>) => void
}

/** Splits `stream` into lines, keeps the last `max` in `output.ring`, and reports each one and the end. */
const collect = (
  stream: Readable,
  output: Output,
  max: number,
  onLine: (line: string) => void,
  onEnd: () => void
): void => {
  let partial = ""
  const push = (line: string) => {
    output.ring.push(line)
    if (output.ring.length > max) output.ring.shift()
    onLine(line)
  }
  stream.setEncoding("utf8")
  stream.on("data", (chunk: string) => {
    partial += chunk
    let newline = partial.indexOf("\n")
    while (newline >= 0) {
      push(partial.slice(0, newline).replace(/\r$/, ""))
      partial = partial.slice(newline + 1)
      newline = partial.indexOf("\n")
    }
    while (partial.length > maxLineLength) {
      push(partial.slice(0, maxLineLength))
      partial = partial.slice(maxLineLength)
    }
  })
  stream.on("close", () => {
    if (output.ended) return
    if (partial.length > 0) push(partial)
    partial = ""
    output.ended = true
    onEnd()
  })
}

/** Starts `node <script> ...args`; closing the scope SIGKILLs the child if it still runs. */
export const spawn: (options: SpawnOptions) => Effect.Effect<ChildWorker, ChildWorkerError, Scope.Scope> = Effect.fn(
  "ChildWorker.spawn"
)(function*(options: SpawnOptions) {
  const cwd = options.cwd ?? process.cwd()
  const script = Path.resolve(cwd, options.script)
  const max = options.maxLines ?? defaultMaxLines
  const stdout: Output = { ring: [], ended: false }
  const stderr: Output = { ring: [], ended: false }
  const fail = (reason: ChildWorkerError["reason"], message: string, cause?: unknown) => {
    const recentStdout = stdout.ring.slice(-recentLines)
    const recentStderr = stderr.ring.slice(-recentLines)
    const tail = (name: string, lines: ReadonlyArray<string>) =>
      lines.length === 0 ? `\n--- ${name}: (nothing)` : `\n--- last ${name}:\n${lines.join("\n")}`
    return new ChildWorkerError({
      reason,
      message: message + tail("stdout", recentStdout) + tail("stderr", recentStderr),
      recentStdout,
      recentStderr,
      ...(cause === undefined ? {} : { cause })
    })
  }
  // NaN would keep every line (the ring never exceeds it), 0 or less none.
  if (!Number.isSafeInteger(max) || max < 1) {
    return yield* fail("InvalidOptions", `maxLines must be a positive integer such as 10000, got ${String(options.maxLines)}`)
  }
  if (!Fs.existsSync(script)) {
    return yield* fail("ScriptNotFound", `no script at ${script}`)
  }

  const child = yield* Effect.try({
    try: () =>
      ChildProcess.spawn(process.execPath, [script, ...(options.args ?? [])], {
        cwd,
        env: { ...process.env, ...options.env },
        stdio: ["ignore", "pipe", "pipe"]
      }),
    catch: (cause) => fail("SpawnFailed", `cannot start ${script}: ${String(cause)}`, cause)
  })
  const exited = Deferred.makeUnsafe<ExitStatus>()
  const waiters = new Set<Waiter>()

  let status: ExitStatus | undefined
  let graceTimer: NodeJS.Timeout | undefined
  const settle = () => {
    if (status === undefined) return
    if (graceTimer !== undefined) clearTimeout(graceTimer)
    Deferred.doneUnsafe(exited, Exit.succeed(status))
  }
  child.on("exit", (code, signal) => {
    status = { code, signal }
    if (stdout.ended && stderr.ended) return settle()
    graceTimer = setTimeout(() => {
      child.stdout.destroy()
      child.stderr.destroy()
      settle()
    }, pipeGrace)
    graceTimer.unref()
  })
  const onStdoutEnd = () => {
    for (const waiter of waiters) {
      waiter.resume(Effect.fail(fail("OutputEnded", `stdout of ${script} closed before a matching line`)))
    }
    waiters.clear()
    if (stderr.ended) settle()
  }
  const onStderrEnd = () => {
    if (stdout.ended) settle()
  }
  collect(child.stdout, stdout, max, (line) => {
    for (const waiter of waiters) {
      let matches: boolean
      try {
        matches = waiter.predicate(line)
      } catch (defect) {
        waiters.delete(waiter)
        waiter.resume(Effect.die(defect))
        continue
      }
      if (matches) {
        waiters.delete(waiter)
        waiter.resume(Effect.succeed(line))
      }
    }
  }, onStdoutEnd)
  collect(child.stderr, stderr, max, () => {}, onStderrEnd)

  yield* Effect.addFinalizer(() =>
    Effect.suspend(() => {
      if (child.pid === undefined) return Effect.void // never started: nothing to wait for
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
      return Deferred.await(exited)
    }).pipe(
      Effect.timeoutOption(finalizerTimeout),
      inRealTime,
      Effect.andThen(Effect.sync(() => {
        child.stdout.destroy()
        child.stderr.destroy()
      }))
    )
  )

  const pid = yield* Effect.callback<number, ChildWorkerError>((resume) => {
    const onSpawn = () => resume(Effect.succeed(child.pid!))
    const onError = (cause: Error) => resume(Effect.fail(fail("SpawnFailed", `cannot start ${script}: ${cause.message}`, cause)))
    if (child.pid !== undefined) return onSpawn()
    child.once("spawn", onSpawn)
    child.once("error", onError)
    return Effect.sync(() => {
      child.off("spawn", onSpawn)
      child.off("error", onError)
    })
  }).pipe(
    Effect.timeoutOrElse({
      duration: spawnTimeout,
      orElse: () => Effect.fail(fail("SpawnFailed", `${script} did not start within ${spawnTimeout}`))
    }),
    inRealTime
  )
  child.on("error", () => {})

  /** `timeout` parsed, or the `InvalidTimeout` error when it is not a finite duration of 0 or more. */
  const bound = (timeout: Duration.Input): Effect.Effect<Duration.Duration, ChildWorkerError> =>
    Effect.suspend(() => {
      const parsed = DurationInput.parse(timeout)
      return parsed !== undefined && Duration.isFinite(parsed) && Duration.toMillis(parsed) >= 0
        ? Effect.succeed(parsed)
        : Effect.fail(fail(
          "InvalidTimeout",
          `timeout must be a finite duration such as "10 seconds", 0 or more, got ${DurationInput.show(timeout)}`
        ))
    })

  const waitForExit = (timeout: Duration.Input) =>
    Effect.flatMap(bound(timeout), (duration) =>
      Deferred.await(exited).pipe(
        Effect.timeoutOrElse({
          duration,
          orElse: () => Effect.suspend(() => Effect.fail(fail("ExitTimeout", `${script} did not exit within ${Duration.format(duration)}`)))
        }),
        inRealTime
      ))

  const waitForLineWithin = (predicate: (line: string) => boolean, timeout: Duration.Duration) =>
    Effect.callback<string, ChildWorkerError>((resume) => {
      const seen = stdout.ring.find(predicate)
      if (seen !== undefined) return resume(Effect.succeed(seen))
      if (stdout.ended) return resume(Effect.fail(fail("OutputEnded", `stdout of ${script} closed without a matching line`)))
      const waiter: Waiter = { predicate, resume }
      waiters.add(waiter)
      return Effect.sync(() => waiters.delete(waiter))
    }).pipe(
      Effect.timeoutOrElse({
        duration: timeout,
        orElse: () =>
          Effect.suspend(() =>
            Effect.fail(fail("LineTimeout", `no matching line from ${script} within ${Duration.format(timeout)}`))
          )
      }),
      inRealTime
    )

  const waitForLine = (predicate: (line: string) => boolean, timeout: Duration.Input) =>
    Effect.flatMap(bound(timeout), (duration) => waitForLineWithin(predicate, duration))

  const worker: ChildWorker = {
    pid,
    waitForLine,
    lines: Effect.sync(() => stdout.ring.slice()),
    stderr: Effect.sync(() => stderr.ring.slice()),
    kill: (signal) =>
      Effect.sync(() => {
        if (child.exitCode === null && child.signalCode === null) child.kill(signal)
      }),
    exit: Deferred.await(exited),
    waitForExit
  }
  return worker
})

/**
 * Private nats-servers with JetStream on loopback ports, for tests that crash or restart the
 * broker without touching the shared one other tests use: one server ({@link make}) or a cluster
 * of them ({@link cluster}, three by default, routed to each other). A server's JetStream store
 * lives in a temporary directory that survives `stop`/`start` (a restart finds its streams and
 * consumers again) and is removed with the scope, after the process is killed.
 *
 * It runs the `nats-server` binary found on `PATH` (or `binary`); it does not configure TLS or
 * authentication. Its bounds (`readyTimeout`, `stopTimeout`) run on the real clock, also under
 * `TestClock`: the process runs in real time.
 *
 * @since 0.1.0
 */
import { DurationInput } from "@jetworker/core"
import { Data, Duration, Effect, type Scope } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { inRealTime } from "./Eventually.ts"

/**
 * The server did not start (no binary, a port in use, no "ready" line in time), or its options are
 * wrong (a `readyTimeout` or `stopTimeout` that is not a finite duration).
 */
export class NatsServerError extends Data.TaggedError("NatsServerError")<{ readonly message: string }> {}

/** A running (or stopped) private server. */
export interface NatsServer {
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string
  readonly port: number
  /**
   * Stops the process and waits for its exit: `SIGKILL` is a crash (state not yet flushed to the
   * store is lost), `SIGTERM` a clean shutdown (a server still running after `stopTimeout` is
   * killed with `SIGKILL`). Does nothing when it is not running.
   */
  readonly stop: (signal?: "SIGKILL" | "SIGTERM") => Effect.Effect<void>
  /**
   * Starts the process again (after `stop`, or when it died on its own) on the same port and
   * store; waits until it says it is ready. Does nothing while it runs.
   */
  readonly start: Effect.Effect<void, NatsServerError>
  /** `stop(signal)`, then `start`. */
  readonly restart: (signal?: "SIGKILL" | "SIGTERM") => Effect.Effect<void, NatsServerError>
}

/** How to run the server. */
export interface Options {
  /** The executable. Default: `nats-server` on `PATH`. */
  readonly binary?: string | undefined
  /**
   * How long a start may take until the server logs that it is ready: a finite duration above
   * zero. Default: 15 seconds.
   */
  readonly readyTimeout?: Duration.Input | undefined
  /**
   * How long `stop("SIGTERM")` waits for the exit before it kills the process with `SIGKILL`: a
   * finite duration, 0 or more (0 kills at once). Default: 10 seconds.
   */
  readonly stopTimeout?: Duration.Input | undefined
}

/** Options of one server. */
export interface ServerOptions extends Options {
  /**
   * More of nats-server's configuration file (e.g. `tls { ... }` or `authorization { ... }`),
   * added to the listen address and the JetStream store this module sets. Default: none.
   */
  readonly config?: string | undefined
}

/**
 * `count` distinct free TCP ports on 127.0.0.1 (the system's choice): each is held until all are
 * chosen, so none is handed out twice; all are released before the servers take them.
 */
const freePorts = (count: number) =>
  Effect.callback<ReadonlyArray<number>, NatsServerError>((resume) => {
    const held: Array<Net.Server> = []
    const ports: Array<number> = []
    let done = false
    const releaseAll = (then: () => void) => {
      let pending = held.length
      if (pending === 0) return then()
      for (const server of held.splice(0)) server.close(() => --pending === 0 && then())
    }
    const next = () => {
      if (done) return
      if (ports.length === count) {
        done = true
        return releaseAll(() => resume(Effect.succeed(ports)))
      }
      const server = Net.createServer()
      server.once("error", (error) => {
        if (done) return
        done = true
        releaseAll(() => resume(Effect.fail(new NatsServerError({ message: `no free port: ${error.message}` }))))
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        held.push(server)
        ports.push(typeof address === "object" && address !== null ? address.port : 0)
        next()
      })
    }
    next()
    return Effect.sync(() => {
      done = true
      releaseAll(() => {})
    })
  })

/** A free TCP port on 127.0.0.1 (the system's choice, released before the server takes it). */
const freePort = Effect.map(freePorts(1), (ports) => ports[0]!)

/** Whether `process` was spawned and has not exited yet. */
const isRunning = (process: ChildProcess | undefined): process is ChildProcess =>
  process !== undefined && process.pid !== undefined && process.exitCode === null && process.signalCode === null

/** Whether the system still has `process` (signal 0 reaches it). */
const signalable = (process: ChildProcess): boolean => {
  try {
    return process.pid !== undefined && globalThis.process.kill(process.pid, 0)
  } catch {
    return false
  }
}

/** Waits for the exit of `process` (at once when it is not running). */
const exited = (process: ChildProcess) =>
  Effect.callback<void>((resume) => {
    if (!isRunning(process)) return resume(Effect.void)
    const onExit = () => resume(Effect.void)
    process.once("exit", onExit)
    return Effect.sync(() => {
      process.off("exit", onExit)
    })
  })

/** How long a process killed with `SIGKILL` may take to exit. */
const killTimeout = Duration.seconds(10)

/** Sends `signal` to `process` unless it has exited; waits for the exit, at most `timeout`. */
const signalAndWait = (
  process: ChildProcess,
  signal: "SIGKILL" | "SIGTERM",
  timeout: Duration.Duration,
  orElse: Effect.Effect<void>
) =>
  Effect.sync(() => {
    if (isRunning(process)) process.kill(signal)
  }).pipe(
    Effect.andThen(exited(process)),
    Effect.timeoutOrElse({ duration: timeout, orElse: () => orElse }),
    inRealTime
  )

/** Kills `process` with `SIGKILL` and waits for its exit, at most {@link killTimeout}. */
const kill = (process: ChildProcess) => signalAndWait(process, "SIGKILL", killTimeout, Effect.void)

/** The bounds of `options`, checked: finite durations, `readyTimeout` above zero. */
interface Timeouts {
  readonly readyTimeout: Duration.Duration
  readonly stopTimeout: Duration.Duration
}

/**
 * `options`' bounds, or a `NatsServerError` naming one that is not a finite duration (a string
 * that does not parse, a NaN, which effect would read as 0, a negative or an infinite one; a
 * `readyTimeout` of 0 could never be met). Checked before any port, store or process is taken.
 */
const checkTimeouts = (options: Options): Effect.Effect<Timeouts, NatsServerError> =>
  Effect.suspend(() => {
    const finite = (input: Duration.Input) => {
      const parsed = DurationInput.parse(input)
      return parsed !== undefined && Duration.isFinite(parsed) ? parsed : undefined
    }
    const readyTimeout = finite(options.readyTimeout ?? "15 seconds")
    if (readyTimeout === undefined || !(Duration.toMillis(readyTimeout) > 0)) {
      return Effect.fail(
        new NatsServerError({
          message: `readyTimeout must be a finite duration above zero such as "15 seconds", got ${DurationInput.show(options.readyTimeout)}`
        })
      )
    }
    const stopTimeout = finite(options.stopTimeout ?? "10 seconds")
    if (stopTimeout === undefined || !(Duration.toMillis(stopTimeout) >= 0)) {
      return Effect.fail(
        new NatsServerError({
          message: `stopTimeout must be a finite duration such as "10 seconds", 0 or more, got ${DurationInput.show(options.stopTimeout)}`
        })
      )
    }
    return Effect.succeed({ readyTimeout, stopTimeout })
  })

/** One server process: its arguments, started, stopped and restarted on the same port and store. */
const serve = (
  options: Options,
  { readyTimeout, stopTimeout }: Timeouts,
  port: number,
  store: string,
  args: ReadonlyArray<string>
): Effect.Effect<NatsServer, NatsServerError, Scope.Scope> =>
  Effect.gen(function*() {
    // The last process spawned, kept until it has exited (also when a stop's wait ran out), so the
    // scope's SIGKILL always finds it; it runs while `isRunning(child)`.
    let child: ChildProcess | undefined

    const launch = Effect.callback<ChildProcess, NatsServerError>((resume) => {
      const process = spawn(options.binary ?? "nats-server", [...args], { stdio: ["ignore", "ignore", "pipe"] })
      child = process
      let output = ""
      let settled = false
      const settle = (effect: Effect.Effect<ChildProcess, NatsServerError>) => {
        if (settled) return
        settled = true
        process.stderr?.removeAllListeners("data")
        process.stderr?.resume() // keep draining, so a chatty server never blocks on a full pipe
        resume(effect)
      }
      process.stderr?.on("data", (chunk: Buffer) => {
        output = (output + chunk.toString("utf8")).slice(-4000)
        if (output.includes("Server is ready")) settle(Effect.succeed(process))
      })
      process.once("error", (error) => settle(Effect.fail(new NatsServerError({ message: `nats-server did not start: ${error.message}` }))))
      process.once("exit", (code) =>
        settle(Effect.fail(new NatsServerError({ message: `nats-server exited with ${code} before it was ready: ${output.trim()}` }))))
      // Interrupted (e.g. by the ready timeout): kill it and wait for its exit.
      return Effect.suspend(() => settled ? Effect.void : kill(process))
    }).pipe(
      Effect.timeoutOrElse({
        duration: readyTimeout,
        orElse: () => Effect.fail(new NatsServerError({ message: `nats-server on port ${port} was not ready within ${Duration.format(readyTimeout)}` }))
      }),
      inRealTime
    )

    const stop = (signal: "SIGKILL" | "SIGTERM" = "SIGKILL") =>
      Effect.suspend(() => {
        const running = child
        if (!isRunning(running)) return Effect.void
        // A server that ignores SIGTERM for `stopTimeout` is killed with SIGKILL.
        return signal === "SIGKILL" ? kill(running) : signalAndWait(running, "SIGTERM", stopTimeout, kill(running))
      })

    // Does nothing while the process runs; starts it again when it was stopped or died on its own.
    const start = Effect.gen(function*() {
      if (isRunning(child)) {
        if (signalable(child)) return
        // Gone (killed from outside) before Node reported its exit: wait for the report, bounded.
        yield* exited(child).pipe(Effect.timeoutOption(killTimeout), inRealTime)
      }
      yield* launch
    })

    yield* Effect.addFinalizer(() =>
      Effect.andThen(stop("SIGKILL"), Effect.sync(() => rmSync(store, { recursive: true, force: true })))
    )
    yield* start
    return {
      url: `nats://127.0.0.1:${port}`,
      port,
      stop,
      start,
      restart: (signal) => Effect.andThen(stop(signal), start)
    } satisfies NatsServer
  })

/** Starts a private server in the current scope; the scope's end kills it and removes its store. */
export const make = (options: ServerOptions = {}): Effect.Effect<NatsServer, NatsServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const timeouts = yield* checkTimeouts(options)
    const port = yield* freePort
    const store = mkdtempSync(join(tmpdir(), "jw-nats-"))
    if (options.config === undefined) {
      return yield* serve(options, timeouts, port, store, ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", store])
    }
    const config = join(store, "server.conf")
    writeFileSync(config, [`listen: 127.0.0.1:${port}`, `jetstream { store_dir: "${join(store, "js")}" }`, options.config].join("\n"))
    return yield* serve(options, timeouts, port, store, ["-c", config])
  })

/** A node of a {@link NatsCluster}: a server with its `server_name`. */
export interface ClusterNode extends NatsServer {
  /** `n1`, `n2`, ...: the name the server reports (e.g. as a stream's leader). */
  readonly name: string
}

/** A JetStream cluster of private servers routed to each other on loopback. */
export interface NatsCluster {
  readonly nodes: ReadonlyArray<ClusterNode>
  /** Every node's client URL, for a connection's `servers` (or, joined by commas, `NATS_URL`). */
  readonly urls: ReadonlyArray<string>
  /** The node named `name` (e.g. a stream's `cluster.leader`). */
  readonly node: (name: string) => ClusterNode | undefined
}

/**
 * Starts a JetStream cluster of `size` servers (default 3) in the current scope, each with its
 * own store and client port, routed to the others; the scope's end kills them and removes their
 * stores. Each node is ready to accept connections; the cluster's JetStream API answers only once
 * it has elected its meta leader (some seconds later), so a first request should be retried.
 */
export const cluster = (
  options: Options & { readonly size?: number | undefined } = {}
): Effect.Effect<NatsCluster, NatsServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const size = options.size ?? 3
    if (!Number.isInteger(size) || size < 1 || size > 9) {
      return yield* new NatsServerError({ message: `a cluster has 1 to 9 nodes, not ${size}` })
    }
    const timeouts = yield* checkTimeouts(options)
    const free = yield* freePorts(2 * size)
    const ports = Array.from({ length: size }, (_, i) => ({ client: free[2 * i]!, route: free[2 * i + 1]! }))
    const routes = ports.map((p) => `nats-route://127.0.0.1:${p.route}`).join(", ")
    const clusterName = `jw_${Math.floor(Math.random() * 1e9).toString(36)}`
    const nodes = yield* Effect.forEach(ports, (p, i) =>
      Effect.gen(function*() {
        const name = `n${i + 1}`
        const store = mkdtempSync(join(tmpdir(), `jw-nats-${name}-`))
        const config = join(store, "server.conf")
        writeFileSync(
          config,
          [
            `server_name: ${name}`,
            `listen: 127.0.0.1:${p.client}`,
            `jetstream { store_dir: "${join(store, "js")}" }`,
            `cluster {`,
            `  name: ${clusterName}`,
            `  listen: 127.0.0.1:${p.route}`,
            `  routes: [ ${routes} ]`,
            `}`
          ].join("\n")
        )
        const server = yield* serve(options, timeouts, p.client, store, ["-c", config])
        return { ...server, name } satisfies ClusterNode
      }), { concurrency: "unbounded" })
    return { nodes, urls: nodes.map((n) => n.url), node: (name) => nodes.find((n) => n.name === name) }
  })

/**
 * Private nats-servers with JetStream on loopback ports, for tests that crash or restart the
 * broker without touching the shared one other tests use: one server ({@link make}) or a cluster
 * of them ({@link cluster}, three by default, routed to each other). A server's JetStream store
 * lives in a temporary directory that survives `stop`/`start` (a restart finds its streams and
 * consumers again) and is removed with the scope, after the process is killed.
 *
 * It runs the `nats-server` binary found on `PATH` (or `binary`); it does not configure TLS or
 * authentication.
 *
 * @since 0.4.0
 */
import { Data, Duration, Effect, type Scope } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"

/** The server did not start (no binary, a port in use, no "ready" line in time). */
export class NatsServerError extends Data.TaggedError("NatsServerError")<{ readonly message: string }> {}

/** A running (or stopped) private server. */
export interface NatsServer {
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string
  readonly port: number
  /**
   * Stops the process and waits for its exit: `SIGKILL` is a crash (state not yet flushed to the
   * store is lost), `SIGTERM` a clean shutdown. Does nothing when it is not running.
   */
  readonly stop: (signal?: "SIGKILL" | "SIGTERM") => Effect.Effect<void>
  /** Starts the process again on the same port and store; waits until it says it is ready. */
  readonly start: Effect.Effect<void, NatsServerError>
  /** `stop(signal)`, then `start`. */
  readonly restart: (signal?: "SIGKILL" | "SIGTERM") => Effect.Effect<void, NatsServerError>
}

/** How to run the server. */
export interface Options {
  /** The executable. Default: `nats-server` on `PATH`. */
  readonly binary?: string | undefined
  /** How long a start may take until the server logs that it is ready. Default: 15 seconds. */
  readonly readyTimeout?: Duration.Input | undefined
}

/** Options of one server. */
export interface ServerOptions extends Options {
  /**
   * More of nats-server's configuration file (e.g. `tls { ... }` or `authorization { ... }`),
   * added to the listen address and the JetStream store this module sets. Default: none.
   */
  readonly config?: string | undefined
}

/** A free TCP port on 127.0.0.1 (the system's choice, released before the server takes it). */
const freePort = Effect.callback<number, NatsServerError>((resume) => {
  const server = Net.createServer()
  server.once("error", (error) => resume(Effect.fail(new NatsServerError({ message: `no free port: ${error.message}` }))))
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** One server process: its arguments, started, stopped and restarted on the same port and store. */
const serve = (
  options: Options,
  port: number,
  store: string,
  args: ReadonlyArray<string>
): Effect.Effect<NatsServer, NatsServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const readyTimeout = Duration.fromInputUnsafe(options.readyTimeout ?? "15 seconds")
    let child: ChildProcess | undefined

    const launch = Effect.callback<ChildProcess, NatsServerError>((resume) => {
      const process = spawn(options.binary ?? "nats-server", [...args], { stdio: ["ignore", "ignore", "pipe"] })
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
      return Effect.sync(() => {
        if (!settled) process.kill("SIGKILL")
      })
    }).pipe(
      Effect.timeoutOrElse({
        duration: readyTimeout,
        orElse: () => Effect.fail(new NatsServerError({ message: `nats-server on port ${port} was not ready within ${Duration.format(readyTimeout)}` }))
      })
    )

    const stop = (signal: "SIGKILL" | "SIGTERM" = "SIGKILL") =>
      Effect.callback<void>((resume) => {
        const running = child
        child = undefined
        if (running === undefined || running.exitCode !== null || running.signalCode !== null) return resume(Effect.void)
        running.once("exit", () => resume(Effect.void))
        running.kill(signal)
      }).pipe(
        // A server that ignores SIGTERM for 10 s is left to the scope's SIGKILL.
        Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.void })
      )

    const start = Effect.gen(function*() {
      if (child !== undefined) return
      child = yield* launch
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
    const port = yield* freePort
    const store = mkdtempSync(join(tmpdir(), "jw-nats-"))
    if (options.config === undefined) {
      return yield* serve(options, port, store, ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", store])
    }
    const config = join(store, "server.conf")
    writeFileSync(config, [`listen: 127.0.0.1:${port}`, `jetstream { store_dir: "${join(store, "js")}" }`, options.config].join("\n"))
    return yield* serve(options, port, store, ["-c", config])
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
    const ports = []
    for (let i = 0; i < size; i++) ports.push({ client: yield* freePort, route: yield* freePort })
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
        const server = yield* serve(options, p.client, store, ["-c", config])
        return { ...server, name } satisfies ClusterNode
      }), { concurrency: "unbounded" })
    return { nodes, urls: nodes.map((n) => n.url), node: (name) => nodes.find((n) => n.name === name) }
  })

/**
 * A scoped NATS connection with its JetStream client and manager, as a Layer. The connection
 * reconnects forever by default (nats.js gives up after ~20 s otherwise); its finalizer drains it
 * within `drainTimeout` (and within the worker's close share while shutting down) and then closes it, so it must be released after everything that acks
 * through it (the consumer's scope is inner to this one). Connection status changes are logged.
 * Credentials (a token, a password, an NKey seed, also when a server URL carries the token or the
 * user and password) are `Redacted` and never logged; TLS (with a
 * client certificate for mutual TLS) and credentials files (a user JWT and its NKey seed) are read
 * from files named in the options, and checked (as the NKey seed is) before connecting. A refused
 * credential or certificate, a TLS failure or a setting that cannot work fails the first
 * connection at once with what to check, instead of being retried. A server that turns the client
 * away during the handshake for another reason, as at its connection limit or its account's, is
 * named in its own words (nats.js only times out on it), and waited for at start-up as a refused
 * connection is.
 *
 * @since 0.1.0
 */
import { type JetStreamClient, type JetStreamManager, jetstream, jetstreamManager } from "@nats-io/jetstream"
import { type ConnectionOptions, connect, type Msg, type NatsConnection as Connection } from "@nats-io/transport-node"
import { DurationInput, Lifecycle } from "@jetworker/core"
import { Clock, Config, Context, Duration, Effect, Layer, Option, Redacted, Semaphore, Stream } from "effect"
import {
  authenticatorFor,
  connectError,
  connectNextStep,
  describeServers,
  durationSetting,
  integerSetting,
  loginFor,
  mayHideRefusal,
  millisOf,
  refusedBy,
  serverList,
  schemeOf,
  serversAndCredentials,
  serversSettingOf,
  settingError,
  tlsFor
} from "./internal/connectSettings.ts"
import * as HandshakeProbe from "./internal/handshakeProbe.ts"
import * as Outgoing from "./internal/outgoing.ts"
import * as Replies from "./internal/replies.ts"
import * as NatsError from "./NatsError.ts"

export { describeServers } from "./internal/connectSettings.ts"

/**
 * How to connect. Every duration is a `Duration.Input`, finite and at most 2147483647 ms (~24.8
 * days, the longest a timer waits); a setting out of range fails `make` before connecting, with a
 * `NatsError` naming it and the value given.
 */
export interface Options {
  /**
   * Server URLs, e.g. `nats://127.0.0.1:4222` (a string may hold several, comma-separated); give
   * every node of a cluster. Blank entries are dropped; none left is refused. Required.
   *
   * A URL may carry the credentials, as other NATS clients read them: `nats://alice:pw@host:4222`
   * logs in with user and password, `nats://mytoken@host:4222` with a token; each percent-decoded
   * (write a reserved character as `%XX`: `@` as `%40`, `/` as `%2F`, `%` as `%25`, `:` in a user
   * as `%3A`). They are taken out of the URL before nats.js sees it (it would ignore them), kept
   * `Redacted` and never shown. A connection logs in with one set: URLs that carry different ones
   * are refused, a URL without any uses that set too, and credentials in the URL together with
   * `token`, `user`/`password`, `nkeySeed` or `credentialsFile` are refused unless they are the same
   * user and password (or token), all before connecting with a `NatsError` that names the settings,
   * never the secret. A password may hold an unescaped `@` or `/`; a comma must be encoded (`%2C`),
   * since commas separate the URLs. A `tls://` URL asks for TLS, as other NATS clients read it: a
   * server without TLS is refused (with the system's CAs unless `tls` gives others).
   */
  readonly servers: string | ReadonlyArray<string>
  /**
   * How the operator gives `servers`, as the next steps of a failed connection name it (`Set … to
   * where it runs`): a tool whose servers come from its own flag says so, e.g. `--server`. One line
   * of at most 100 characters. Default: `NATS_URL, or the servers option` (a worker's settings).
   */
  readonly serversSetting?: string | undefined
  /** Connection name shown by the server. Default: `jetworker`. */
  readonly name?: string | undefined
  /** Token authentication (or a lone `token@` in the server URL, see `servers`). */
  readonly token?: Redacted.Redacted<string> | undefined
  /** User for user/password authentication (or `user:password@` in the server URL, see `servers`). */
  readonly user?: string | undefined
  /** Password for user/password authentication (or `user:password@` in the server URL, see `servers`). */
  readonly password?: Redacted.Redacted<string> | undefined
  /** NKey authentication: the user's seed (`SU...`). */
  readonly nkeySeed?: Redacted.Redacted<string> | undefined
  /**
   * Decentralized (operator mode) authentication: a credentials file (`.creds`) holding the user's
   * JWT and NKey seed, as `nsc` writes it. Read when connecting.
   */
  readonly credentialsFile?: string | undefined
  /**
   * TLS. Any field turns TLS on: `caFile`, the PEM file of the CA that signed the server's
   * certificate (default: the system's CAs); `certFile` and `keyFile`, this client's
   * certificate and key for a server that verifies clients (mutual TLS).
   */
  readonly tls?: {
    readonly caFile?: string | undefined
    readonly certFile?: string | undefined
    readonly keyFile?: string | undefined
  } | undefined
  /** Reconnect attempts before giving up: -1 (for ever) or an integer from 0 to 1000000. Default: -1. */
  readonly maxReconnectAttempts?: number | undefined
  /** Wait between reconnect attempts (plus up to 100 ms of jitter), 0 or more. Default: 250 millis. */
  readonly reconnectTimeWait?: Duration.Input | undefined
  /**
   * Bound on establishing the first connection. Under a worker that is starting, a refused or
   * timed-out first connection is retried until the worker's start-up deadline. At least 1
   * millisecond. Default: 5 seconds.
   */
  readonly connectTimeout?: Duration.Input | undefined
  /** Bound on JetStream API requests and publishes, at least 1 millisecond. Default: 5 seconds. */
  readonly apiTimeout?: Duration.Input | undefined
  /** Bound on draining at release, 0 or more; then the connection is closed. Default: 5 seconds. */
  readonly drainTimeout?: Duration.Input | undefined
  /**
   * Confirmed publishes (`Publisher.publish`, retries included) in flight at once on this
   * connection, 1 to 100 000; more wait for a free one. Default: 1024.
   */
  readonly maxPublishesInFlight?: number | undefined
  /**
   * How often the client pings the server; a link that misses `maxPingsOut` answers in a row is
   * taken as dead (stale): readiness goes down and the client reconnects. A link that freezes
   * without breaking (a stalled proxy, a half-open TCP connection) is noticed so, within
   * `(maxPingsOut + 1) * pingInterval`, where nats.js's defaults (2 minutes, 2) took minutes.
   * From 1 second to 10 minutes. Default: 5 seconds.
   */
  readonly pingInterval?: Duration.Input | undefined
  /** Unanswered pings before the link is taken as dead, 1 to 100. Default: 2. */
  readonly maxPingsOut?: number | undefined
  /**
   * The prefix of every reply subject of the connection (nats.js's `inboxPrefix`): the JetStream
   * API's answers, PubAcks, the messages jetworker pulls and the confirmations of its acks all
   * come to `<inboxPrefix>.<unique>`. Give each service of an account its own, and allow its user
   * to subscribe to `<inboxPrefix>.>` only, so that it cannot read another's replies (see
   * docs/nats-permissions.md). Subject tokens of letters, digits, `_`, `-` and `$`, separated by
   * dots (no wildcards), at most 100 characters. Default: `_INBOX`.
   */
  readonly inboxPrefix?: string | undefined
}

/** The connection and its JetStream handles. */
export interface Shape {
  readonly connection: Connection
  readonly jetstream: JetStreamClient
  readonly manager: JetStreamManager
  /** The prefix of the connection's reply subjects (`Options.inboxPrefix`; default `_INBOX`). */
  readonly inboxPrefix: string
  /** The API timeout in milliseconds, for adapter code that calls nats.js directly. */
  readonly apiTimeoutMillis: number
  /** Permits for confirmed publishes in flight (`maxPublishesInFlight`). */
  readonly publishPermits: Semaphore.Semaphore
  /**
   * Publishes `payload` to `subject` and waits at most `timeoutMillis` for the reply, as
   * `connection.request` does, at the cost of a publish (one shared reply subscription and one
   * timer per timeout, not a promise, timer and error per request). `operation` names it in errors.
   */
  readonly request: (
    operation: string,
    subject: string,
    payload: Uint8Array,
    timeoutMillis: number
  ) => Effect.Effect<Msg, NatsError.NatsError>
  /**
   * `request` as a callback, for a caller that sends many requests at once and waits for all of
   * them (a batch's acks) without a fiber or an effect per request. `done` is called once, with
   * the reply or the error; the function returned withdraws the request (a later reply is
   * dropped and `done` is not called).
   */
  readonly send: (
    operation: string,
    subject: string,
    payload: Uint8Array,
    timeoutMillis: number,
    done: (result: Msg | NatsError.NatsError) => void
  ) => () => void
  /**
   * Publishes `payload` to `subject` with a `reply` subject, once the event loop has handled
   * every socket that was ready (`setImmediate`), together with the requests of `request` and
   * `send` queued meanwhile: what a consumer sends in answer to the replies read in one turn leaves
   * in one write; or sooner, as soon as 8 of them wait, so that the server is not left idle while
   * this process handles the rest of a socket read. `failed` is called once if the publish is
   * refused (a closed connection), when the queued publishes are sent.
   */
  readonly publishSoon: (subject: string, payload: Uint8Array, reply: string, failed: (error: unknown) => void) => void
  /**
   * Runs `f`, and what it sends with `send`, `request` and `publishSoon` leaves in one write
   * instead of 8 at a time (a batch's acks): at once when `f` returns with 8 or more waiting,
   * otherwise with the rest of the turn's.
   */
  readonly together: <A>(f: () => A) => A
}

/** The NATS connection service. */
export class NatsConnection extends Context.Service<NatsConnection, Shape>()("@jetworker/nats/NatsConnection") {}

// The bound on asking a server that timed out the handshake for its -ERR (see `HandshakeProbe`),
// and the most a try cut short by the start-up deadline leaves for it.
const PROBE_MILLIS = 2_000
const PROBE_RESERVE_MILLIS = 300

/**
 * One try of nats.js's `connect`. Interrupted while it is under way, it lets the try end and
 * closes the connection it may still open, which would otherwise reconnect for ever unowned.
 */
const connectOnce = (options: ConnectionOptions): Effect.Effect<Connection, NatsError.NatsError> =>
  Effect.callback<Connection, NatsError.NatsError>((resume) => {
    let interrupted = false
    connect(options).then(
      (connection) => {
        if (interrupted) void connection.close().catch(() => undefined)
        else resume(Effect.succeed(connection))
      },
      (error: unknown) => {
        if (!interrupted) resume(Effect.fail(connectError(error)))
      }
    )
    return Effect.sync(() => {
      interrupted = true
    })
  })

/** What `inboxPrefix` may be: subject tokens without wildcards. */
const INBOX_PREFIX = /^[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*$/

/**
 * Connects with `options`; the scope's close drains, then closes, the connection. A setting that
 * cannot work (see {@link Options}) fails before connecting. Under a worker, readiness follows the
 * connection (component `nats`), and each change is logged once as `dependency.down` (with the
 * reason) or `dependency.up`, whatever `LOG_LEVEL`.
 */
export const make = (options: Options) =>
  Effect.gen(function*() {
    // Without a server nats.js would connect to its default, 127.0.0.1:4222, whatever was meant.
    const setting = options.serversSetting
    if (setting !== undefined && !(setting.trim() !== "" && setting.length <= 100 && !/[\r\n]/.test(setting))) {
      return yield* settingError(
        `serversSetting must be one line of 1 to 100 characters naming how the servers are given (e.g. --server), ` +
          `got ${JSON.stringify(setting.slice(0, 100))}${setting.length > 100 ? "…" : ""}`
      )
    }
    const servers = serverList(options.servers)
    if (servers.length === 0) {
      return yield* settingError(
        `servers is empty (got ${DurationInput.show(options.servers)}): set ${serversSettingOf(options).inSentence} to the ` +
          `server URLs, comma-separated (e.g. nats://127.0.0.1:4222)`
      )
    }
    const apiTimeoutMillis = yield* durationSetting("apiTimeout", options.apiTimeout, 5_000, 1)
    const connectMillis = yield* durationSetting("connectTimeout", options.connectTimeout, 5_000, 1)
    const drainMillis = yield* durationSetting("drainTimeout", options.drainTimeout, 5_000, 0)
    const reconnectMillis = yield* durationSetting("reconnectTimeWait", options.reconnectTimeWait, 250, 0)
    const maxPublishes = yield* integerSetting("maxPublishesInFlight", options.maxPublishesInFlight ?? 1024, 100_000)
    // nats.js compares it with a counter: NaN or 1.5 would mean "never reconnect", -2 "for ever".
    const maxReconnects = options.maxReconnectAttempts ?? -1
    if (!(maxReconnects === -1 || (Number.isInteger(maxReconnects) && maxReconnects >= 0 && maxReconnects <= 1_000_000))) {
      return yield* Effect.fail(settingError(`maxReconnectAttempts must be -1 (for ever) or an integer from 0 to 1000000, got ${maxReconnects}`))
    }
    const pingMillis = options.pingInterval === undefined ? 5_000 : millisOf(options.pingInterval)
    if (!(pingMillis !== undefined && pingMillis >= 1_000 && pingMillis <= 600_000)) {
      return yield* settingError(`pingInterval must be from 1 second to 10 minutes, got ${DurationInput.show(options.pingInterval)}`)
    }
    const maxPingsOut = yield* integerSetting("maxPingsOut", options.maxPingsOut ?? 2, 100)
    const inboxPrefix = options.inboxPrefix ?? "_INBOX"
    if (!(inboxPrefix.length <= 100 && INBOX_PREFIX.test(inboxPrefix))) {
      return yield* settingError(
        `inboxPrefix must be subject tokens of letters, digits, _, - and $, separated by dots, at most 100 characters ` +
          `(e.g. _INBOX_shipping), got ${JSON.stringify(inboxPrefix.slice(0, 100))}`
      )
    }
    // Credentials in the URLs are taken out (nats.js would drop them, or misread the port) and
    // checked against the options' before the NKey seed or credentials file is read.
    const fromUrls = yield* serversAndCredentials(servers)
    const login = yield* loginFor(options, fromUrls.credentials)
    const authenticator = yield* authenticatorFor(options)
    // A `tls://` URL asks for TLS, as other NATS clients read it; nats.js ignores the scheme, and
    // would send the URL's password to a server (or anything in between) that offers none.
    const tls = yield* Effect.map(tlsFor(options), (given) =>
      given === undefined && fromUrls.servers.some((server) => schemeOf(server).toLowerCase() === "tls://") ? {} : given)
    const lifecycle = yield* Lifecycle.Lifecycle
    // Under a worker that is starting, a refused or timed-out connection is retried until the
    // start-up deadline (the server may be restarting); otherwise it fails at once. Each try
    // carries its next step (logged by startup.waiting), and ends 100 ms before the deadline (less
    // than the retry's shortest wait, 160 ms), so start-up fails with it, not a bare StartupTimeout;
    // a try the deadline cuts short leaves a quarter of what is left (at most 300 ms) for asking a
    // server that timed it out why (below).
    const connectionOptions: ConnectionOptions = {
      servers: [...fromUrls.servers],
      name: options.name ?? "jetworker",
      maxReconnectAttempts: maxReconnects,
      reconnectTimeWait: reconnectMillis,
      reconnectJitter: 100,
      pingInterval: pingMillis,
      maxPingOut: maxPingsOut,
      noAsyncTraces: true,
      inboxPrefix,
      ...(login.token === undefined ? {} : { token: Redacted.value(login.token) }),
      ...(login.user === undefined ? {} : { user: login.user }),
      ...(login.password === undefined ? {} : { pass: Redacted.value(login.password) }),
      ...(authenticator === undefined ? {} : { authenticator }),
      ...(tls === undefined ? {} : { tls })
    }
    // The last try's failure: a retry that starts with no time left before the deadline makes no
    // try (it could neither connect nor ask the server why), and start-up fails with this one.
    let lastFailure: NatsError.NatsError | undefined
    const attempt = Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const deadline = lifecycle.startupDeadline()
      const left = deadline === undefined ? Infinity : deadline - now - 100
      if (left <= 0 && lastFailure !== undefined) return Effect.fail(lastFailure)
      const timeout = Math.max(1, Math.min(connectMillis, left - Math.min(PROBE_RESERVE_MILLIS, Math.max(0, left / 4))))
      return connectOnce({ ...connectionOptions, timeout })
    }).pipe(
      // nats.js keeps a server's -ERR (a connection limit) to itself and only times out: ask the
      // server once more for its answer, within what is left before the start-up deadline.
      Effect.catchIf(mayHideRefusal, (error) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const deadline = lifecycle.startupDeadline()
          const bound = Math.min(PROBE_MILLIS, deadline === undefined ? PROBE_MILLIS : deadline - now - 50)
          const answer = yield* HandshakeProbe.refusal(connectionOptions, bound)
          return yield* Effect.fail(answer === undefined ? error : refusedBy(answer.server, answer.text))
        })),
      Effect.tapError((error) =>
        Effect.sync(() => {
          lastFailure = error
        })
      ),
      Effect.mapError((error) => connectNextStep(error, options, fromUrls.credentials))
    )
    // Interruptible: a stop signal while start-up waits for the server ends the wait at once
    // (`connectOnce` closes a connection that opens after that).
    const connection = yield* Effect.acquireRelease(
      Lifecycle.waitFor("nats", attempt, {
        while: (error) => error.reason === "ConnectionRefused" || error.reason === "Timeout"
      }),
      (connection) =>
        Effect.gen(function*() {
          // Bounded by `drainTimeout` and, under a worker that is shutting down, by what is left
          // of this resource's part of the close share; then the connection is closed without
          // draining.
          const now = yield* Clock.currentTimeMillis
          const closeBy = yield* Lifecycle.currentDeadline("close")
          const bound = Math.max(0, Math.min(drainMillis, closeBy === undefined ? drainMillis : closeBy - now))
          const drained = yield* Effect.promise(() => connection.drain().catch(() => undefined)).pipe(
            Effect.timeoutOption(Duration.millis(bound))
          )
          if (Option.isNone(drained)) yield* Effect.promise(() => connection.close().catch(() => undefined))
        }),
      { interruptible: true }
    )
    // Readiness reflects the connection: down while disconnected.
    const component = yield* lifecycle.component("nats", "dependency")
    yield* component.up
    // Each readiness change is also a lifecycle event, written whatever LOG_LEVEL, in the lines a
    // checked resource writes (`Lifecycle.resource`): once when it goes down, with the reason, and
    // once when it is back. Only under a worker, the one place with a readiness to report on. The
    // nats.* lines below still say what the client saw.
    let up = true
    const down = (reason: string) =>
      Effect.suspend(() => {
        if (!up || !lifecycle.managed) return component.down(reason)
        up = false
        return Effect.andThen(
          component.down(reason),
          Effect.logWarning(`dependency nats is down: ${reason}; readiness is down until the client reconnects`).pipe(
            Effect.annotateLogs({ event: "dependency.down", dependency: "nats", reason })
          )
        )
      })
    const back = Effect.suspend(() => {
      if (up) return component.up
      up = true
      // The line first: marking it up wakes the consumers paused on it (their `consumer.resumed`).
      return Effect.andThen(
        Effect.logInfo("dependency nats is back").pipe(Effect.annotateLogs({ event: "dependency.up", dependency: "nats" })),
        component.up
      )
    })
    // Log connection status changes for operators, through the configured logger; the fiber ends
    // with the scope (or when the connection closes and the status iterator ends).
    // Whether the link was last taken for dead for want of pongs: the disconnect that follows says so.
    let stale = false
    yield* Stream.fromAsyncIterable(connection.status(), (error) => error).pipe(
      Stream.runForEach((status) => {
        switch (status.type) {
          case "disconnect":
            return Effect.andThen(
              down(stale ? "disconnected: no answer to pings (stale connection)" : "disconnected"),
              Effect.logWarning(`nats connection disconnect from ${describeServers(status.server)}`).pipe(
                Effect.annotateLogs({ event: "nats.disconnect", server: describeServers(status.server) })
              )
            )
          case "reconnect":
            stale = false
            return Effect.andThen(
              back,
              Effect.logWarning(`nats connection reconnect to ${describeServers(status.server)}`).pipe(
                Effect.annotateLogs({ event: "nats.reconnect", server: describeServers(status.server) })
              )
            )
          case "staleConnection":
            // The link froze: no answer to the pings. Down now; the client reconnects.
            stale = true
            return Effect.andThen(
              down("no answer to pings (stale connection)"),
              Effect.logWarning(`nats connection stale: ${maxPingsOut} pings unanswered; reconnecting`).pipe(
                Effect.annotateLogs({ event: "nats.stale" })
              )
            )
          case "error":
            // A server's -ERR (a permissions violation, say): the error is what the operator needs.
            return Effect.logWarning(`nats connection error: ${status.error.message}`).pipe(
              Effect.annotateLogs({ event: "nats.error", error: status.error.message })
            )
          default:
            return Effect.void
        }
      }),
      Effect.ignore,
      Effect.forkScoped
    )
    const manager = yield* Effect.tryPromise({
      try: () => jetstreamManager(connection, { timeout: apiTimeoutMillis, checkAPI: false }),
      catch: (error) => NatsError.fromUnknown("jetstreamManager", error)
    })
    const outgoing = Outgoing.make(connection)
    // Runs before the connection's release (finalizers run in reverse): the drain sends what waits.
    yield* Effect.addFinalizer(() => Effect.sync(outgoing.flush))
    return NatsConnection.of({
      connection,
      jetstream: jetstream(connection, { timeout: apiTimeoutMillis }),
      manager,
      inboxPrefix,
      apiTimeoutMillis,
      publishPermits: Semaphore.makeUnsafe(maxPublishes),
      publishSoon: outgoing.publish,
      together: outgoing.together,
      ...Replies.make(connection, outgoing, inboxPrefix)
    })
  })

/** A Layer holding one connection for its lifetime. */
export const layer = (options: Options): Layer.Layer<NatsConnection, NatsError.NatsError> =>
  Layer.effect(NatsConnection, make(options))

/**
 * Like {@link layer}, configured from the environment (each variable optional): `NATS_URL` (the
 * servers, comma-separated, blank entries dropped; default `nats://127.0.0.1:4222`, also when it is
 * empty, which Effect's `ConfigProvider` reads as unset; a URL may carry the credentials,
 * `nats://user:password@host:port` or `nats://token@host:port`, percent-decoded, as
 * {@link Options}' `servers` says, and refused when `NATS_TOKEN`, `NATS_USER`/`NATS_PASSWORD`,
 * `NATS_NKEY_SEED` or `NATS_CREDS` give other credentials), `NATS_TOKEN`, `NATS_USER` and
 * `NATS_PASSWORD`, `NATS_NKEY_SEED`, `NATS_CREDS` (a credentials file), `NATS_TLS_CA`,
 * `NATS_TLS_CERT` and `NATS_TLS_KEY` (PEM files), `NATS_INBOX_PREFIX` (`inboxPrefix`). Secrets
 * are read as `Redacted`. `options` sets the rest (and wins over the environment).
 */
export const layerConfig = (
  options: Omit<Options, "servers"> = {}
): Layer.Layer<NatsConnection, NatsError.NatsError | Config.ConfigError> =>
  Layer.effect(
    NatsConnection,
    Effect.gen(function*() {
      const env = yield* Config.all({
        url: Config.String("NATS_URL").pipe(Config.withDefault("nats://127.0.0.1:4222")),
        token: Config.Redacted("NATS_TOKEN").pipe(Config.option),
        user: Config.String("NATS_USER").pipe(Config.option),
        password: Config.Redacted("NATS_PASSWORD").pipe(Config.option),
        nkeySeed: Config.Redacted("NATS_NKEY_SEED").pipe(Config.option),
        credentialsFile: Config.String("NATS_CREDS").pipe(Config.option),
        caFile: Config.String("NATS_TLS_CA").pipe(Config.option),
        certFile: Config.String("NATS_TLS_CERT").pipe(Config.option),
        keyFile: Config.String("NATS_TLS_KEY").pipe(Config.option),
        inboxPrefix: Config.String("NATS_INBOX_PREFIX").pipe(Config.option)
      })
      const tls = {
        ...Option.match(env.caFile, { onNone: () => ({}), onSome: (caFile) => ({ caFile }) }),
        ...Option.match(env.certFile, { onNone: () => ({}), onSome: (certFile) => ({ certFile }) }),
        ...Option.match(env.keyFile, { onNone: () => ({}), onSome: (keyFile) => ({ keyFile }) })
      }
      return yield* make({
        token: Option.getOrUndefined(env.token),
        user: Option.getOrUndefined(env.user),
        password: Option.getOrUndefined(env.password),
        nkeySeed: Option.getOrUndefined(env.nkeySeed),
        credentialsFile: Option.getOrUndefined(env.credentialsFile),
        tls: Object.keys(tls).length === 0 ? undefined : tls,
        inboxPrefix: Option.getOrUndefined(env.inboxPrefix),
        ...options,
        // Blank entries dropped: a `NATS_URL` of only commas is no server, refused by `make`.
        servers: serverList(env.url)
      })
    })
  )

/**
 * The checks `make` runs on its options before connecting (durations, counts, servers, TLS files,
 * credentials), and the messages for a setting or a first connection that cannot work, saying
 * what to check. Apart so that `NatsConnection` holds the connection's lifecycle; it re-exports
 * `describeServers` and documents the options.
 */
import {
  type Authenticator,
  credsAuthenticator,
  nkeyAuthenticator,
  nkeys
} from "@nats-io/transport-node"
import { readFileSync } from "node:fs"
import { DurationInput } from "@jetworker/core"
import { Duration, Effect, Redacted } from "effect"
import type { Options } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"

// The longest a Node timer waits: nats.js times its requests, connection and reconnects with
// timers, and a longer one fires at once (or, for its request timer, after 1 ms).
const MAX_TIMER_MILLIS = 2 ** 31 - 1

/**
 * How the next steps name the setting that holds the servers: `options.serversSetting` (a tool's
 * own flag, e.g. `--server`), else a worker's, in a sentence (`Set … to where it runs`) and in a
 * list (`(…)`).
 */
export const serversSettingOf = (options: Pick<Options, "serversSetting">) =>
  options.serversSetting === undefined
    ? { inSentence: "NATS_URL, or the servers option,", listed: "NATS_URL, the servers option" }
    : { inSentence: options.serversSetting, listed: options.serversSetting }

/** `input` in milliseconds, or `undefined` when it does not parse or holds a NaN (see `DurationInput`). */
export const millisOf = (input: Duration.Input): number | undefined => {
  const duration = DurationInput.parse(input)
  return duration === undefined ? undefined : Duration.toMillis(duration)
}

/** The server URLs given, trimmed, without empty entries (a trailing comma, an empty `NATS_URL`). */
export const serverList = (servers: string | ReadonlyArray<string>): ReadonlyArray<string> =>
  (typeof servers === "string" ? servers.split(",") : Array.isArray(servers) ? servers : [])
    .map((server) => server.trim())
    .filter((server) => server !== "")

/** Server URLs for a message or a log line: without credentials (`user:password@`), which are never logged. */
export const describeServers = (servers: string | ReadonlyArray<string>): string =>
  (typeof servers === "string" ? servers.split(",") : servers).map(withoutCredentials).join(", ")

/** `address`'s scheme with its `://` (`nats://`, `tls://`, as written), or "" without one. */
export const schemeOf = (address: string): string => /^[a-z][a-z0-9+.-]*:\/\//i.exec(address)?.[0] ?? ""

/**
 * A server address split into its credentials (`userinfo`: everything before the last `@`, still
 * percent-encoded; `undefined` without an `@`) and the address without them, with or without a
 * scheme (`alice:pw@host:4222`). The last `@` of the whole address, not of the authority: a NATS
 * URL has no path, and a password may hold an unescaped `@` or `/` (a base64 one often does).
 */
const splitCredentials = (server: string): { readonly address: string; readonly userinfo: string | undefined } => {
  const trimmed = server.trim()
  const scheme = schemeOf(trimmed)
  const rest = trimmed.slice(scheme.length)
  const at = rest.lastIndexOf("@")
  return at === -1
    ? { address: trimmed, userinfo: undefined }
    : { address: scheme + rest.slice(at + 1), userinfo: rest.slice(0, at) }
}

/**
 * `address`'s port, when it is no number, hidden: `nats://alice:pw` (a password cut off by an
 * unescaped comma, which separates server URLs) would otherwise show the start of the password.
 */
const withoutBadPort = (address: string): string => {
  const scheme = schemeOf(address)
  const hostPort = /^(\[[^\]]*\]|[^:/]*)(?::([^/]*))?(.*)$/.exec(address.slice(scheme.length))
  if (hostPort === null || hostPort[2] === undefined || /^\d*$/.test(hostPort[2])) return address
  return `${scheme}${hostPort[1]}:***${hostPort[3]}`
}

/** A server address without its user and password (see {@link splitCredentials}), nor a port that is no number. */
const withoutCredentials = (server: string): string => withoutBadPort(splitCredentials(server).address)

/** The credentials a server URL carries, percent-decoded; the secret `Redacted`. */
export type UrlCredentials =
  | { readonly _tag: "UserPassword"; readonly user: string; readonly password: Redacted.Redacted<string> }
  | { readonly _tag: "Token"; readonly token: Redacted.Redacted<string> }

/** The servers without their credentials, for nats.js, and the one set of credentials they carried. */
export interface ServersAndCredentials {
  readonly servers: ReadonlyArray<string>
  readonly credentials: UrlCredentials | undefined
}

const sameCredentials = (a: UrlCredentials, b: UrlCredentials): boolean =>
  a._tag === "UserPassword"
    ? b._tag === "UserPassword" && a.user === b.user && Redacted.value(a.password) === Redacted.value(b.password)
    : b._tag === "Token" && Redacted.value(a.token) === Redacted.value(b.token)

/** `part` percent-decoded, or a failure naming the server (without its credentials) but never `part`. */
const decoded = (part: string, what: string, server: string): Effect.Effect<string, NatsError.NatsError> =>
  Effect.try({
    try: () => decodeURIComponent(part),
    catch: () =>
      settingError(
        `the ${what} in the server URL ${withoutCredentials(server)} is not valid percent-encoding: ` +
          `write a reserved character of it as %XX (e.g. @ as %40, / as %2F, : in a user as %3A, % as %25)`
      )
  })

/** The credentials of one server URL (`user:password@`, or a lone `token@`), or `undefined` without. */
const credentialsOf = (server: string, userinfo: string): Effect.Effect<UrlCredentials | undefined, NatsError.NatsError> => {
  // `nats://@host` carries nothing. The password is what follows the first `:` (as in a URL).
  if (userinfo === "") return Effect.succeed(undefined)
  const colon = userinfo.indexOf(":")
  if (colon === -1) {
    return Effect.map(decoded(userinfo, "token", server), (token): UrlCredentials => ({ _tag: "Token", token: Redacted.make(token) }))
  }
  return Effect.flatMap(
    Effect.all([decoded(userinfo.slice(0, colon), "user", server), decoded(userinfo.slice(colon + 1), "password", server)]),
    ([user, password]) =>
      // nats.js would send no credentials at all for an empty user.
      user === ""
        ? Effect.fail(settingError(
          password === ""
            // `:@`, as a template of empty variables leaves it: say so rather than "a password".
            ? `the server URL ${withoutCredentials(server)} carries an empty user and an empty password (":@"): write ` +
              `user:password@host:port, token@host:port for a token, or host:port without credentials`
            : `the server URL ${withoutCredentials(server)} carries a password but no user: write user:password@host:port, ` +
              `or token@host:port for a token`
        ))
        : Effect.succeed<UrlCredentials>({ _tag: "UserPassword", user, password: Redacted.make(password) })
  )
}

/**
 * The servers without credentials, and the credentials they carry: nats.js ignores a URL's user
 * and password (or token) without a word, reads a numeric password as the port, and refuses a
 * host without a dot (`localhost`) after credentials, so they are taken out here. A connection
 * logs in with one set: URLs that carry different ones are refused (URLs without any use that one
 * set too, as the servers of a cluster share their users).
 */
export const serversAndCredentials = (
  servers: ReadonlyArray<string>
): Effect.Effect<ServersAndCredentials, NatsError.NatsError> =>
  Effect.gen(function*() {
    const addresses: Array<string> = []
    let found: { readonly server: string; readonly credentials: UrlCredentials } | undefined
    for (const server of servers) {
      const { address, userinfo } = splitCredentials(server)
      if (withoutBadPort(address) !== address) {
        return yield* settingError(
          `the server URL ${withoutCredentials(server)} has a port that is no number; server URLs are separated by ` +
            `commas, so a comma in a password (or a token) must be percent-encoded, as %2C`
        )
      }
      addresses.push(address)
      const credentials = userinfo === undefined ? undefined : yield* credentialsOf(server, userinfo)
      if (credentials === undefined) continue
      if (found === undefined) found = { server, credentials }
      else if (!sameCredentials(found.credentials, credentials)) {
        return yield* settingError(
          `the server URLs ${withoutCredentials(found.server)} and ${address} carry different credentials, and a ` +
            `connection logs in with one set: give the same credentials in each URL (or in one of them), or none in ` +
            `the URLs and NATS_USER/NATS_PASSWORD or NATS_TOKEN`
        )
      }
    }
    return { servers: addresses, credentials: found?.credentials }
  })

/** The token, user and password to log in with. */
export interface Login {
  readonly token: Redacted.Redacted<string> | undefined
  readonly user: string | undefined
  readonly password: Redacted.Redacted<string> | undefined
}

/**
 * The login: the options' credentials, or the server URL's. Both given is refused unless they are
 * the same (a user and password, or a token, given twice): a silent choice would log in as someone
 * the operator did not mean, or fail with a bare "Authorization Violation". The message names the
 * settings, never the values.
 */
export const loginFor = (
  options: Options,
  fromUrl: UrlCredentials | undefined
): Effect.Effect<Login, NatsError.NatsError> => {
  const explicit = { token: options.token, user: options.user, password: options.password }
  if (fromUrl === undefined) return Effect.succeed(explicit)
  const given = [
    ...(options.token === undefined ? [] : ["NATS_TOKEN (token)"]),
    ...(options.user === undefined ? [] : ["NATS_USER (user)"]),
    ...(options.password === undefined ? [] : ["NATS_PASSWORD (password)"]),
    ...(options.nkeySeed === undefined ? [] : ["NATS_NKEY_SEED (nkeySeed)"]),
    ...(options.credentialsFile === undefined ? [] : ["NATS_CREDS (credentialsFile)"])
  ]
  const login: Login = fromUrl._tag === "Token"
    ? { token: fromUrl.token, user: undefined, password: undefined }
    : { token: undefined, user: fromUrl.user, password: fromUrl.password }
  if (given.length === 0) return Effect.succeed(login)
  const same = options.nkeySeed === undefined && options.credentialsFile === undefined &&
    (fromUrl._tag === "Token"
      ? options.user === undefined && options.password === undefined && options.token !== undefined &&
        Redacted.value(options.token) === Redacted.value(fromUrl.token)
      : options.token === undefined && options.user === fromUrl.user && options.password !== undefined &&
        Redacted.value(options.password) === Redacted.value(fromUrl.password))
  return same ? Effect.succeed(login) : Effect.fail(settingError(
    `the server URL (${describeServers(options.servers)}) carries ${fromUrl._tag === "Token" ? "a token" : "a user and password"}, ` +
      `and ${given.join(", ")} ${given.length === 1 ? "gives" : "give"} other credentials; a connection logs in with one set: ` +
      `give the credentials either in the URL (${serversSettingOf(options).listed}) or in the other settings, not both`
  ))
}

/** Whether a failed connection failed on TLS (a handshake, a certificate, TLS the server lacks). */
const isTlsFailure = (error: NatsError.NatsError): boolean => /tls|ssl|certificate|handshake/i.test(error.message)

/**
 * What a failed first connection was when nats.js's words do not say it or name no server:
 * recognised by {@link connectError} from what nats.js rejected with, worded by
 * {@link connectNextStep}, which knows the servers.
 */
type RawFailure =
  /** The server took the connection and closed it before its INFO ("node provided an undefined error"). */
  | { readonly _tag: "ClosedAtOnce" }
  /** The first line was no INFO, or an INFO that is no JSON. */
  | { readonly _tag: "NotNats" }
  /** The connection was reset before the handshake (ECONNRESET, EPIPE). */
  | { readonly _tag: "Reset"; readonly code: string }
  /** The host name does not resolve. */
  | { readonly _tag: "Unresolved"; readonly code: string }
  /** No route to the host, or it never answered the TCP handshake. */
  | { readonly _tag: "Unreachable"; readonly code: string }
  /** The connection closed in the middle of the TLS handshake. */
  | { readonly _tag: "TlsCutOff" }
  /** The server turned the client away with an `-ERR` nats.js kept to itself (see {@link refusedBy}). */
  | { readonly _tag: "Refused"; readonly server: string; readonly text: string }

// The failures `connectError` recognised, for `connectNextStep` (which receives the same error: the
// connection's `make` maps what `connectError` returns). A WeakMap keeps `NatsError` as it is.
const rawFailures = new WeakMap<NatsError.NatsError, RawFailure>()

const UNRESOLVED = new Set(["ENOTFOUND", "EAI_AGAIN", "EAI_NONAME", "EAI_FAIL", "EAI_NODATA"])
const UNREACHABLE = new Set(["EHOSTUNREACH", "ENETUNREACH", "EHOSTDOWN", "ENETDOWN", "ETIMEDOUT", "EADDRNOTAVAIL"])

/** Node's error code (`ECONNRESET`, `ENOTFOUND`), or `undefined`. */
const nodeCodeOf = (cause: unknown): string | undefined => {
  const code = typeof cause === "object" && cause !== null ? (cause as { code?: unknown }).code : undefined
  return typeof code === "string" ? code : undefined
}

/**
 * What nats.js v3's node transport rejected with, recognised. Its messages are read only where it
 * gives no name or code to tell them apart (it throws a plain `Error` for a first line that is no
 * INFO, and a `ConnectionError` with a fixed text for a socket closed without an error).
 */
const rawFailureOf = (cause: unknown, error: NatsError.NatsError): RawFailure | undefined => {
  const code = nodeCodeOf(cause)
  const name = cause instanceof Error ? cause.name : ""
  if (name === "ConnectionError" && /node provided an undefined error/.test(error.message)) return { _tag: "ClosedAtOnce" }
  if (name === "SyntaxError" || (name === "Error" && error.message === "unexpected response from server")) {
    return { _tag: "NotNats" }
  }
  if (code === undefined) return undefined
  // Before the TLS test: a resolver's message holds the host name, which may hold "tls" or "ssl".
  if (UNRESOLVED.has(code)) return { _tag: "Unresolved", code }
  if (UNREACHABLE.has(code)) return { _tag: "Unreachable", code }
  // Node: "Client network socket disconnected before secure TLS connection was established".
  if (isTlsFailure(error)) return code === "ECONNRESET" ? { _tag: "TlsCutOff" } : undefined
  if (code === "ECONNRESET" || code === "EPIPE") return { _tag: "Reset", code }
  return undefined
}

/**
 * A failed connection attempt. A TLS failure reached the server and retrying cannot help, yet
 * nats.js reports some as a `ConnectionError` (e.g. a server without TLS): it is not "refused".
 * The reason is `NatsError.fromUnknown`'s; {@link connectNextStep} words what nats.js does not.
 */
export const connectError = (cause: unknown): NatsError.NatsError => {
  const mapped = NatsError.fromUnknown("connect", cause)
  const error = mapped.reason === "ConnectionRefused" && isTlsFailure(mapped)
    ? new NatsError.NatsError({ reason: "Unknown", operation: mapped.operation, message: mapped.message })
    : mapped
  const raw = rawFailureOf(cause, error)
  if (raw !== undefined) rawFailures.set(error, raw)
  return error
}

/**
 * Whether `error` may hide the server's `-ERR`: nats.js keeps an `-ERR` other than a refused login
 * to itself and times out waiting for the handshake's PONG (or the socket is reset meanwhile).
 */
export const mayHideRefusal = (error: NatsError.NatsError): boolean =>
  error.reason === "Timeout" || rawFailures.get(error)?._tag === "Reset"

/**
 * The failure of a first connection that `server` turned away with `-ERR <text>`: a connection
 * limit (the server's or the account's) or a throttle may pass (retryable, `ConnectionRefused`); a
 * refused login or permission is `NotAuthorized`; anything else is final (`Unknown`), in the
 * server's words. Worded by {@link connectNextStep}.
 */
export const refusedBy = (server: string, text: string): NatsError.NatsError => {
  const reason: NatsError.Reason = /maximum .*connections exceeded|throttl|try again later/i.test(text)
    ? "ConnectionRefused"
    : /authorization violation|authentication (timeout|expired|revoked)|permissions violation/i.test(text)
    ? "NotAuthorized"
    : "Unknown"
  const error = new NatsError.NatsError({ reason, operation: "connect", message: text })
  rawFailures.set(error, { _tag: "Refused", server, text })
  return error
}

/** Whether nats-server runs at `where`, on its client port, and where to set it: the end of most next steps. */
const isItThere = (setting: string) =>
  `is nats-server running there (with JetStream: -js), and is this its client port (4222 by default)? ` +
  `Set ${setting} to where it runs`

/**
 * A failed first connection, with what happened in words, the servers (without credentials) and
 * what to do about it; `fromUrl`, the credentials the server URL carried (the ones to check when
 * the server refuses the login). The reason stays the one {@link connectError} gave.
 */
export const connectNextStep = (
  error: NatsError.NatsError,
  options: Options,
  fromUrl?: UrlCredentials | undefined
): NatsError.NatsError => {
  const where = describeServers(options.servers)
  const worded = (message: string) => new NatsError.NatsError({ ...error, message })
  const raw = rawFailures.get(error)
  const { inSentence: setting, listed } = serversSettingOf(options)
  // A refused login the probe heard is worded as nats.js's own (below): what to check is the credentials.
  if (raw?._tag === "Refused" && error.reason !== "NotAuthorized") {
    const by = `${describeServers(raw.server)} turned the connection away during the handshake (-ERR '${raw.text}')`
    if (/maximum account active connections exceeded/i.test(raw.text)) {
      return worded(
        `the account is at its connection limit: ${by}: the account these credentials log in to has as many ` +
          `connections as its JWT allows (limits.conn, e.g. nsc edit account --conns); raise the limit, or find ` +
          `the clients holding them (the server's monitoring endpoint /connz lists them)`
      )
    }
    if (/maximum connections exceeded/i.test(raw.text)) {
      return worded(
        `the server is at its connection limit: ${by}: the server has as many client connections as its ` +
          `configuration allows (max_connections); raise the limit, or find the clients holding them (the ` +
          `server's monitoring endpoint /connz lists them)`
      )
    }
    return worded(`the server refused the connection: ${by}`)
  }
  switch (raw?._tag) {
    case "ClosedAtOnce":
      return worded(
        `connection closed at once: could not connect to ${where}: something there closed the connection before ` +
          `sending NATS's greeting (INFO), as a proxy or load balancer with no server behind it, a listener that ` +
          `expects TLS first, or a server shutting down does; ${isItThere(setting)}`
      )
    case "NotNats":
      return worded(
        `not a NATS server: ${where} answered, but not as a NATS server (its first line was no valid INFO ` +
          `greeting); is a nats-server running there, and is this its client port (4222 by default), not another ` +
          `service's? Set ${setting} to where it runs`
      )
    case "Reset":
      return worded(
        `connection reset: could not connect to ${where}: it reset the connection (${raw.code}) before the NATS ` +
          `handshake, as a firewall, a proxy with no server behind it, or a server at its limits may; ${isItThere(setting)}`
      )
    case "Unresolved":
      return worded(
        `host name not resolved: could not connect to ${where}: cannot resolve the host name (${raw.code}); check ` +
          `the host in ${setting} and the DNS (some names resolve only inside a cluster or a container network)`
      )
    case "Unreachable":
      return worded(
        `host unreachable: could not connect to ${where}: it cannot be reached from here (${raw.code}); check the ` +
          `address in ${setting} and the network in between (a firewall, a route, a VPN)`
      )
    case "TlsCutOff":
      return worded(
        `TLS handshake cut off: the TLS handshake with ${where} was cut off: the server, or a proxy in between, ` +
          `closed the connection before TLS was set up; check that nats-server with TLS runs there (a plain TCP ` +
          `proxy or another service in front of it does this), that a server which requires TLS has its CA ` +
          `given (NATS_TLS_CA), and, when it verifies clients, the client certificate and key (NATS_TLS_CERT, NATS_TLS_KEY)`
      )
  }
  switch (error.reason) {
    case "ConnectionRefused":
      return worded(
        `${error.message}: could not connect to ${where}; is nats-server running there (with JetStream: ` +
          `-js)? Set ${setting} to where it runs`
      )
    case "Timeout":
      return worded(
        `${error.message}: could not connect to ${where}: it did not complete the NATS handshake (its INFO ` +
          `greeting, then a PONG) within the connect timeout; nothing answered there, or what took the connection ` +
          `is no nats-server client port (4222 by default) but, e.g., its monitoring port (8222), a cluster or leaf ` +
          `node port or a listener that expects TLS first, or the server turned the client away (at its connection ` +
          `limit); is nats-server running there (with JetStream: -js)? Set ${setting} to where it runs` +
          // A server that verifies clients drops one without a certificate it trusts; nats.js then only times out.
          (options.tls !== undefined
            ? `; or the server refused this client's certificate: a server that verifies clients needs ` +
              `NATS_TLS_CERT and NATS_TLS_KEY signed by a CA it trusts`
            : "")
      )
    case "NotAuthorized":
      return worded(
        `${error.message}: ${where} refused the credentials; ` + (fromUrl === undefined
          ? `check the token, the user and password, the NKey seed or the credentials file (NATS_TOKEN, ` +
            `NATS_USER/NATS_PASSWORD, NATS_NKEY_SEED, NATS_CREDS)`
          : `check the ${fromUrl._tag === "Token" ? "token" : "user and password"} in the server URL (` +
            `${listed}; a reserved character in them percent-encoded, e.g. @ as %40)`)
      )
    default:
      if (/does not support 'tls'|tls is not available/i.test(error.message)) {
        return worded(
          `${error.message}: ${where} does not offer TLS; turn TLS on in the server, or connect without ` +
            `it (leave NATS_TLS_CA, NATS_TLS_CERT and NATS_TLS_KEY, or the tls option, unset)`
        )
      }
      return isTlsFailure(error)
        ? worded(
          `${error.message}: the TLS handshake with ${where} failed; check the CA file (NATS_TLS_CA) ` +
            `against the server's certificate, and the client certificate and key (NATS_TLS_CERT, NATS_TLS_KEY) ` +
            `when the server verifies clients`
        )
        // Whatever else nats.js says (its own words), the server is named.
        : worded(`${error.message}: could not connect to ${where}`)
  }
}

const encoder = new TextEncoder()

export const settingError = (message: string) => new NatsError.NatsError({ reason: "ApiError", operation: "connect", message })

/** `value`, unless it is not an integer from 1 to `max` (then a failure naming the setting). */
export const integerSetting = (name: string, value: number, max: number): Effect.Effect<number, NatsError.NatsError> =>
  Number.isInteger(value) && value >= 1 && value <= max
    ? Effect.succeed(value)
    : Effect.fail(settingError(`${name} must be an integer from 1 to ${max}, got ${value}`))

/**
 * `input` in milliseconds (`fallback` when unset), unless it is no duration, infinite, or outside
 * `min` (0 or 1 ms) to 2147483647 ms: then a failure naming the setting and the value given.
 */
export const durationSetting = (
  name: string,
  input: Duration.Input | undefined,
  fallback: number,
  min: 0 | 1
): Effect.Effect<number, NatsError.NatsError> => {
  const millis = input === undefined ? fallback : millisOf(input)
  return millis !== undefined && millis >= min && millis <= MAX_TIMER_MILLIS
    ? Effect.succeed(millis)
    : Effect.fail(settingError(
      `${name} must be a duration from ${min === 0 ? "0" : "1 millisecond"} to ${MAX_TIMER_MILLIS} ms, got ${DurationInput.show(input)}`
    ))
}

/** Fails, naming `what` and `file`, unless `file` can be read. */
const readable = (what: string, file: string | undefined) =>
  file === undefined ? Effect.void : Effect.try({
    try: () => void readFileSync(file),
    catch: (error) => settingError(`cannot read ${what} ${file}: ${(error as Error).message}`)
  })

/**
 * The TLS options, each file checked readable first: nats.js reports a missing file as a refused
 * connection (retried until the start-up deadline). The files stay named, not read, so that a
 * reconnect reads them afresh (renewed certificates).
 */
export const tlsFor = (options: Options) => {
  const tls = options.tls
  if (tls === undefined) return Effect.succeed(undefined)
  if ((tls.certFile === undefined) !== (tls.keyFile === undefined)) {
    return Effect.fail(settingError(
      `a client certificate goes with its key: set NATS_TLS_CERT and NATS_TLS_KEY (tls.certFile and tls.keyFile) ` +
        `together; only ${tls.certFile === undefined ? `the key ${tls.keyFile}` : `the certificate ${tls.certFile}`} is set`
    ))
  }
  return Effect.all([
    readable("the CA file (NATS_TLS_CA, tls.caFile)", tls.caFile),
    readable("the client certificate (NATS_TLS_CERT, tls.certFile)", tls.certFile),
    readable("the client key (NATS_TLS_KEY, tls.keyFile)", tls.keyFile)
  ]).pipe(Effect.as({
    ...(tls.caFile === undefined ? {} : { caFile: tls.caFile }),
    ...(tls.certFile === undefined ? {} : { certFile: tls.certFile }),
    ...(tls.keyFile === undefined ? {} : { keyFile: tls.keyFile })
  }))
}

/** The NKey or credentials-file authenticator the options ask for (a file that cannot be read fails here). */
export const authenticatorFor = (options: Options): Effect.Effect<Authenticator | undefined, NatsError.NatsError> => {
  if (options.credentialsFile !== undefined && options.nkeySeed !== undefined) {
    return Effect.fail(settingError("give either a credentials file or an NKey seed, not both"))
  }
  if (options.nkeySeed !== undefined) {
    const seed = options.nkeySeed
    // Decoded first: nats.js would fail with a bare "nkeys: invalid checksum". Never prints the seed.
    return Effect.try({
      try: () => nkeys.fromSeed(encoder.encode(Redacted.value(seed))).clear(),
      catch: (error) =>
        settingError(
          `the NKey seed (NATS_NKEY_SEED, the nkeySeed option) is not a valid seed (${(error as Error).message}); ` +
            `give the user's seed (SU...), as nsc writes it`
        )
    }).pipe(Effect.as(nkeyAuthenticator(() => encoder.encode(Redacted.value(seed)))))
  }
  const file = options.credentialsFile
  if (file === undefined) return Effect.succeed(undefined)
  return Effect.try({
    try: () => credsAuthenticator(new Uint8Array(readFileSync(file))),
    catch: (error) => settingError(`cannot read the credentials file ${file}: ${(error as Error).message}`)
  })
}

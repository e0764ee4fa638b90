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

/**
 * A server address without its user and password: everything before the last `@` of the
 * authority, with or without a scheme (`alice:pw@host:4222`), and also when the password holds an
 * unescaped `@`.
 */
const withoutCredentials = (server: string): string => {
  const trimmed = server.trim()
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(trimmed)?.[0] ?? ""
  const rest = trimmed.slice(scheme.length)
  const slash = rest.indexOf("/")
  const authority = slash === -1 ? rest : rest.slice(0, slash)
  const at = authority.lastIndexOf("@")
  return at === -1 ? trimmed : scheme + rest.slice(at + 1)
}

/** Whether a failed connection failed on TLS (a handshake, a certificate, TLS the server lacks). */
const isTlsFailure = (error: NatsError.NatsError): boolean => /tls|ssl|certificate|handshake/i.test(error.message)

/**
 * A failed connection attempt. A TLS failure reached the server and retrying cannot help, yet
 * nats.js reports some as a `ConnectionError` (e.g. a server without TLS): it is not "refused".
 */
export const connectError = (cause: unknown): NatsError.NatsError => {
  const error = NatsError.fromUnknown("connect", cause)
  return error.reason === "ConnectionRefused" && isTlsFailure(error)
    ? new NatsError.NatsError({ reason: "Unknown", operation: error.operation, message: error.message })
    : error
}

/** A failed first connection, with what to do about it. */
export const connectNextStep = (error: NatsError.NatsError, options: Options): NatsError.NatsError => {
  const where = describeServers(options.servers)
  switch (error.reason) {
    case "ConnectionRefused":
    case "Timeout":
      return new NatsError.NatsError({
        ...error,
        message: `${error.message}: could not connect to ${where}; is nats-server running there (with JetStream: ` +
          `-js)? Set NATS_URL, or the servers option, to where it runs` +
          // A server that verifies clients drops one without a certificate it trusts; nats.js then only times out.
          (error.reason === "Timeout" && options.tls !== undefined
            ? `; or the server refused this client's certificate: a server that verifies clients needs ` +
              `NATS_TLS_CERT and NATS_TLS_KEY signed by a CA it trusts`
            : "")
      })
    case "NotAuthorized":
      return new NatsError.NatsError({
        ...error,
        message: `${error.message}: ${where} refused the credentials; check the token, the user and password, ` +
          `the NKey seed or the credentials file (NATS_TOKEN, NATS_USER/NATS_PASSWORD, NATS_NKEY_SEED, NATS_CREDS)`
      })
    default:
      if (/does not support 'tls'|tls is not available/i.test(error.message)) {
        return new NatsError.NatsError({
          ...error,
          message: `${error.message}: ${where} does not offer TLS; turn TLS on in the server, or connect without ` +
            `it (leave NATS_TLS_CA, NATS_TLS_CERT and NATS_TLS_KEY, or the tls option, unset)`
        })
      }
      return isTlsFailure(error)
        ? new NatsError.NatsError({
          ...error,
          message: `${error.message}: the TLS handshake with ${where} failed; check the CA file (NATS_TLS_CA) ` +
            `against the server's certificate, and the client certificate and key (NATS_TLS_CERT, NATS_TLS_KEY) ` +
            `when the server verifies clients`
        })
        : error
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

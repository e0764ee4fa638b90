/**
 * The NATS adapter's one error type. nats.js rejects with many error classes (some not exported);
 * this module maps them to a `reason` callers can branch on, and says whether retrying can help.
 * It never inspects error messages when a name or code tells the same thing.
 *
 * @since 0.1.0
 */
import { Data, Effect } from "effect"

/** What went wrong talking to NATS. */
export type Reason =
  /** No reply within the bound; the request may or may not have taken effect. */
  | "Timeout"
  /** Nobody answered the subject (JetStream down, stream or consumer gone, leader election). */
  | "NoResponders"
  /** The connection is closed or draining. */
  | "ConnectionClosed"
  /**
   * The server could not be reached: refused, or the connection reset, the network or route
   * missing, a DNS server not answering (`ECONNRESET`, `EHOSTUNREACH`, `EAI_AGAIN`, ...).
   */
  | "ConnectionRefused"
  /** The stream does not exist. */
  | "StreamNotFound"
  /** The consumer does not exist. */
  | "ConsumerNotFound"
  /**
   * JetStream answered that it cannot serve the request now, and the same request may succeed
   * later (see `code`): 10008 "JetStream system temporarily unavailable" (the cluster electing a
   * leader), 10167 "too many requests" (a stream's ingest queue full), 10163 (a new stream leader
   * not ready, 2.11 pre-releases).
   */
  | "Unavailable"
  /**
   * The JetStream API refused the request (see `code`); retrying the same request cannot help.
   * Among them 10039, "JetStream not enabled for account": the server runs JetStream, the account
   * the connection logged in to does not have it.
   */
  | "ApiError"
  /** The server's reply was not what JetStream promises (e.g. a PubAck for another stream). */
  | "InvalidReply"
  /** Authentication or permissions. */
  | "NotAuthorized"
  | "Unknown"

const RETRYABLE: ReadonlySet<Reason> = new Set([
  "Timeout",
  "NoResponders",
  "ConnectionClosed",
  "ConnectionRefused",
  "Unavailable"
])

/**
 * The JetStream API codes (nats-server's `server/errors.json`) of a passing state. Other 503s are
 * of a lasting one and stay final `ApiError`s: JetStream not enabled (10076), JetStream not
 * enabled for the account (10039), insufficient resources (10023), no such account (10035),
 * another expected sequence (10063).
 */
const UNAVAILABLE_CODES: ReadonlySet<number> = new Set([10008, 10163, 10167])

/** A failed NATS or JetStream operation. */
export class NatsError extends Data.TaggedError("NatsError")<{
  readonly reason: Reason
  /** What was being done, e.g. `publish to LEDGER_DLQ`. */
  readonly operation: string
  readonly message: string
  /** The JetStream API error code, when the server sent one (e.g. 10059). */
  readonly code?: number | undefined
}> {
  /** Whether a later attempt may succeed. */
  get isRetryable(): boolean {
    return RETRYABLE.has(this.reason)
  }
}

const nameOf = (error: unknown): string =>
  typeof error === "object" && error !== null && typeof (error as { name?: unknown }).name === "string"
    ? (error as { name: string }).name
    : ""

const apiCodeOf = (error: unknown): number | undefined => {
  if (typeof error !== "object" || error === null) return undefined
  const api = (error as { api_error?: { err_code?: unknown } }).api_error
  if (api !== undefined && typeof api.err_code === "number") return api.err_code
  const code = (error as { code?: unknown }).code
  return typeof code === "number" ? code : undefined
}

const causeOf = (error: unknown): unknown =>
  typeof error === "object" && error !== null ? (error as { cause?: unknown }).cause : undefined

/**
 * Node's socket and resolver codes of a passing state: the peer reset or refused the connection,
 * the network or the route is not there yet, a DNS server did not answer (`EAI_AGAIN`; a name
 * that does not exist, `ENOTFOUND`, is lasting). A worker starting beside a proxy with no server
 * behind it yet, or in a network that is still coming up, waits for them as for a refusal.
 */
const PASSING_SOCKET_CODES: ReadonlySet<string> = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN"
])

/** Node's error code (`ECONNRESET`) of `error` or of its cause, or `undefined`. */
const socketCodeOf = (error: unknown): string | undefined => {
  for (const candidate of [error, causeOf(error)]) {
    if (typeof candidate !== "object" || candidate === null) continue
    const code = (candidate as { code?: unknown }).code
    if (typeof code === "string") return code
  }
  return undefined
}

/** Maps anything nats.js threw or rejected with to a {@link NatsError}. */
export const fromUnknown = (operation: string, error: unknown): NatsError => {
  const name = nameOf(error)
  const message = error instanceof Error ? error.message : String(error)
  const make = (reason: Reason, code?: number) => new NatsError({ reason, operation, message, code })
  const code = apiCodeOf(error)
  switch (name) {
    case "TimeoutError":
      return make("Timeout")
    case "NoResponders":
    case "NoRespondersError":
      return make("NoResponders")
    case "JetStreamNotEnabled": {
      // nats.js gives this name to two failures: nobody answered the JetStream API (a server
      // without JetStream, or one passing through a leader election: retryable), and the server's
      // own answer 10039 "JetStream not enabled for account", a lasting setting of the account.
      // The answer is mapped as any other API error is (10039 is a final ApiError).
      const answer = causeOf(error)
      return apiCodeOf(answer) === undefined ? make("NoResponders") : fromUnknown(operation, answer)
    }
    case "ClosedConnectionError":
    case "DrainingConnectionError":
      return make("ConnectionClosed")
    case "ConnectionError":
      return make("ConnectionRefused")
    case "AuthorizationError":
    case "PermissionViolationError":
    case "UserAuthenticationExpiredError":
      return make("NotAuthorized")
    case "StreamNotFoundError":
      return make("StreamNotFound", code)
    case "ConsumerNotFoundError":
      return make("ConsumerNotFound", code)
    case "RequestError": {
      const inner = nameOf(causeOf(error))
      if (inner === "NoResponders" || inner === "NoRespondersError") return make("NoResponders")
      if (inner === "TimeoutError") return make("Timeout")
      // The server refused the request's subject to this user: no retry helps.
      if (inner === "PermissionViolationError" || inner === "AuthorizationError") return make("NotAuthorized")
      return make("Unknown")
    }
  }
  if (code === 10059) return make("StreamNotFound", code)
  if (code === 10014) return make("ConsumerNotFound", code)
  if (code !== undefined && UNAVAILABLE_CODES.has(code)) return make("Unavailable", code)
  if (name === "JetStreamApiError" || code !== undefined) return make("ApiError", code)
  const socketCode = socketCodeOf(error)
  if (socketCode !== undefined && PASSING_SOCKET_CODES.has(socketCode)) return make("ConnectionRefused")
  return make("Unknown")
}

/** Runs a nats.js call, its rejection mapped to a {@link NatsError} of `operation`. */
export const tryPromise = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, NatsError> =>
  Effect.tryPromise({ try: f, catch: (error) => fromUnknown(operation, error) })

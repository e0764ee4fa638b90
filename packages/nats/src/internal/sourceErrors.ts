/**
 * `JetStreamSource`'s errors: a `NatsError` as the engine's `SourceError`, what to do about a
 * missing stream or consumer at start-up, and which pull failures end the intake for good.
 */
import { Source } from "@jetworker/core"
import * as NatsError from "../NatsError.ts"

/** A `NatsError` as a `SourceError`, its reason kept where the engine knows it. */
export const sourceError = (error: NatsError.NatsError): Source.SourceError =>
  new Source.SourceError({
    reason: error.reason === "StreamNotFound"
      ? "StreamNotFound"
      : error.reason === "ConsumerNotFound"
      ? "ConsumerNotFound"
      : error.reason === "ConnectionClosed" || error.reason === "ConnectionRefused"
      ? "ConnectionClosed"
      : error.reason === "NotAuthorized"
      ? "NotAuthorized"
      : "Unknown",
    message: `${error.operation}: ${error.message}`
  })

/**
 * What a retryable failure of an opening request says, and why waiting may help, for the one
 * warning line `open` logs before it tries again. `noJetStream`: the sentence naming a server that
 * runs no JetStream (`internal/serverHints.ts`), which then explains no responders.
 */
export const retryReason = (error: NatsError.NatsError, noJetStream?: string | undefined): string =>
  error.reason === "Timeout"
    ? "timed out (the NATS link may be reconnecting)"
    : error.reason === "NoResponders"
    ? noJetStream === undefined ? "had no responders (JetStream may be restarting or electing a leader)" : `had no responders: ${noJetStream}`
    : error.reason === "Unavailable"
    ? `was refused for now${error.code === undefined ? "" : ` (JetStream code ${error.code})`} (JetStream may be electing a leader)`
    : "found the NATS connection down (the NATS link may be reconnecting)"

/** A consumer or setting the engine cannot work with: retrying cannot help. */
export const mismatch = (message: string) => new Source.SourceError({ reason: "ContractMismatch", message })

/** A missing stream or consumer at start-up, with what to do about it. */
export const withNextStep = (error: Source.SourceError, stream: string, consumer: string): Source.SourceError =>
  error.reason === "StreamNotFound"
    ? new Source.SourceError({
      reason: error.reason,
      message: `${error.message}: stream ${stream} does not exist; declare it before the consumer runs ` +
        `(Topology.ensureStream({ name: "${stream}", subjects: [...] }), or \`nats stream add ${stream}\`), ` +
        `or point the source at the right stream`
    })
    : error.reason === "ConsumerNotFound"
    ? new Source.SourceError({
      reason: error.reason,
      message: `${error.message}: stream ${stream} has no durable consumer ${consumer}; declare it before the consumer runs ` +
        `(Topology.ensureConsumer({ stream: "${stream}", name: "${consumer}" }), or \`nats consumer add ${stream} ${consumer} --pull\`), ` +
        `or give the source the consumer's name (JetStreamSource.make({ stream, consumer }))`
    })
    : error

/**
 * What ends the intake of consumer `name` (`<stream>/<durable>`) for good; `undefined` for
 * anything retried after a pause.
 */
export const terminal = (name: string, error: unknown): Source.SourceError | undefined => {
  const text = error instanceof Error ? error.message : String(error)
  if (/consumer deleted/i.test(text)) {
    return new Source.SourceError({ reason: "ConsumerDeleted", message: `${name}: ${text}` })
  }
  // A pull the server refuses for good: a `409 Exceeded MaxRequest…` or `409 Consumer is push
  // based` status, or a `400 Bad Request - …` one (a request it cannot read), which come as
  // text from the pull's status; also JetStream's API error 10025 "bad request" of the check.
  if (/exceeded maxrequest|push based|bad request/i.test(text)) return mismatch(`${name}: the server refuses its pulls: ${text}`)
  const mapped = NatsError.fromUnknown(`pull ${name}`, error)
  // The consumer existed when the intake opened: missing now, it was deleted (found by the
  // check after a silent pull, when no pull of ours was open to hear the server's 409).
  if (mapped.reason === "ConsumerNotFound") {
    return new Source.SourceError({ reason: "ConsumerDeleted", message: `${name}: consumer deleted (${mapped.message})` })
  }
  return mapped.reason === "ConnectionClosed" || mapped.reason === "StreamNotFound" || mapped.reason === "NotAuthorized"
    ? sourceError(mapped)
    : undefined
}

/**
 * The subject to allow for what `command` publishes, from the `subject` the server refused: a
 * dead letter's subject as it is; an ack's (nak, term, `+WPI`) reply subject up to its consumer's
 * name, then `>` (`$JS.ACK.<stream>.<consumer>.>`, or with the domain and account hash of the long
 * form), which covers every delivery of the consumer.
 */
const grantFor = (command: string, subject: string): string => {
  if (command === "DeadLetter") return subject
  const tokens = subject.split(".")
  const consumerAt = tokens.length === 9 ? 3 : tokens.length >= 11 ? 5 : -1
  return consumerAt < 0 ? subject : `${tokens.slice(0, consumerAt + 1).join(".")}.>`
}

/**
 * The intake of consumer `name` (`<stream>/<durable>`) ended because the server refused `command`
 * (`Ack`, `Nak`, `Term`, `Extend`, `DeadLetter`) published to `subject` for lack of permission
 * (`error`, in the server's words): the permission is the connection's, so no message of the
 * consumer could be settled. Says what to grant.
 */
export const refusedSettling = (name: string, command: string, subject: string, error: NatsError.NatsError): Source.SourceError =>
  new Source.SourceError({
    reason: "NotAuthorized",
    message: `${name}: NATS refuses this connection's ${command === "DeadLetter" ? "dead letters" : "acks (and naks, terms, lease extensions)"} ` +
      `(${error.operation}: ${error.message}), so no message the consumer delivers can be settled: the consumer stops ` +
      `instead of running handlers whose results cannot be acknowledged. Grant the connection's user publish permission ` +
      `on "${grantFor(command, subject)}" (docs/nats-permissions.md); the messages it holds are redelivered after their ack wait`
  })

/**
 * The intake of consumer `name` (`<stream>/<durable>`) ended because the server refused its pull,
 * published to `subject` (the consumer's next-message API), for lack of permission (`message`, the
 * server's words): every pull of the connection would be refused, so the consumer would receive
 * nothing. Says what to grant.
 */
export const refusedPulls = (name: string, subject: string, message: string): Source.SourceError =>
  new Source.SourceError({
    reason: "NotAuthorized",
    message: `${name}: NATS refuses this connection's pulls (${message}), so the consumer would receive nothing: ` +
      `grant the connection's user publish permission on "${subject}" (docs/nats-permissions.md)`
  })

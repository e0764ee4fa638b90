/**
 * A JetStream publish nobody answered, told apart. nats.js says "jetstream is not enabled" both
 * when no stream captures the subject (lasting: the stream was deleted, or never captured it) and
 * when JetStream did not answer (passing: restarting, electing a leader; or a server without
 * JetStream). One stream look-up decides, as `Publisher.publish` decides it: no stream is a final
 * `StreamNotFound`, anything else stays a retryable `NoResponders`.
 */
import { Duration, Effect } from "effect"
import { NatsConnection } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"
import { explainNoJetStream } from "./serverHints.ts"

/**
 * What became of `stream`, the stream a subject was expected in, once no stream captures the
 * subject: it does not exist, or it exists with other subjects (named). A look-up that fails
 * says nothing (`undefined`).
 */
const whatBecameOf = (stream: string, role: string, boundMillis: number) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const info = yield* NatsError.tryPromise(`stream info ${stream}`, () => manager.streams.info(stream)).pipe(
      Effect.timeoutOption(Duration.millis(boundMillis)),
      Effect.result
    )
    if (info._tag === "Failure") return info.failure.reason === "StreamNotFound" ? `${role} ${stream} does not exist` : undefined
    if (info.success._tag === "None") return undefined
    const subjects = info.success.value.config.subjects ?? []
    return subjects.length === 0 ? `${role} ${stream} captures no subject` : `${role} ${stream} captures only ${subjects.join(", ")}`
  })

/**
 * `error`, a publish to `subject` expected in `stream` that nobody answered (`NoResponders`),
 * explained by asking which stream captures `subject` (and, when none does, whether `stream`
 * exists), each look-up within `timeoutMillis` (and the API timeout):
 *
 * - no stream captures it: `StreamNotFound` (final), "no stream captures subject `subject`
 *   (`role` `stream` does not exist)", or "(... captures only `its subjects`)";
 * - a stream captures it: `NoResponders` (retryable), that stream did not answer (JetStream
 *   unavailable or electing a leader);
 * - the look-up is not answered either: `NoResponders` (retryable), naming a server that runs no
 *   JetStream with how to enable it.
 *
 * `role` names `stream` in the text, e.g. `"source stream"`. Any other error is returned as it came.
 */
export const explainUnansweredPublish = (
  error: NatsError.NatsError,
  subject: string,
  stream: string,
  options: { readonly role?: string | undefined; readonly timeoutMillis?: number | undefined } = {}
): Effect.Effect<NatsError.NatsError, never, NatsConnection> =>
  Effect.gen(function*() {
    if (error.reason !== "NoResponders") return error
    const { connection, manager, apiTimeoutMillis } = yield* NatsConnection
    const role = options.role ?? "expected stream"
    const bound = Math.max(1, Math.min(options.timeoutMillis ?? apiTimeoutMillis, apiTimeoutMillis))
    const found = yield* NatsError.tryPromise(`find the stream of ${subject}`, () => manager.streams.find(subject)).pipe(
      Effect.timeoutOption(Duration.millis(bound)),
      Effect.result
    )
    if (found._tag === "Failure" && found.failure.reason === "StreamNotFound") {
      const became = yield* whatBecameOf(stream, role, bound)
      return new NatsError.NatsError({
        reason: "StreamNotFound",
        operation: error.operation,
        message: `no stream captures subject ${subject} (${became ?? `${role} ${stream}`})`
      })
    }
    const message = found._tag === "Success" && found.success._tag === "Some"
      ? `stream ${found.success.value} captures subject ${subject} but did not answer (JetStream unavailable or electing ` +
        `a leader); ${role} ${stream}`
      : `JetStream did not answer the publish to ${subject} nor the look-up of its stream ` +
        `(${found._tag === "Failure" ? found.failure.message : "timed out"}); ${role} ${stream}`
    return explainNoJetStream(new NatsError.NatsError({ ...error, message }), connection)
  })

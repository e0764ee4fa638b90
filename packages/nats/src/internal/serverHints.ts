/**
 * What the server's bare refusals leave out, added to the errors that carry them: a request nobody
 * answered on a server that runs no JetStream (nats.js says only "jetstream is not enabled"), and a
 * stream whose subjects overlap another stream's (nats-server 2.9 says only "subjects overlap with
 * an existing stream").
 */
import type { JetStreamManager } from "@nats-io/jetstream"
import type { NatsConnection as Connection } from "@nats-io/transport-node"
import { Effect } from "effect"
import { NatsConnection } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"
import { describeServers } from "./connectSettings.ts"

/**
 * When the server `connection` is on announces no JetStream (its INFO has no `jetstream`): a
 * sentence naming it (host:port, never credentials) and how to enable JetStream; otherwise
 * `undefined`. Read at the time of the call, so a server restarted with JetStream is not named.
 */
export const noJetStream = (connection: Connection): string | undefined => {
  const info = connection.info
  if (info === undefined || info.jetstream === true) return undefined
  return `the NATS server at ${describeServers(connection.getServer())} (nats-server ${info.version}) does not run JetStream: ` +
    "start it with JetStream enabled (`nats-server -js`, or a `jetstream {}` block in its configuration file), " +
    "or connect to a server that runs it"
}

/**
 * `error` with {@link noJetStream}'s sentence when nobody answered it on such a server; anything
 * else as it came. The reason stays `NoResponders` (retryable): a server restarted with JetStream
 * answers the next try.
 */
export const explainNoJetStream = (error: NatsError.NatsError, connection: Connection): NatsError.NatsError => {
  if (error.reason !== "NoResponders") return error
  const hint = noJetStream(connection)
  return hint === undefined || error.message.includes(hint) ? error : new NatsError.NatsError({ ...error, message: `${error.message}: ${hint}` })
}

/** `effect` with {@link explainNoJetStream} applied to its failure, on the current connection. */
export const namingServer = <A, R>(
  effect: Effect.Effect<A, NatsError.NatsError, R>
): Effect.Effect<A, NatsError.NatsError, R | NatsConnection> =>
  Effect.catchIf(
    effect,
    (error) => error.reason === "NoResponders",
    (error) => NatsConnection.use(({ connection }) => Effect.fail(explainNoJetStream(error, connection)))
  )

/** JetStream's API error for subjects that another stream already captures. */
export const SUBJECTS_OVERLAP = 10065

/** At most this many subjects are looked up to name the streams that hold them. */
const MAX_LOOKUPS = 20

/**
 * The refusal of stream `name` with `subjects` (`error`, code {@link SUBJECTS_OVERLAP}) reworded
 * to name the stream, each of its subjects another stream captures, and that stream with its
 * subjects, found by asking the server which streams each subject collides with (one request per
 * subject, at most {@link MAX_LOOKUPS}, then one stream info per stream found). A look-up that
 * fails leaves that part out: the stream and its subjects are named whatever happens.
 */
export const explainOverlap = (
  error: NatsError.NatsError,
  manager: JetStreamManager,
  name: string,
  subjects: ReadonlyArray<string>
): Effect.Effect<NatsError.NatsError> =>
  Effect.gen(function*() {
    const lookup = <A>(f: () => Promise<A>) => Effect.option(Effect.tryPromise(f))
    const holders = new Map<string, Array<string>>() // other stream -> our subjects it collides with
    for (const subject of subjects.slice(0, MAX_LOOKUPS)) {
      const names = yield* lookup(async () => {
        const found: Array<string> = []
        for await (const other of manager.streams.names(subject)) found.push(other)
        return found
      })
      for (const other of names._tag === "Some" ? names.value : []) {
        if (other !== name) holders.set(other, [...(holders.get(other) ?? []), subject])
      }
    }
    const clashes: Array<string> = []
    for (const [other, ours] of holders) {
      const info = yield* lookup(() => manager.streams.info(other))
      const theirs = info._tag === "Some" ? ` (${info.value.config.subjects.join(", ")})` : ""
      for (const subject of ours) clashes.push(`subject ${subject} overlaps stream ${other}${theirs}`)
    }
    const found = clashes.length === 0
      ? `one of its subjects (${subjects.join(", ")}) is captured by another stream`
      : clashes.join("; ")
    return new NatsError.NatsError({
      ...error,
      message: `stream ${name} cannot capture the subjects declared (the server answers "${error.message}"): ${found}. ` +
        "A subject is stored by one stream only: declare subjects no other stream captures, or take them out of the other stream first"
    })
  })

/**
 * The reading side of the dead-letter stream: `read` by sequence, `list` through a temporary
 * consumer (with its check for a replica that is behind), and the decoding of a stored dead
 * letter into a `DeadLetterMessage`. `DeadLetter` re-exports the public names and documents them.
 */
import {
  AckPolicy,
  type ConsumerMessages,
  DeliverPolicy,
  type JsMsg,
  type StoredMsg,
  type StreamState
} from "@nats-io/jetstream"
import { headers as makeHeaders, nanos } from "@nats-io/transport-node"
import { Duration, Effect } from "effect"
import { NatsConnection } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"
import { Header, originalName } from "./deadLetterHeaders.ts"

/** A dead-letter message as read back from the stream. */
export interface DeadLetterMessage {
  /** Its sequence in the dead-letter stream (what `replay` takes). */
  readonly sequence: number
  readonly sourceStream: string
  readonly consumer: string
  /** The subject the original was published on. */
  readonly subject: string
  readonly sourceSequence: number
  readonly deliveries: number
  readonly outcome: string
  readonly reason: string
  /** The cause as the engine summarised it (an `ErrorSummary`), parsed from JSON. */
  readonly error: unknown
  readonly eventId: string | undefined
  readonly failedAt: string
  /** The original payload, unchanged. */
  readonly payload: Uint8Array
  /** The original headers, `Nats-*` ones restored to their names. */
  readonly originalHeaders: ReadonlyArray<readonly [string, string]>
}

const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

// `read` gets a `StoredMsg`, `list` a `JsMsg`; both go through this one parser.
const fromStored = (stored: Pick<StoredMsg, "seq" | "header" | "data">): DeadLetterMessage => {
  const h = stored.header
  const get = (name: string) => h.get(name)
  const originalHeaders: Array<readonly [string, string]> = []
  for (const key of h.keys()) {
    if (key.startsWith(Header.originalPrefix)) {
      for (const value of h.values(key)) originalHeaders.push([originalName(key), value])
    } else if (!key.startsWith("Jetworker-") && !key.toLowerCase().startsWith("nats-")) {
      for (const value of h.values(key)) originalHeaders.push([key, value])
    }
  }
  const eventId = get(Header.eventId)
  return {
    sequence: stored.seq,
    sourceStream: get(Header.stream),
    consumer: get(Header.consumer),
    subject: get(Header.subject),
    sourceSequence: Number(get(Header.sequence)),
    deliveries: Number(get(Header.deliveries)),
    outcome: get(Header.outcome),
    reason: get(Header.reason),
    error: parseJson(get(Header.error)),
    eventId: eventId === "" ? undefined : eventId,
    failedAt: get(Header.failedAt),
    payload: stored.data,
    originalHeaders
  }
}

// The payload is copied so it does not keep the connection's whole read chunk alive.
const fromJsMsg = (msg: JsMsg): DeadLetterMessage =>
  fromStored({ seq: msg.seq, header: msg.headers ?? makeHeaders(), data: new Uint8Array(msg.data) })

/** Reads one dead-letter message by its sequence in the dead-letter stream. */
export const read = (
  stream: string,
  sequence: number
): Effect.Effect<DeadLetterMessage, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const stored = yield* Effect.tryPromise({
      try: () => manager.streams.getMessage(stream, { seq: sequence }),
      catch: (error) => NatsError.fromUnknown(`read ${stream}#${sequence}`, error)
    })
    if (stored === null) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation: `read ${stream}#${sequence}`,
        message: `no message ${sequence} in ${stream}`,
        code: 10037
      })
    }
    return fromStored(stored)
  })

/** How many dead letters one {@link list} returns at most. */
const listCap = 1000

/**
 * Reads the pull once it was sent: stops at the batch, at the stream's last sequence when the
 * listing started, or when the consumer has nothing more pending (so a dead letter replayed
 * meanwhile does not make it wait for the pull to expire).
 */
const collect = async (
  messages: ConsumerMessages,
  batch: number,
  lastSeq: number,
  signal: AbortSignal
): Promise<ReadonlyArray<DeadLetterMessage>> => {
  const onAbort = () => messages.stop()
  signal.addEventListener("abort", onAbort, { once: true })
  const out: Array<DeadLetterMessage> = []
  try {
    for await (const msg of messages) {
      if (msg.seq <= lastSeq) out.push(fromJsMsg(msg))
      if (out.length >= batch || msg.seq >= lastSeq || msg.info.pending === 0) break
    }
    return out
  } finally {
    signal.removeEventListener("abort", onAbort)
    // Unsubscribes the pull's inbox; nothing is left to ack (ack policy none).
    messages.stop()
  }
}

/** How often {@link list} creates its consumer before it gives up on a replica that is behind. */
const listAttempts = 5

/**
 * Lists up to `limit` (default 100, at most 1000) dead-letter messages, oldest first, with
 * sequences from `from` (default: the stream's first) up to the stream's last sequence when the
 * call starts. A missing stream fails with reason `StreamNotFound`.
 *
 * Cost, however many dead letters in the range were replayed (deleted): at most 4 JetStream API
 * requests — the stream's info, creating an ephemeral consumer starting at `from`, one pull of at
 * most `limit` messages, and deleting the consumer. An empty range costs the info request only.
 * Each request is bounded by the connection's API timeout, and so is the pull (plus one more API
 * timeout as a last resort); if the delete is lost, the consumer removes itself once inactive.
 *
 * In a cluster the consumer (one replica, in memory) may land on a replica that is still catching
 * up after a restart, and would see only what that replica holds. So when it has fewer messages
 * pending than the stream's leader says exist from `from` on, it is deleted and the listing
 * starts again (a few times, over about 3 seconds); then the call fails with reason `Unavailable`
 * (retryable: a replica is catching up) rather than return a short list, which a caller paging
 * through the stream would take for its end.
 */
export const list = (
  stream: string,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined } = {}
): Effect.Effect<ReadonlyArray<DeadLetterMessage>, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const operation = `list ${stream}`
    // Whole numbers for the server (a fractional limit or `from` keeps its old meaning).
    const limit = Math.max(0, Math.min(Math.ceil(options.limit ?? 100), listCap))
    for (let attempt = 1;; attempt++) {
      const info = yield* Effect.tryPromise({
        try: () => manager.streams.info(stream),
        catch: (error) => NatsError.fromUnknown(operation, error)
      })
      const listed = yield* listOnce(stream, operation, info.state, options.from, limit)
      if (listed !== undefined) return listed
      if (attempt >= listAttempts) {
        return yield* new NatsError.NatsError({
          reason: "Unavailable",
          operation,
          message: `a replica of ${stream} is catching up: the listing consumer saw fewer messages than the stream's ` +
            `leader holds, ${listAttempts} times; try again shortly`
        })
      }
      // The next consumer may land on another replica, or this one may have caught up by then.
      yield* Effect.sleep(Duration.millis(100 * 2 ** attempt))
    }
  })

/**
 * How many messages a stream with `state` surely holds from sequence `start` on: exactly its
 * count from its first sequence; otherwise the range less every deleted sequence (they may all
 * lie in it), or the count less every sequence before `start`, whichever is more.
 */
const surelyFrom = (state: StreamState, start: number): number =>
  start <= state.first_seq
    ? state.messages
    : Math.max(0, state.last_seq - start + 1 - (state.num_deleted ?? 0), state.messages - (start - state.first_seq))

/**
 * One listing with the stream's `state` as its leader gave it; `undefined` when the consumer has
 * fewer messages pending than that state surely holds from `start` on (its replica is behind).
 */
const listOnce = (
  stream: string,
  operation: string,
  state: StreamState,
  from: number | undefined,
  limit: number
): Effect.Effect<ReadonlyArray<DeadLetterMessage> | undefined, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager, jetstream, apiTimeoutMillis } = yield* NatsConnection
    const { first_seq: firstSeq, last_seq: lastSeq, messages } = state
    const start = Math.max(Math.ceil(from ?? firstSeq), firstSeq)
    // Negated comparisons so that a `limit` or `from` that is not a number lists nothing, as before.
    if (!(limit > 0) || messages === 0 || !(start <= lastSeq)) return []
    // nats.js refuses a pull that expires in under a second.
    const expires = Math.max(1_000, apiTimeoutMillis)
    return yield* Effect.scoped(Effect.gen(function*() {
      // One ephemeral consumer reads the range in a single pull, so deleted sequences cost
      // nothing (2.9 has no "next message after seq" lookup; direct batch get needs 2.11).
      const consumer = yield* Effect.acquireRelease(
        Effect.tryPromise({
          try: () =>
            manager.consumers.add(stream, {
              name: `jw_list_${crypto.randomUUID().replaceAll("-", "")}`,
              deliver_policy: DeliverPolicy.StartSequence,
              opt_start_seq: start,
              ack_policy: AckPolicy.None,
              mem_storage: true,
              num_replicas: 1,
              inactive_threshold: nanos(expires + 2 * apiTimeoutMillis)
            }),
          catch: (error) => NatsError.fromUnknown(operation, error)
        }),
        (created) => Effect.promise(() => manager.consumers.delete(stream, created.name).catch(() => false))
      )
      // Fewer than the leader holds: this replica is behind. (A deletion since the info looks the
      // same; the next attempt reads the info again.)
      if (consumer.num_pending < surelyFrom(state, start)) return undefined
      // What the stream holds from `start` (at creation); more would only wait for the pull to expire.
      const batch = Math.min(limit, consumer.num_pending)
      if (batch === 0) return []
      const pull = yield* Effect.tryPromise({
        try: () => jetstream.consumers.getConsumerFromInfo(consumer).fetch({ max_messages: batch, expires }),
        catch: (error) => NatsError.fromUnknown(operation, error)
      })
      return yield* Effect.tryPromise({
        try: (signal) => collect(pull, batch, lastSeq, signal),
        catch: (error) => NatsError.fromUnknown(operation, error)
      }).pipe(
        Effect.timeoutOrElse({
          duration: Duration.millis(expires + apiTimeoutMillis),
          orElse: () =>
            Effect.fail(
              new NatsError.NatsError({
                reason: "Timeout",
                operation,
                message: `no end of the pull within ${expires + apiTimeoutMillis} ms`
              })
            )
        })
      )
    }))
  })

/**
 * A throw-away JetStream stream with one durable pull consumer, for tests: unique names per call,
 * deleted (with its dead-letter and MaxDeliver capture streams) when the scope closes. Everything else a test needs about
 * the stream (publishing, consumer info) goes through the real server.
 *
 * @since 0.1.0
 */
import type { ConsumerInfo } from "@nats-io/jetstream"
import { DeadLetter, MaxDeliveries, NatsConnection, NatsError, Publisher, Topology } from "@jetworker/nats"
import { Duration, Effect, type Scope } from "effect"

/** A live throw-away stream and consumer. */
export interface TestStream {
  /** Stream name, e.g. `T_1a2b3c`. */
  readonly stream: string
  /** Durable consumer name. */
  readonly consumer: string
  /** The stream's subjects are `<prefix>.>`. */
  readonly subjectPrefix: string
  /** The dead-letter stream jetworker's source uses by default for this consumer. */
  readonly deadLetterStream: string
  /** A subject of this stream: `<prefix>.<suffix>`. */
  readonly subject: (suffix: string) => string
  /** Publishes (confirmed) a payload with `Nats-Msg-Id` = `msgId`; returns the stream sequence. */
  readonly publish: (
    suffix: string,
    payload: string | Uint8Array,
    msgId: string
  ) => Effect.Effect<number, NatsError.NatsError>
  /** The consumer's live info. */
  readonly info: Effect.Effect<ConsumerInfo, NatsError.NatsError>
  /** How many messages the stream stores now. */
  readonly stored: Effect.Effect<number, NatsError.NatsError>
}

/** Options of {@link make}. */
export interface Options {
  /** Lease per delivery. Default: 5 seconds. */
  readonly ackWait?: Duration.Input | undefined
  /** Default: -1. */
  readonly maxDeliver?: number | undefined
  /** Default: 1000. */
  readonly maxAckPending?: number | undefined
  /** Name prefix. Default: `T`. */
  readonly prefix?: string | undefined
}

const encoder = new TextEncoder()

/** Creates a unique stream and consumer; the scope deletes them and the dead-letter stream. */
export const make = (
  options: Options = {}
): Effect.Effect<TestStream, NatsError.NatsError, NatsConnection.NatsConnection | Scope.Scope> =>
  Effect.gen(function*() {
    const connection = yield* NatsConnection.NatsConnection
    const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
    const stream = `${options.prefix ?? "T"}_${id}`
    const subjectPrefix = `t_${id}`
    const consumer = "worker"
    const deadLetterStream = DeadLetter.destination(stream, consumer).stream
    yield* Effect.addFinalizer(() =>
      Effect.forEach([stream, deadLetterStream, MaxDeliveries.captureStream(stream, consumer)], (name) =>
        Effect.promise(() => connection.manager.streams.delete(name).catch(() => false)).pipe(
          Effect.timeoutOption(Duration.seconds(5))
        ), { discard: true })
    )
    yield* Topology.ensureStream({ name: stream, subjects: [`${subjectPrefix}.>`], storage: "file" })
    yield* Topology.ensureConsumer({
      stream,
      name: consumer,
      ackWait: options.ackWait ?? "5 seconds",
      maxDeliver: options.maxDeliver ?? -1,
      maxAckPending: options.maxAckPending ?? 1000
    })
    const subject = (suffix: string) => `${subjectPrefix}.${suffix}`
    return {
      stream,
      consumer,
      subjectPrefix,
      deadLetterStream,
      subject,
      publish: (suffix, payload, msgId) =>
        Publisher.publish(subject(suffix), typeof payload === "string" ? encoder.encode(payload) : payload, {
          msgId,
          stream
        }).pipe(Effect.map((ack) => ack.seq), Effect.provideService(NatsConnection.NatsConnection, connection)),
      info: NatsError.tryPromise(`info ${stream}/${consumer}`, () => connection.manager.consumers.info(stream, consumer)),
      stored: NatsError.tryPromise(`info ${stream}`, () => connection.manager.streams.info(stream).then((info) => info.state.messages))
    }
  })

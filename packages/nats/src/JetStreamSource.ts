/**
 * A JetStream durable pull consumer as the engine's `Source`. Opening it checks the live consumer
 * against what the engine needs (explicit acks; `max_deliver` above the retry policy's attempts so
 * the last attempt can dead-letter the message itself), ensures the dead-letter stream, and pulls
 * with `consume({ max_messages: prefetch })`, so at most about `prefetch` messages are reserved
 * ahead of the handlers. Closing it stops pulling and naks whatever is still buffered, so those
 * messages go to another instance at once instead of waiting out their ack wait.
 *
 * It does not create the source stream or consumer: declare them with `Topology` (a service that
 * owns its consumer) or let a platform team own them.
 *
 * @since 0.1.0
 */
import type { ConsumerMessages, JsMsg } from "@nats-io/jetstream"
import { type Delivery, Source, Telemetry } from "@jetworker/core"
import { Duration, Effect, Metric, Option } from "effect"
import * as DeadLetter from "./DeadLetter.ts"
import { toDelivery } from "./internal/delivery.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

/** Which consumer to read, and how. */
export interface Options {
  /** The stream. */
  readonly stream: string
  /** The durable pull consumer on it. */
  readonly consumer: string
  /** Lifetime of one pull request on the server. Default: 30 seconds (nats.js clamps to >= 1 s). */
  readonly pullExpires?: Duration.Input | undefined
  /** Bound on each ack, nak, term or dead-letter publish confirmation. Default: 5 seconds. */
  readonly settleTimeout?: Duration.Input | undefined
  /** Where terminal failures go. Default: stream `<stream>_DLQ`, created when missing. */
  readonly deadLetter?: DeadLetter.Options | undefined
  /**
   * How often the consumer's lag (`num_pending`) and unacknowledged count (`num_ack_pending`)
   * are read from the server into the `jetworker.consumer.lag` and `jetworker.consumer.ack_pending`
   * gauges; each read is one request, bounded by the API timeout. Default: 10 seconds.
   */
  readonly lagInterval?: Duration.Input | undefined
}

const sourceError = (error: NatsError.NatsError): Source.SourceError =>
  new Source.SourceError({
    reason: error.reason === "StreamNotFound"
      ? "StreamNotFound"
      : error.reason === "ConsumerNotFound"
      ? "ConsumerNotFound"
      : error.reason === "ConnectionClosed" || error.reason === "ConnectionRefused"
      ? "ConnectionClosed"
      : "Unknown",
    message: `${error.operation}: ${error.message}`
  })

const mismatch = (message: string) => new Source.SourceError({ reason: "ContractMismatch", message })

/** A source reading `options.consumer` on `options.stream`. */
export const make = (options: Options): Source.Source<NatsConnection> => {
  const name = `${options.stream}/${options.consumer}`
  const settleTimeoutMillis = Duration.toMillis(Duration.fromInputUnsafe(options.settleTimeout ?? "5 seconds"))
  const expiresMillis = Math.max(1000, Duration.toMillis(Duration.fromInputUnsafe(options.pullExpires ?? "30 seconds")))
  const destination = DeadLetter.destination(options.stream, options.consumer, options.deadLetter)
  const lagInterval = Duration.fromInputUnsafe(options.lagInterval ?? "10 seconds")

  const open = (open: Source.OpenOptions) =>
    Effect.gen(function*() {
      const connection = yield* NatsConnection
      const call = <A>(operation: string, f: () => Promise<A>) =>
        Effect.tryPromise({ try: f, catch: (error) => sourceError(NatsError.fromUnknown(operation, error)) })

      const info = yield* call(`consumer info ${name}`, () => connection.manager.consumers.info(options.stream, options.consumer))
      const config = info.config
      if (config.ack_policy !== "explicit") {
        return yield* mismatch(`${name} has ack policy ${config.ack_policy}; jetworker needs explicit acks`)
      }
      const maxDeliver = config.max_deliver ?? -1
      if (maxDeliver !== -1 && maxDeliver <= open.attempts) {
        return yield* mismatch(
          `${name} has max_deliver ${maxDeliver}; it must exceed the retry policy's ${open.attempts} attempts ` +
            `so that the last attempt can dead-letter the message itself`
        )
      }
      if (config.backoff !== undefined && config.backoff.length > 0) {
        yield* Effect.logWarning(`${name} has a server backoff; on NATS 2.9 it distorts the engine's nak delays`)
      }
      if (config.max_ack_pending !== undefined && config.max_ack_pending > 0 && config.max_ack_pending < open.prefetch) {
        yield* Effect.logWarning(`${name} has max_ack_pending ${config.max_ack_pending} below prefetch ${open.prefetch}`)
      }
      const lease = Duration.millis(Math.floor((config.ack_wait ?? 30_000_000_000) / 1_000_000))

      // The consumer's lag, polled while the intake is open (a failed read skips one update).
      const attributes = { consumer: options.consumer, stream: options.stream }
      const lag = Metric.withAttributes(Telemetry.consumerLag, attributes)
      const ackPending = Metric.withAttributes(Telemetry.ackPending, attributes)
      const recordLag = (pending: { readonly num_pending: number; readonly num_ack_pending: number }) =>
        Effect.andThen(Metric.update(lag, pending.num_pending), Metric.update(ackPending, pending.num_ack_pending))
      yield* recordLag(info)
      yield* call(`consumer info ${name}`, () => connection.manager.consumers.info(options.stream, options.consumer)).pipe(
        Effect.flatMap(recordLag),
        Effect.ignore,
        Effect.delay(lagInterval),
        Effect.forever,
        Effect.forkScoped
      )

      yield* DeadLetter.ensure(destination, options.deadLetter).pipe(
        Effect.provideService(NatsConnection, connection),
        Effect.mapError(sourceError)
      )

      const consumer = yield* call(`consumer ${name}`, () => connection.jetstream.consumers.get(options.stream, options.consumer))
      const messages: ConsumerMessages = yield* call(`consume ${name}`, () =>
        consumer.consume({
          max_messages: open.prefetch,
          expires: expiresMillis,
          abort_on_missing_resource: true
        }))
      const iterator = messages[Symbol.asyncIterator]()
      // The one outstanding `next()`; kept across an interrupted `take` so no message is dropped.
      let pending: Promise<IteratorResult<JsMsg>> | undefined
      let closed = false

      const nextMessage = (): Promise<IteratorResult<JsMsg>> => {
        pending ??= iterator.next()
        return pending
      }

      const take: Effect.Effect<Delivery.Delivery, Source.SourceError> = Effect.suspend(() =>
        closed
          ? Effect.fail(new Source.SourceError({ reason: "ConnectionClosed", message: `${name}: intake closed` }))
          : Effect.tryPromise({
            try: () => nextMessage(),
            catch: (error) => {
              pending = undefined
              const mapped = NatsError.fromUnknown(`consume ${name}`, error)
              const text = String(error)
              return /consumer deleted/i.test(text)
                ? new Source.SourceError({ reason: "ConsumerDeleted", message: `${name}: ${text}` })
                : sourceError(mapped)
            }
          }).pipe(
            Effect.flatMap((result) => {
              pending = undefined
              if (result.done === true) {
                return Effect.fail(
                  new Source.SourceError({
                    reason: "ConnectionClosed",
                    message: connection.connection.isClosed()
                      ? `${name}: the NATS connection closed`
                      : `${name}: the consumer stopped delivering`
                  })
                )
              }
              return Effect.succeed(toDelivery(connection, settleTimeoutMillis, destination, result.value))
            })
          )
      )

      // Stop pulling, then nak what nats.js still yields from its buffer (bounded).
      const close = Effect.suspend(() => {
        if (closed) return Effect.void
        closed = true
        return Effect.gen(function*() {
          // A round trip first: what the server already sent lands in the buffer (and is naked
          // below) instead of being dropped with the inbox and waiting out its ack wait.
          yield* Effect.promise(() => connection.connection.flush().catch(() => undefined)).pipe(
            Effect.timeoutOption(Duration.millis(settleTimeoutMillis))
          )
          messages.stop()
          let released = 0
          while (true) {
            const next = yield* Effect.promise(() => nextMessage().catch(() => ({ done: true as const, value: undefined })))
              .pipe(Effect.timeoutOption(Duration.millis(settleTimeoutMillis)))
            pending = undefined
            if (Option.isNone(next) || next.value.done === true) break
            const delivery = toDelivery(connection, settleTimeoutMillis, destination, next.value.value)
            yield* delivery.nak(Duration.zero).pipe(Effect.ignore)
            released++
          }
          if (released > 0) yield* Effect.logInfo(`${name}: released ${released} buffered messages`)
        })
      })
      yield* Effect.addFinalizer(() => close)
      return { lease, maxDeliver: maxDeliver > 0 ? maxDeliver : undefined, take, close } satisfies Source.Intake
    })

  return { name, open }
}

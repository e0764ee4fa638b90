/**
 * A JetStream durable pull consumer as the engine's `Source`. Opening it checks the live consumer
 * against what the engine needs (explicit acks; `max_deliver` above the retry policy's attempts so
 * the last attempt can dead-letter the message itself), ensures the dead-letter stream, and pulls
 * with requests sized to the free room, answered on one inbox subscription, so at most `prefetch`
 * messages are reserved (buffered or on their way) ahead of the handlers the engine runs. (Not
 * nats.js's `consume()`: it re-pulls a full batch on top of its buffer whenever the handlers pause
 * for two idle heartbeats.) Closing it stops pulling and naks whatever is still buffered, so those
 * messages go to another instance at once instead of waiting out their ack wait.
 *
 * It does not create the source stream or consumer: declare them with `Topology` (a service that
 * owns its consumer) or let a platform team own them.
 *
 * This module opens the source (the checks, the lag gauges, the dead-letter stream, MaxDeliver
 * capture); the intake itself is in `internal/intake.ts` (`take`, `close`), `internal/pulls.ts`
 * (the pulls and their count) and `internal/intakeWatch.ts` (reconnects, leader changes, silence).
 *
 * The opening requests (consumer info, the dead-letter and MaxDeliver-capture streams) ride out a
 * NATS blip: a failure that may pass (a timeout, no responders, JetStream unavailable, the link
 * reconnecting) is retried with a jittered backoff from 100 ms to 2 s, one warning line per retry,
 * for at most `openRetryTimeout` (default 30 s, on the monotonic clock) from the first request (a
 * worker's `STARTUP_TIMEOUT` may cut it sooner). A request still waiting when the link reconnects
 * is lost (nats.js drops its outbound buffer when it redials, and a reply sent on the old link never
 * comes): it is given up and retried at once, not at the end of its API timeout. A final answer (a
 * missing stream or consumer, a refused permission or request, a contract mismatch) and a
 * connection closed for good fail `open` at once. On a server that runs no JetStream, the retry
 * lines and the failure name the server (host:port) and how to enable JetStream.
 *
 * @since 0.1.0
 */
import { type Source, Telemetry } from "@jetworker/core"
import { Clock, Deferred, Duration, Effect, Fiber, Metric, Schedule, type Scope, Stream } from "effect"
import * as Contract from "./Contract.ts"
import * as DeadLetter from "./DeadLetter.ts"
import { ackAll } from "./internal/delivery.ts"
import { openIntake } from "./internal/intake.ts"
import { explainNoJetStream, noJetStream } from "./internal/serverHints.ts"
import { mismatch, retryReason, sourceError, withNextStep } from "./internal/sourceErrors.ts"
import { settingsOf } from "./internal/sourceSettings.ts"
import * as MaxDeliveries from "./MaxDeliveries.ts"
import { NatsConnection, type Shape as Connection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

const openRetryBaseMillis = 100
const openRetryCapMillis = 2_000

/** The clock's monotonic time in milliseconds (an arbitrary origin: only differences mean anything). */
const monotonicMillis = Effect.map(Clock.monotonicTimeNanos, (nanos) => Number(nanos) / 1_000_000)

/** The reconnects of the link while a source opens, heard by one status listener for all its requests. */
interface Reconnects {
  /** Done at the first reconnect after this call. */
  readonly next: () => Deferred.Deferred<void>
  /** Stops listening (also done when the scope closes). */
  readonly stop: Effect.Effect<void>
}

/** Listens to `connection`'s reconnects from now on, until `stop` or the scope's end. */
const listenForReconnects = (connection: Connection): Effect.Effect<Reconnects, never, Scope.Scope> =>
  Effect.gen(function*() {
    // Registered now, before the first request is sent: nats.js queues what it reports meanwhile.
    const status = connection.connection.status()
    let next = Deferred.makeUnsafe<void>()
    const listener = yield* Stream.fromAsyncIterable(status, (error) => error).pipe(
      Stream.filter((status) => status.type === "reconnect"),
      Stream.runForEach(() =>
        Effect.sync(() => {
          const reached = next
          next = Deferred.makeUnsafe<void>()
          Deferred.doneUnsafe(reached, Effect.void)
        })
      ),
      Effect.ignore,
      Effect.forkScoped
    )
    return { next: () => next, stop: Fiber.interrupt(listener) }
  })

/**
 * `effect`, an opening request `what` of source `name`, retried while its failure may pass, the
 * connection is not closed or draining for good, and the next try starts before `deadline` (on
 * the monotonic clock, in milliseconds). A try still running when the link reconnects is given
 * up and retried at once: what it sent before was lost (see the module's note).
 */
const retryOpening = <A, R>(
  name: string,
  what: string,
  connection: Connection,
  reconnects: Reconnects,
  deadline: number,
  effect: Effect.Effect<A, NatsError.NatsError, R>
): Effect.Effect<A, NatsError.NatsError, R> => {
  let retries = 0
  // The tries given up at a reconnect.
  const lost = new WeakSet<NatsError.NatsError>()
  const attempt = Effect.suspend(() =>
    Effect.raceFirst(
      effect,
      Effect.flatMap(Deferred.await(reconnects.next()), () => {
        // "Timeout": no reply came, and the request may or may not have taken effect.
        const error = new NatsError.NatsError({
          reason: "Timeout",
          operation: `${what} for ${name}`,
          message: "no reply: the NATS link reconnected while the request waited for it"
        })
        lost.add(error)
        return Effect.fail(error)
      })
    )
  )
  const schedule = Schedule.exponential(Duration.millis(openRetryBaseMillis), 2).pipe(
    Schedule.setInputType<NatsError.NatsError>(),
    Schedule.jittered,
    Schedule.modifyDelay(({ duration, input }) =>
      Effect.succeed(lost.has(input) ? Duration.zero : Duration.min(duration, Duration.millis(openRetryCapMillis)))
    ),
    Schedule.while(({ duration, input }) =>
      Effect.flatMap(monotonicMillis, (now) => {
        // A closed connection never comes back (nats.js gave up, or it is being shut down).
        const retry = input.isRetryable && !connection.connection.isClosed() && !connection.connection.isDraining() &&
          now + Duration.toMillis(duration) < deadline
        if (!retry) return Effect.succeed(false)
        retries++
        const delay = Math.round(Duration.toMillis(duration))
        // The request that failed, when `what` (an ensure) makes several.
        const detail = input.operation.startsWith(what) ? "" : ` (${input.operation})`
        const reason = lost.has(input) ? "was lost as the NATS link reconnected" : retryReason(input, noJetStream(connection.connection))
        return Effect.as(Effect.logWarning(`JetStreamSource ${name}: ${what}${detail} ${reason}; retrying in ${delay} ms`), true)
      })
    )
  )
  return attempt.pipe(
    Effect.retry(schedule),
    // Given up on a failure that may pass: say it was waited for, so the cause is not a one-off.
    Effect.mapError((error) =>
      retries === 0 || !error.isRetryable ? error : new NatsError.NatsError({
        reason: error.reason,
        operation: error.operation,
        code: error.code,
        message: `${error.message} (after ${retries} ${retries === 1 ? "retry" : "retries"})`
      })
    )
  )
}

/** Which consumer to read, and how. */
export interface Options {
  /** The stream. */
  readonly stream: string
  /** The durable pull consumer on it. Default: the name of the consumer that opens the source. */
  readonly consumer?: string | undefined
  /**
   * Lifetime of one pull request on the server, from 1 second to 2147483647 ms (~24.8 days).
   * Default: 30 seconds.
   */
  readonly pullExpires?: Duration.Input | undefined
  /**
   * Bound on each ack, nak, term, lease extension or dead-letter publish confirmation, from
   * 1 millisecond to 2147483647 ms (~24.8 days). Default: 5 seconds.
   */
  readonly settleTimeout?: Duration.Input | undefined
  /** Where terminal failures go. Default: stream `<stream>_DLQ`, created when missing. */
  readonly deadLetter?: DeadLetter.Options | undefined
  /**
   * How often the consumer's lag (`num_pending`) and unacknowledged count (`num_ack_pending`)
   * are read from the server into the `jetworker.consumer.lag` and `jetworker.consumer.ack_pending`
   * gauges; each read is one request, bounded by the API timeout. From 100 milliseconds to
   * 2147483647 ms (~24.8 days). Default: 10 seconds.
   */
  readonly lagInterval?: Duration.Input | undefined
  /**
   * Whether a consumer with a MaxDeliver captures the server's MaxDeliver advisories into a
   * stream and, while it runs, stores each message the server gave up on in the dead-letter
   * stream (see `MaxDeliveries`; checked every `lagInterval`). Default: true.
   */
  readonly captureMaxDeliveries?: boolean | undefined
  /**
   * How long `open` retries its opening requests (consumer info, the dead-letter and
   * MaxDeliver-capture streams) when they fail in a way that may pass (a timeout, no responders,
   * JetStream unavailable, the link reconnecting): no retry starts later than this after the
   * first request, on the monotonic clock (a step of the wall clock neither stretches nor cuts
   * it). Retries back off from 100 ms to 2 s (jittered) and each logs a warning; a request still
   * waiting when the link reconnects is lost, and retried at once. A final answer, or a
   * connection closed for good, fails `open` at once. From 0 (no retries) to 2147483647 ms
   * (~24.8 days). Default: 30 seconds (a worker's `STARTUP_TIMEOUT` may cut it sooner).
   */
  readonly openRetryTimeout?: Duration.Input | undefined
}

/**
 * A source reading `options.consumer` (default: the opening consumer's name) on `options.stream`.
 * Its durations are checked here, and a value that cannot work fails `open` with a `SourceError`
 * (reason `ContractMismatch`) naming the option and the value, before any request to the server.
 */
export const make = (options: Options): Source.Source<NatsConnection> => {
  const settings = settingsOf(options)

  const open = (open: Source.OpenOptions) =>
    Effect.gen(function*() {
      const durable = options.consumer ?? open.consumer
      const name = `${options.stream}/${durable}`
      if (!("settleTimeoutMillis" in settings)) {
        // The closed set of reasons has none for settings; like a mismatch, retrying cannot help.
        return yield* mismatch(`JetStreamSource ${name}: ${settings.join("; ")}`)
      }
      const { expiresMillis, openRetryMillis, settleTimeoutMillis } = settings
      const lagInterval = Duration.millis(settings.lagIntervalMillis)
      const destination = DeadLetter.destination(options.stream, durable, options.deadLetter)
      const connection = yield* NatsConnection
      const call = <A>(operation: string, f: () => Promise<A>) => Effect.mapError(NatsError.tryPromise(operation, f), sourceError)
      // Monotonic: a step of the wall clock during start-up would stretch or cut the retries.
      const deadline = (yield* monotonicMillis) + openRetryMillis
      // One listener for all the opening requests, stopped once they are done.
      const reconnects = yield* listenForReconnects(connection)
      const retrying = <A>(what: string, effect: Effect.Effect<A, NatsError.NatsError, NatsConnection>) =>
        retryOpening(name, what, connection, reconnects, deadline, effect).pipe(
          // A server without JetStream named, with the fix, in the failure (its retries say it too).
          Effect.mapError((error) => explainNoJetStream(error, connection.connection)),
          Effect.provideService(NatsConnection, connection),
          Effect.mapError(sourceError)
        )

      const info = yield* retrying(
        "consumer info",
        NatsError.tryPromise(`consumer info ${name}`, () => connection.manager.consumers.info(options.stream, durable))
      ).pipe(Effect.mapError((error) => withNextStep(error, options.stream, durable)))
      const config = info.config
      // The consumer's checks are the contract's (one set, see Contract): warnings are logged,
      // the first error refuses to open.
      const findings = Contract.consumerFindings(name, config, {
        attempts: open.attempts,
        concurrency: open.concurrency ?? 0,
        prefetch: open.prefetch,
        ordering: open.ordering,
        maxProcessingTime: open.handlerTimeout,
        pullExpires: Duration.millis(expiresMillis)
      })
      for (const finding of findings) {
        if (finding.severity === "warning") yield* Effect.logWarning(finding.message)
      }
      const refused = findings.find((finding) => finding.severity === "error")
      if (refused !== undefined) return yield* mismatch(refused.message)
      const maxDeliver = config.max_deliver ?? -1
      const lease = Duration.millis(Math.floor((config.ack_wait ?? 30_000_000_000) / 1_000_000))

      // The consumer's lag, polled while the intake is open (a failed read skips one update).
      const attributes = { consumer: durable, stream: options.stream }
      const lag = Metric.withAttributes(Telemetry.consumerLag, attributes)
      const ackPending = Metric.withAttributes(Telemetry.ackPending, attributes)
      const recordLag = (pending: { readonly num_pending: number; readonly num_ack_pending: number }) =>
        Effect.andThen(Metric.update(lag, pending.num_pending), Metric.update(ackPending, pending.num_ack_pending))
      yield* recordLag(info)
      yield* call(`consumer info ${name}`, () => connection.manager.consumers.info(options.stream, durable)).pipe(
        Effect.flatMap(recordLag),
        Effect.ignore,
        Effect.delay(lagInterval),
        Effect.forever,
        Effect.forkScoped
      )

      yield* retrying(`dead-letter stream ${destination.stream}`, DeadLetter.ensure(destination, options.deadLetter))

      if (maxDeliver > 0 && options.captureMaxDeliveries !== false) {
        // Captured from now on, whoever listens; stored as dead letters while this intake is open.
        yield* retrying(
          `MaxDeliver capture stream ${MaxDeliveries.captureStream(options.stream, durable)}`,
          MaxDeliveries.ensure(options.stream, durable)
        )
        yield* MaxDeliveries.recoverCaptured({ stream: options.stream, consumer: durable, deadLetter: options.deadLetter }).pipe(
          Effect.provideService(NatsConnection, connection),
          Effect.catch((error) => Effect.logWarning(`${name}: MaxDeliver advisories not handled yet: ${error.message}`)),
          Effect.andThen(Effect.sleep(lagInterval)),
          Effect.forever,
          Effect.forkScoped
        )
      }
      yield* reconnects.stop

      const { take, holdBuffered, close } = yield* openIntake({
        stream: options.stream,
        durable,
        connection,
        prefetch: open.prefetch,
        leaseMillis: Duration.toMillis(lease),
        expiresMillis,
        settleTimeoutMillis,
        destination,
        onHealth: open.onHealth
      })
      return { lease, maxDeliver: maxDeliver > 0 ? maxDeliver : undefined, take, ackAll, holdBuffered, close } satisfies Source.Intake
    })

  // Without a consumer given, the durable is the opening consumer's: named by its stream until then.
  return { name: options.consumer === undefined ? options.stream : `${options.stream}/${options.consumer}`, open }
}

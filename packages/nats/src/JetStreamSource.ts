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
 * @since 0.1.0
 */
import { createInbox, type Msg, type Subscription } from "@nats-io/transport-node"
import { type Delivery, DurationInput, Source, Telemetry } from "@jetworker/core"
import { Clock, Duration, Effect, Metric, Stream } from "effect"
import * as Contract from "./Contract.ts"
import * as DeadLetter from "./DeadLetter.ts"
import * as MaxDeliveries from "./MaxDeliveries.ts"
import { ackAll, parse, type Pulled, toDelivery } from "./internal/delivery.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

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

const encoder = new TextEncoder()

const mismatch = (message: string) => new Source.SourceError({ reason: "ContractMismatch", message })

/** A missing stream or consumer at start-up, with what to do about it. */
const withNextStep = (error: Source.SourceError, stream: string, consumer: string): Source.SourceError =>
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

// The longest a Node timer waits: a longer one fires at once (and settles, pulls or polls in a loop).
const MAX_TIMER_MILLIS = 2 ** 31 - 1


/** `input` in milliseconds, or `undefined` when it does not parse or holds a NaN (see `DurationInput`). */
const millisOf = (input: Duration.Input): number | undefined => {
  const duration = DurationInput.parse(input)
  return duration === undefined ? undefined : Duration.toMillis(duration)
}

/** The options' durations in milliseconds, checked. */
interface Settings {
  readonly settleTimeoutMillis: number
  readonly expiresMillis: number
  readonly lagIntervalMillis: number
}

/**
 * The durations, or what is wrong with them. Checked once, when the source is made, and reported
 * by `open` (a `Source` reports its problems there): `make` never throws.
 */
const settingsOf = (options: Options): Settings | ReadonlyArray<string> => {
  const problems: Array<string> = []
  const check = (name: string, input: Duration.Input | undefined, fallback: number, min: number, minText: string) => {
    const millis = input === undefined ? fallback : millisOf(input)
    if (millis !== undefined && millis >= min && millis <= MAX_TIMER_MILLIS) return millis
    problems.push(`${name} must be a duration from ${minText} to ${MAX_TIMER_MILLIS} ms, got ${DurationInput.show(input)}`)
    return fallback
  }
  // 0 would have every confirmation time out before its reply.
  const settleTimeoutMillis = check("settleTimeout", options.settleTimeout, 5_000, 1, "1 millisecond")
  // Shorter pulls only cost requests; the idle heartbeat (half the expiry) needs room to be heard.
  const expiresMillis = check("pullExpires", options.pullExpires, 30_000, 1_000, "1 second")
  // Each tick is a consumer-info request to the JetStream API (and a MaxDeliver recovery round):
  // faster than 10 a second floods the server for a gauge read every few seconds.
  const lagIntervalMillis = check("lagInterval", options.lagInterval, 10_000, 100, "100 milliseconds")
  return problems.length > 0 ? problems : { settleTimeoutMillis, expiresMillis, lagIntervalMillis }
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
      const { expiresMillis, settleTimeoutMillis } = settings
      const lagInterval = Duration.millis(settings.lagIntervalMillis)
      const destination = DeadLetter.destination(options.stream, durable, options.deadLetter)
      const connection = yield* NatsConnection
      const call = <A>(operation: string, f: () => Promise<A>) => Effect.mapError(NatsError.tryPromise(operation, f), sourceError)

      const info = yield* call(`consumer info ${name}`, () => connection.manager.consumers.info(options.stream, durable)).pipe(
        Effect.mapError((error) => withNextStep(error, options.stream, durable))
      )
      const config = info.config
      // The consumer's checks are the contract's (one set, see Contract): warnings are logged,
      // the first error refuses to open.
      const findings = Contract.consumerFindings(name, config, {
        attempts: open.attempts,
        concurrency: open.concurrency ?? 0,
        prefetch: open.prefetch,
        ordering: open.ordering,
        maxProcessingTime: open.handlerTimeout
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

      yield* DeadLetter.ensure(destination, options.deadLetter).pipe(
        Effect.provideService(NatsConnection, connection),
        Effect.mapError(sourceError)
      )

      if (maxDeliver > 0 && options.captureMaxDeliveries !== false) {
        // Captured from now on, whoever listens; stored as dead letters while this intake is open.
        yield* MaxDeliveries.ensure(options.stream, durable).pipe(
          Effect.provideService(NatsConnection, connection),
          Effect.mapError(sourceError)
        )
        yield* MaxDeliveries.recoverCaptured({ stream: options.stream, consumer: durable, deadLetter: options.deadLetter }).pipe(
          Effect.provideService(NatsConnection, connection),
          Effect.catch((error) => Effect.logWarning(`${name}: MaxDeliver advisories not handled yet: ${error.message}`)),
          Effect.andThen(Effect.sleep(lagInterval)),
          Effect.forever,
          Effect.forkScoped
        )
      }

      // The intake keeps its own count, so that `prefetch` bounds what the server has handed out:
      // what has arrived and waits for `take` (`buffered`) plus what open pulls still ask for
      // (`requested`) never exceeds `prefetch`; a pull asks for the free room, once that is at
      // least a quarter of `prefetch`. (nats.js's `consume()` does not bound it: after two missed
      // idle heartbeats, which is any pause of the handlers longer than `pullExpires` while its
      // buffer is full, it re-pulls a whole `max_messages` on top of what it holds, and again at
      // every heartbeat interval, so a slow consumer is handed out many times `prefetch`.)
      //
      // Pulls are requests to the consumer's next-message API whose replies come to one inbox
      // subscription, open while the intake is: a pull costs one publish, not the subscription,
      // iterator, timers and promises of a nats.js `fetch` (which also kept each message alive
      // long enough to reach the old generation, doubling the heap's peak). Each pull has a reply
      // subject of its own, so the server's status for it (408 expired, 409 ...) says which pull
      // ended and how many of its messages it did not send (`Nats-Pending-Messages`).
      const prefetch = open.prefetch
      const minPull = Math.max(1, Math.ceil(prefetch / 4))
      // The server sends an idle heartbeat for each waiting pull; two missed mean it serves none.
      const heartbeatMillis = Math.min(5_000, Math.floor(expiresMillis / 2))
      const silenceMillis = 2 * heartbeatMillis + 500
      const pullSubject = `$JS.API.CONSUMER.MSG.NEXT.${options.stream}.${durable}`
      let inbox = `${createInbox()}.`
      // The intake's own events happen in the client's callbacks: logged through the services it
      // was opened with (the process's logger and annotations).
      const services = yield* Effect.context<never>()
      // Receipts on the monotonic time of the clock the intake was opened with, as the engine's
      // leases count (`Delivery.receivedAt`).
      const clock = yield* Clock.Clock
      const receivedNow = () => Number(clock.monotonicTimeNanosUnsafe()) / 1_000_000
      const logWarning = (message: string) => void Effect.runForkWith(services)(Effect.logWarning(message))
      // The intake's events an operator watches for, as annotated lines (`event`, the consumer's name).
      const logEvent = (level: "Info" | "Warning", event: string, message: string, fields: Record<string, unknown> = {}) =>
        void Effect.runForkWith(services)(
          (level === "Info" ? Effect.logInfo(message) : Effect.logWarning(message)).pipe(
            Effect.annotateLogs({ event, consumer: durable, stream: options.stream, ...fields })
          )
        )
      // When the silence watchdog wrote the pulls off (the last word heard before it), until the
      // consumer answers again and the room is pulled (`intake.resumed`).
      let stalledSince: number | undefined
      // Messages of written-off pulls left to their ack wait for want of room, not yet reported.
      let leftToAckWait = 0
      // Inboxes of pulls written off (after a silence or a reconnect), still subscribed until the
      // server has dropped those pulls (see `writeOff` and `pause`).
      const retired: Array<Subscription> = []
      const buffered: Array<Pulled> = []
      const settling = { connection, settleTimeoutMillis, destination }
      let requested = 0
      // Open pulls, oldest first: the server fills them in order, so arrivals are counted against
      // the oldest. (Only used to end a pull; `requested` is kept exactly by the statuses.)
      const waiting: Array<{ readonly id: string; readonly batch: number; readonly sentAt: number; received: number }> = []
      let nextPull = 0
      // Silence and pull ages on the monotonic clock (a wall clock step would fake or hide silence).
      let lastHeard = performance.now()
      // What ended the intake for good; surfaces once `buffered` is drained.
      let failure: Source.SourceError | undefined
      // After a failed pull: a growing pause, then a consumer info check, before pulling again.
      let pausing = false
      let pauseMillis = 0
      let pauseTimer: ReturnType<typeof setTimeout> | undefined
      let closed = false
      // Resumes the `take` that waits for a message (never more than one).
      let wake: (() => void) | undefined
      const signal = () => {
        const resume = wake
        wake = undefined
        resume?.()
      }
      const fail = (error: Source.SourceError) => {
        failure ??= error
        signal()
      }

      // What ends the intake for good; anything else is retried after a pause.
      const terminal = (error: unknown): Source.SourceError | undefined => {
        const text = error instanceof Error ? error.message : String(error)
        if (/consumer deleted/i.test(text)) {
          return new Source.SourceError({ reason: "ConsumerDeleted", message: `${name}: ${text}` })
        }
        // A pull the server refuses for good: a `409 Exceeded MaxRequest…` or `409 Consumer is push
        // based` status, or a `400 Bad Request - …` one (a request it cannot read), which come as
        // text from `onStatus`; also JetStream's API error 10025 "bad request" of the check.
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

      // Within `settleTimeoutMillis`, failed or not: a step of the checks below and of `close`, never a hang.
      const boundedPromise = (f: () => Promise<unknown>): Promise<void> =>
        new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, settleTimeoutMillis)
          f().then(() => undefined, () => undefined).then(() => {
            clearTimeout(timer)
            resolve()
          })
        })

      // Pulls written off may still be open on the server (a link that froze without breaking, a
      // pull that outlived a reconnect): what they bring first is read (a round trip), then their
      // inbox is unsubscribed, and the consumer info that follows makes the server drop requests
      // whose inbox has no interest, before the room is pulled again.
      const dropRetired = (): Promise<void> => {
        if (retired.length === 0) return Promise.resolve()
        return boundedPromise(() => connection.connection.flush()).then(() => {
          for (const old of retired.splice(0)) if (!old.isClosed()) old.unsubscribe()
          if (leftToAckWait > 0) {
            logWarning(`${name}: ${leftToAckWait} messages of written-off pulls arrived with the buffer full; they are redelivered after their ack wait`)
            leftToAckWait = 0
          }
          return boundedPromise(() => connection.connection.flush())
        })
      }

      const pause = () => {
        if (pausing || closed || failure !== undefined) return
        pausing = true
        pauseMillis = Math.min(5_000, pauseMillis === 0 ? 100 : pauseMillis * 2)
        pauseTimer = setTimeout(() => {
          pauseTimer = undefined
          // Like nats.js after missed heartbeats: pull again only while the consumer exists.
          void dropRetired().then(() => connection.manager.consumers.info(options.stream, durable)).then(
            () => {
              pausing = false
              if (stalledSince !== undefined) {
                const stalledMs = Math.round(performance.now() - stalledSince)
                stalledSince = undefined
                logEvent("Info", "intake.resumed", `${name}: the consumer answers again after ${stalledMs} ms stalled; pulling again`, { stalledMs })
              }
              pump()
            },
            (error: unknown) => {
              pausing = false
              const ended = terminal(error)
              if (ended === undefined) pause()
              else fail(ended)
            }
          )
        }, pauseMillis)
      }

      const pump = () => {
        if (closed || pausing || failure !== undefined) return
        const room = prefetch - buffered.length - requested
        if (room >= minPull) pull(room)
      }

      const pull = (batch: number) => {
        const id = (nextPull++).toString(36)
        const now = performance.now()
        requested += batch
        const thisPull = { id, batch, sentAt: now, received: 0 }
        waiting.push(thisPull)
        lastHeard = now
        // It leaves with the acks sent in the same turn of the event loop (`publishSoon`).
        connection.publishSoon(
          pullSubject,
          encoder.encode(`{"batch":${batch},"expires":${Math.round(expiresMillis * 1_000_000)},"idle_heartbeat":${heartbeatMillis * 1_000_000}}`),
          inbox + id,
          (error) => {
            // Never sent, so never answered: nothing of it is on its way.
            requested -= batch
            const at = waiting.indexOf(thisPull)
            if (at >= 0) waiting.splice(at, 1)
            const ended = terminal(error)
            if (ended === undefined) pause()
            else fail(ended)
          }
        )
      }

      // A status for one pull: it ended (expired, refused, or the server gave up on it).
      const onStatus = (msg: Msg) => {
        const code = msg.headers?.code ?? 0
        if (code === 100) return // an idle heartbeat: the pull is still open
        const at = waiting.findIndex((p) => inbox + p.id === msg.subject)
        const ended = at >= 0 ? waiting.splice(at, 1)[0] : undefined
        const unsent = Number(msg.headers?.get("Nats-Pending-Messages") || NaN)
        requested = Math.max(0, requested - (Number.isSafeInteger(unsent) ? unsent : ended === undefined ? 0 : ended.batch - ended.received))
        if (closed) return
        const text = `${code} ${msg.headers?.description ?? ""}`.trim()
        if (code === 408 || code === 404) {
          // Ended early with nothing (not by its expiry): do not spin on it.
          if (ended !== undefined && ended.received === 0 && performance.now() - ended.sentAt < expiresMillis / 2) pause()
          else pump()
          return
        }
        const fatal = terminal(new Error(text))
        if (fatal !== undefined) return fail(fatal)
        // No responders (JetStream or the consumer unavailable), a leader change, a full
        // waiting queue: pull again after a pause, once the consumer answers.
        pause()
      }

      // Each message is buffered as it is read from the socket, in the server's order.
      const onInbox = (error: Error | null, msg: Msg) => {
        if (error !== null) {
          const ended = terminal(error)
          if (ended === undefined) pause()
          else fail(ended)
          return
        }
        lastHeard = performance.now()
        const pulled = parse(msg, receivedNow())
        if (pulled === undefined) return onStatus(msg)
        // A pull re-sent after a reconnect may bring more than was counted.
        if (requested > 0) requested--
        const oldest = waiting[0]
        if (oldest !== undefined && ++oldest.received >= oldest.batch) waiting.shift()
        pauseMillis = 0
        buffered.push(pulled)
        signal()
      }

      // A message for a pull written off (its inbox retired): kept while the buffer has room
      // beside what the open pulls will bring, else left to its ack wait (redelivered then), so the
      // intake never holds more than `prefetch`. A retired pull's statuses say nothing now.
      const onRetired = (error: Error | null, msg: Msg) => {
        if (error !== null || closed) return
        const pulled = parse(msg, receivedNow())
        if (pulled === undefined) return
        if (buffered.length + requested < prefetch) {
          buffered.push(pulled)
          signal()
        } else leftToAckWait++
      }

      const listen = (): Subscription => {
        const listening: Subscription = connection.connection.subscribe(`${inbox}*`, {
          callback: (error, msg) => (listening === subscription ? onInbox(error, msg) : onRetired(error, msg))
        })
        void listening.closed.then(() => {
          if (!closed && listening === subscription) {
            fail(new Source.SourceError({ reason: "ConnectionClosed", message: `${name}: the NATS connection closed` }))
          }
        })
        return listening
      }
      let subscription = listen()

      // Writes off the open pulls: the server may still hold them, so their inbox is retired, and
      // the next pulls go to a new one once the old is dropped (`pause`): the room is not pulled
      // twice, and what is counted is what was sent since.
      const writeOff = () => {
        requested = 0
        waiting.length = 0
        retired.push(subscription)
        inbox = `${createInbox()}.`
        subscription = listen()
      }

      // After a reconnect: a pull sent while disconnected was lost with the client's outbound
      // buffer (it is never answered), and those sent before may or may not have survived; all
      // are written off and the room pulled again once the consumer answers (as nats.js does).
      yield* Stream.fromAsyncIterable(connection.connection.status(), (error) => error).pipe(
        Stream.filter((status) => status.type === "reconnect"),
        Stream.runForEach(() =>
          Effect.sync(() => {
            if (closed || failure !== undefined) return
            if (requested > 0 || waiting.length > 0) {
              logWarning(`${name}: reconnected; ${requested} messages pulled before are written off and the consumer checked before pulling again`)
              writeOff()
            }
            pause()
          })
        ),
        Effect.ignore,
        Effect.forkScoped
      )

      // A new consumer leader: nats-server 2.9 drops the waiting pulls when the leadership moves.
      // It may answer them with a `409 Leadership Change`, or not at all, and then only the silence
      // watchdog notices (two heartbeats, ~10-15 s); when the dead node led the stream too, a pull
      // sent meanwhile was measured waiting ~5 s for its messages. The new leader announces itself:
      // the open pulls are written off (their inbox retired until the server has dropped them, so
      // `prefetch` still bounds what is handed out) and the room is pulled again once the consumer
      // answers, as after a reconnect. Without permission to subscribe to the advisory the server
      // refuses the subscription: then the intake goes on as before (the watchdog notices).
      const leaderElected = `$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.${options.stream}.${durable}`
      const advisories = connection.connection.subscribe(leaderElected, {
        callback: (error) => {
          if (closed) return
          if (error !== null) {
            logWarning(`${name}: cannot subscribe to ${leaderElected} (${error.message}); a consumer leader change is noticed only after two missed heartbeats`)
            return
          }
          if (failure !== undefined) return
          logEvent("Info", "intake.leader_changed", `${name}: the consumer has a new leader; ${requested} messages pulled before are written off and pulled again`, {
            pulled: requested
          })
          if (requested > 0 || waiting.length > 0) writeOff()
          // A pause already running pulls when it ends; otherwise the next one starts short.
          if (!pausing) pauseMillis = 0
          pause()
        }
      })

      // Two heartbeats without a word while pulls are open: the server lost them (a restart, a
      // lost connection) or never had them: a pull to a consumer deleted while no pull of ours was
      // open (the server answers an open pull's deletion with a 409) gets no answer at all. The
      // count is reset and the room pulled again once the consumer is known to exist (`pause`),
      // as nats.js does after missed heartbeats. A tick that came late (the event loop was busy)
      // judges nothing: what arrived meanwhile is not read yet.
      let lastTick = performance.now()
      const watchdog = setInterval(() => {
        const now = performance.now()
        const late = now - lastTick - heartbeatMillis
        lastTick = now
        if (late > heartbeatMillis / 2) lastHeard = now
        else if (requested > 0 && !pausing && now - lastHeard > silenceMillis) {
          const silenceMs = Math.round(now - lastHeard)
          logEvent(
            "Warning",
            "intake.stalled",
            `${name}: no word from the server for ${silenceMs} ms with ${requested} messages pulled; ` +
              "the pulls are written off and the consumer checked before pulling again",
            { silenceMs, pulled: requested }
          )
          stalledSince ??= lastHeard
          writeOff()
          pause()
        }
      }, heartbeatMillis)
      watchdog.unref()

      const take: Effect.Effect<Delivery.Delivery, Source.SourceError> = Effect.suspend(() => {
        if (closed) return Effect.fail(new Source.SourceError({ reason: "ConnectionClosed", message: `${name}: intake closed` }))
        // Taken synchronously: an interrupted `take` leaves every message in `buffered`.
        const pulled = buffered.shift()
        if (pulled !== undefined) {
          pump()
          return Effect.succeed(toDelivery(settling, pulled))
        }
        if (failure !== undefined) return Effect.fail(failure)
        pump()
        return Effect.andThen(
          Effect.callback<void>((resume) => {
            // Something may have arrived since the check above (the fiber can yield in between).
            if (buffered.length > 0 || failure !== undefined || closed) return resume(Effect.void)
            const resumeTake = () => resume(Effect.void)
            wake = resumeTake
            return Effect.sync(() => {
              if (wake === resumeTake) wake = undefined
            })
          }),
          take
        )
      })

      // Stop pulling, then nak what is still delivered and what is buffered (bounded).
      const close = Effect.suspend(() => {
        if (closed) return Effect.void
        closed = true
        clearInterval(watchdog)
        if (pauseTimer !== undefined) clearTimeout(pauseTimer)
        signal()
        const bounded = (f: () => Promise<unknown>) => Effect.promise(() => boundedPromise(f))
        return Effect.gen(function*() {
          // A round trip first: what the server already sent lands in the buffer (and is naked
          // below) instead of being dropped with the inbox and waiting out its ack wait.
          yield* bounded(() => connection.connection.flush())
          for (const open of [advisories, subscription, ...retired.splice(0)]) if (!open.isClosed()) open.unsubscribe()
          // The server keeps an open pull's request waiting until it expires, and NATS 2.9 would
          // hand the next nak (below, or of a handler cut by the drain) to that dead inbox: the
          // message then waits out its ack wait, or is handed out twice. A round trip for the
          // unsubscribe, then a consumer info, which drops requests whose inbox has no interest.
          yield* bounded(() => connection.connection.flush())
          yield* bounded(() => connection.manager.consumers.info(options.stream, durable))
          const rest = buffered.splice(0)
          yield* Effect.forEach(
            rest,
            (pulled) => toDelivery(settling, pulled).nak(Duration.zero).pipe(Effect.ignore),
            { concurrency: 16, discard: true }
          )
          if (rest.length > 0) yield* Effect.logInfo(`${name}: released ${rest.length} buffered messages`)
        })
      })
      yield* Effect.addFinalizer(() => close)
      pump()
      return { lease, maxDeliver: maxDeliver > 0 ? maxDeliver : undefined, take, ackAll, close } satisfies Source.Intake
    })

  // Without a consumer given, the durable is the opening consumer's: named by its stream until then.
  return { name: options.consumer === undefined ? options.stream : `${options.stream}/${options.consumer}`, open }
}

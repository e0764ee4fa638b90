/**
 * A `JetStreamSource`'s intake once the consumer is checked: its pulls and what watches them,
 * `take` for the engine, `holdBuffered` (the buffered messages' leases kept while the engine is
 * paused), and `close`, which stops pulling and naks what is still buffered so those messages go
 * to another instance at once instead of waiting out their ack wait. Over a link that is down
 * (disconnected, stale or closed) `close` sends nothing and waits for nothing: no round trip can
 * be answered and no nak arrive, and the server redelivers what it had handed out after its ack
 * wait; a link lost while `close` waits ends the wait.
 */
import { type Delivery, Probe, Source } from "@jetworker/core"
import { Clock, Duration, Effect, type Scope } from "effect"
import type * as DeadLetter from "../DeadLetter.ts"
import type { Shape } from "../NatsConnection.ts"
import { toDelivery } from "./delivery.ts"
import { makeBufferedLeases } from "./bufferedLeases.ts"
import type * as NatsError from "../NatsError.ts"
import { fail, type IntakeEnv, initialState, signal } from "./intakeState.ts"
import { startWatchdog, watchLeader, watchLink } from "./intakeWatch.ts"
import { boundedPromise, makePulls } from "./pulls.ts"
import { refusedSettling } from "./sourceErrors.ts"

/** The checked consumer an intake reads. */
export interface IntakeOptions {
  readonly stream: string
  readonly durable: string
  readonly connection: Shape
  readonly prefetch: number
  /** The consumer's ack wait, in milliseconds. */
  readonly leaseMillis: number
  readonly expiresMillis: number
  readonly settleTimeoutMillis: number
  readonly destination: DeadLetter.Destination
  /** The engine's `OpenOptions.onHealth`: told when the intake stalls and when it pulls again. */
  readonly onHealth?: ((health: Source.Health) => Effect.Effect<void>) | undefined
}

/** The intake's `take`, `holdBuffered` and `close` (also run when the scope closes); it pulls from now on. */
export const openIntake = (
  options: IntakeOptions
): Effect.Effect<Required<Pick<Source.Intake, "take" | "holdBuffered" | "close">>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { connection, durable, stream } = options
    const name = `${stream}/${durable}`
    // The intake's own events happen in the client's callbacks: logged through the services it
    // was opened with (the process's logger and annotations).
    const services = yield* Effect.context<never>()
    // Receipts on the monotonic time of the clock the intake was opened with, as the engine's
    // leases count (`Delivery.receivedAt`).
    const clock = yield* Clock.Clock
    const env: IntakeEnv = {
      name,
      stream,
      durable,
      connection,
      prefetch: options.prefetch,
      expiresMillis: options.expiresMillis,
      settleTimeoutMillis: options.settleTimeoutMillis,
      destination: options.destination,
      // The server sends an idle heartbeat for each waiting pull; two missed mean it serves none.
      heartbeatMillis: Math.min(5_000, Math.floor(options.expiresMillis / 2)),
      receivedNow: () => Number(clock.monotonicTimeNanosUnsafe()) / 1_000_000,
      logWarning: (message) => void Effect.runForkWith(services)(Effect.logWarning(message)),
      logEvent: (level, event, message, fields = {}) =>
        void Effect.runForkWith(services)(
          (level === "Info" ? Effect.logInfo(message) : Effect.logWarning(message)).pipe(
            Effect.annotateLogs({ event, consumer: durable, stream, ...fields })
          )
        ),
      reportHealth: (health) => {
        if (options.onHealth !== undefined) void Effect.runForkWith(services)(options.onHealth(health))
      }
    }
    const state = initialState()
    // `close` only waits on the server over a live link (`watchLink`): a flush or request over a
    // dead one would wait out its whole bound (3 × settleTimeout with nothing in flight).
    // Ends when the link is (or goes) down: what raced against it stops waiting on the server.
    const linkLost = Effect.callback<void>((resume) => {
      if (state.linkDown || connection.connection.isClosed()) return resume(Effect.void)
      const lost = () => resume(Effect.void)
      state.onLinkLost.add(lost)
      return Effect.sync(() => {
        state.onLinkLost.delete(lost)
      })
    })
    const whileLinkUp = <A, E>(effect: Effect.Effect<A, E>) => Effect.asVoid(Effect.raceFirst(effect, linkLost))
    // A settling command refused for lack of permission: the permission is the connection's, so
    // every delivery's command would be refused too, and handlers would run for results that can
    // never be acknowledged (each message redelivered after its ack wait, for ever without a
    // MaxDeliver). The intake ends now, not once its buffer is drained: what it buffers can be
    // neither settled nor released, and is left to its ack wait; nothing more is pulled.
    const refused = (command: string, subject: string, error: NatsError.NatsError) => {
      if (state.closed || state.refused !== undefined) return
      state.refused = refusedSettling(name, command, subject, error)
      state.buffered.length = 0
      fail(state, state.refused)
    }
    // The probe is read once, as the engine reads it: the default one (which does nothing) is skipped.
    const probe = yield* Probe.Probe
    const settling = {
      connection,
      settleTimeoutMillis: options.settleTimeoutMillis,
      destination: options.destination,
      refused,
      ...(probe === Probe.noop ? {} : { probe, durable })
    }
    const pulls = makePulls(env, state)
    yield* watchLink(env, state, pulls)
    const advisories = watchLeader(env, state, pulls)
    const watchdog = startWatchdog(env, state, pulls)
    const bufferedLeases = makeBufferedLeases(env, state, options.leaseMillis, (pulled, error) => refused("Extend", pulled.reply, error))

    const take: Effect.Effect<Delivery.Delivery, Source.SourceError> = Effect.suspend(() => {
      if (state.closed) return Effect.fail(new Source.SourceError({ reason: "ConnectionClosed", message: `${name}: intake closed` }))
      if (state.refused !== undefined) return Effect.fail(state.refused)
      // Taken synchronously: an interrupted `take` leaves every message in `buffered`.
      const pulled = state.buffered.shift()
      if (pulled !== undefined) {
        pulls.pump()
        return Effect.succeed(toDelivery(settling, pulled))
      }
      if (state.failure !== undefined) return Effect.fail(state.failure)
      pulls.pump()
      return Effect.andThen(
        Effect.callback<void>((resume) => {
          // Something may have arrived since the check above (the fiber can yield in between).
          if (state.buffered.length > 0 || state.failure !== undefined || state.closed) return resume(Effect.void)
          const resumeTake = () => resume(Effect.void)
          state.wake = resumeTake
          return Effect.sync(() => {
            if (state.wake === resumeTake) state.wake = undefined
          })
        }),
        take
      )
    })

    // Stop pulling, then nak what is still delivered and what is buffered (bounded, and only
    // while the link is up).
    const close = Effect.suspend(() => {
      if (state.closed) return Effect.void
      state.closed = true
      clearInterval(watchdog)
      bufferedLeases.stop()
      pulls.cancelPause()
      signal(state)
      const bounded = (f: () => Promise<unknown>) =>
        whileLinkUp(Effect.promise(() => boundedPromise(options.settleTimeoutMillis, f)))
      return Effect.gen(function*() {
        // A round trip first: what the server already sent lands in the buffer (and is naked
        // below) instead of being dropped with the inbox and waiting out its ack wait.
        yield* bounded(() => connection.connection.flush())
        if (!advisories.isClosed()) advisories.unsubscribe()
        pulls.unsubscribe()
        // The server keeps an open pull's request waiting until it expires, and NATS 2.9 would
        // hand the next nak (below, or of a handler cut by the drain) to that dead inbox: the
        // message then waits out its ack wait, or is handed out twice. A round trip for the
        // unsubscribe, then a consumer info, which drops requests whose inbox has no interest.
        yield* bounded(() => connection.connection.flush())
        yield* bounded(() => connection.manager.consumers.info(stream, durable))
        const rest = state.buffered.splice(0)
        if (rest.length === 0) return
        if (state.refused !== undefined) {
          // Their naks would be refused as the acks were.
          return yield* Effect.logWarning(`${name}: ${rest.length} buffered messages not released (NATS refuses this connection's naks); the server redelivers them after their ack wait`)
        }
        let released = 0
        yield* whileLinkUp(Effect.forEach(
          rest,
          (pulled) =>
            toDelivery(settling, pulled).nak(Duration.zero).pipe(
              Effect.andThen(Effect.sync(() => {
                released++
              })),
              Effect.ignore
            ),
          { concurrency: 16, discard: true }
        ))
        if (released > 0) yield* Effect.logInfo(`${name}: released ${released} buffered messages`)
        if (released < rest.length) {
          yield* Effect.logWarning(
            `${name}: ${rest.length - released} buffered messages not released (no confirmation from NATS, or its ` +
              "link is down); the server redelivers them after their ack wait"
          )
        }
      })
    })
    yield* Effect.addFinalizer(() => close)
    pulls.pump()
    return { take, holdBuffered: bufferedLeases.hold, close }
  })

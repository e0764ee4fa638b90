/**
 * Turns a JetStream message, as the source's pull subscription receives it, into the engine's
 * `Delivery`. Every command is a request to the message's reply subject, so the server's (empty)
 * reply confirms it; nats.js's own `nak`/`term`/`working` are fire-and-forget and silently lost
 * while disconnected.
 */
import type { Msg } from "@nats-io/transport-node"
import { nanos } from "@nats-io/transport-node"
import { Delivery } from "@jetworker/core"
import type { Outcome, Probe } from "@jetworker/core"
import { Duration, Effect } from "effect"
import * as DeadLetter from "../DeadLetter.ts"
import type { Shape } from "../NatsConnection.ts"
import { NatsConnection } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"

/** A message a pull delivered, with what its reply subject says about it. */
export interface Pulled {
  readonly msg: Msg
  /** The reply subject, which acks, naks and terminates it. */
  readonly reply: string
  readonly stream: string
  readonly deliveryCount: number
  readonly streamSequence: number
  /** When the stream stored it, in epoch milliseconds. */
  readonly storedAtMillis: number
  /** The consumer's pending count when it was delivered. */
  readonly pending: number
  /**
   * When the source read it from the socket, on the monotonic time of the source's `Clock`, in
   * milliseconds (`Delivery.receivedAt`): its ack wait ran from then at the latest. While it waits
   * in the intake's buffer, the sending of a confirmed extension moves it (see `bufferedLeases.ts`).
   */
  receivedAt: number
}

/**
 * Reads a JetStream delivery's reply subject: `$JS.ACK.<stream>.<consumer>.<deliveries>.<stream
 * seq>.<consumer seq>.<stored, ns>.<pending>`, or the form with a domain and account hash after
 * `ACK` (12 tokens, as newer servers send). `undefined` for anything else.
 */
export const parse = (msg: Msg, receivedAt: number): Pulled | undefined => {
  const reply = msg.reply
  if (reply === undefined || !reply.startsWith("$JS.ACK.")) return undefined
  const tokens = reply.split(".")
  // The short form lacks the domain and the account hash: its stream is the third token.
  const at = tokens.length === 9 ? 2 : tokens.length >= 11 ? 4 : -1
  if (at < 0) return undefined
  const stored = tokens[at + 5]!
  const pulled: Pulled = {
    msg,
    reply,
    stream: tokens[at]!,
    deliveryCount: Number(tokens[at + 2]),
    streamSequence: Number(tokens[at + 3]),
    // Nanoseconds (19 digits now) to milliseconds by dropping six digits: exact, no bigint.
    storedAtMillis: stored.length > 6 ? Number(stored.slice(0, -6)) : 0,
    pending: Number(tokens[at + 6]),
    receivedAt
  }
  return Number.isSafeInteger(pulled.deliveryCount) && Number.isSafeInteger(pulled.streamSequence) ? pulled : undefined
}

const encoder = new TextEncoder()
const ACK = encoder.encode("+ACK")
const NAK = encoder.encode("-NAK")
const TERM = encoder.encode("+TERM")
const WPI = encoder.encode("+WPI")

// A permission refusal is `Refused`: sending the command again cannot help.
const settleError = (command: Delivery.SettleCommand, error: NatsError.NatsError) =>
  new Delivery.SettleError({
    command,
    reason: error.reason === "Timeout"
      ? "Timeout"
      : error.reason === "ApiError" || error.reason === "InvalidReply" || error.reason === "NotAuthorized"
      ? "Refused"
      : "Unavailable",
    message: `${error.operation}: ${error.message}`
  })

/** What settling a delivery needs beyond the delivery itself: the same for every delivery of a source. */
export interface Settling {
  readonly connection: Shape
  readonly settleTimeoutMillis: number
  readonly destination: DeadLetter.Destination
  /**
   * Told when the server refuses a command for lack of permission (`NotAuthorized`): `command`,
   * the `subject` it was published to, and the error. The same refusal meets every delivery of the
   * source, so the intake ends (see `intake.ts`).
   */
  readonly refused?: ((command: Delivery.SettleCommand, subject: string, error: NatsError.NatsError) => void) | undefined
  /**
   * The probe the intake was opened with, when it is not the default one that does nothing: told
   * `after-dead-letter` once a dead letter is stored, before the original's term is sent (the
   * consumer named by `durable`).
   */
  readonly probe?: Probe.ProbeShape | undefined
  /** The JetStream consumer's name, for the probe's hits. */
  readonly durable?: string | undefined
}

/** `error` as the engine's `SettleError`, a permission refusal told to `settling` first. */
const failed = (settling: Settling, command: Delivery.SettleCommand, subject: string, error: NatsError.NatsError) => {
  if (error.reason === "NotAuthorized") settling.refused?.(command, subject, error)
  return settleError(command, error)
}

const toVoid = (): void => undefined

/**
 * The engine's view of a pulled message. A class, so that a delivery costs one small object:
 * its commands are methods and getters of the prototype, and each command's effect is built only
 * when it is used (most deliveries send one ack). Its methods must be called on the delivery.
 */
class JetStreamDelivery implements Delivery.Delivery {
  readonly subject: string
  readonly payload: Uint8Array
  readonly sequence: number
  readonly deliveryCount: number
  readonly publishedAt: number
  readonly pending: number
  readonly receivedAt: number
  readonly #settling: Settling
  readonly #pulled: Pulled

  constructor(settling: Settling, pulled: Pulled) {
    this.#settling = settling
    this.#pulled = pulled
    this.subject = pulled.msg.subject
    this.payload = pulled.msg.data
    this.sequence = pulled.streamSequence
    this.deliveryCount = pulled.deliveryCount
    this.publishedAt = pulled.storedAtMillis
    this.pending = pulled.pending
    this.receivedAt = pulled.receivedAt
  }

  header(name: string): string | undefined {
    const headers = this.#pulled.msg.headers
    if (headers === undefined || !headers.has(name)) return undefined
    return headers.get(name)
  }

  get ack(): Effect.Effect<void, Delivery.SettleError> {
    return this.#command("Ack", ACK)
  }

  nak(delay: Duration.Duration): Effect.Effect<void, Delivery.SettleError> {
    const millis = Math.max(0, Math.round(Duration.toMillis(delay)))
    return this.#command("Nak", millis === 0 ? NAK : encoder.encode(`-NAK ${JSON.stringify({ delay: nanos(millis) })}`))
  }

  get extend(): Effect.Effect<void, Delivery.SettleError> {
    return this.#command("Extend", WPI)
  }

  deadLetter(record: Outcome.DeadLetterRecord): Effect.Effect<void, Delivery.SettleError> {
    const { connection, destination, probe } = this.#settling
    const { msg, streamSequence } = this.#pulled
    const term = this.#command("Term", TERM)
    return DeadLetter.publish(destination, { headers: msg.headers, subject: msg.subject, seq: streamSequence, data: msg.data }, record).pipe(
      Effect.provideService(NatsConnection, connection),
      Effect.mapError((error) => failed(this.#settling, "DeadLetter", destination.subject, error)),
      // Only once the dead letter is stored may the original be terminated.
      Effect.andThen(
        probe === undefined ? term : Effect.andThen(
          probe.hit({
            point: "after-dead-letter",
            consumer: this.#settling.durable ?? "",
            sequence: streamSequence,
            eventId: record.message.eventId
          }),
          term
        )
      )
    )
  }

  /** Runs `f`, what it sends on this delivery's connection leaving in one write (see `Outgoing.together`). */
  together<A>(f: () => A): A {
    return this.#settling.connection.together(f)
  }

  /** Acks and calls `done` with the broker's confirmation or why not; returns a withdrawal. */
  sendAck(done: (error: Delivery.SettleError | undefined) => void): () => void {
    const pulled = this.#pulled
    const settling = this.#settling
    return settling.connection.send(`Ack ${pulled.stream}#${pulled.streamSequence}`, pulled.reply, ACK, settling.settleTimeoutMillis, (result) =>
      done(result instanceof NatsError.NatsError ? failed(settling, "Ack", pulled.reply, result) : undefined))
  }

  #command(name: Delivery.SettleCommand, payload: Uint8Array): Effect.Effect<void, Delivery.SettleError> {
    const pulled = this.#pulled
    const settling = this.#settling
    return Effect.mapBoth(settling.connection.request(`${name} ${pulled.stream}#${pulled.streamSequence}`, pulled.reply, payload, settling.settleTimeoutMillis), {
      onFailure: (error) => failed(settling, name, pulled.reply, error),
      onSuccess: toVoid
    })
  }
}

/**
 * The source's `ackAll`: every ack sent at once and the confirmations awaited together, in one
 * effect (a delivery of another source falls back to its own `ack`). Interrupted, it withdraws
 * the acks still unconfirmed (the broker may still apply them; redelivery covers the rest).
 */
export const ackAll = (deliveries: ReadonlyArray<Delivery.Delivery>): Effect.Effect<ReadonlyArray<Delivery.SettleError | undefined>> => {
  if (!deliveries.every((delivery) => delivery instanceof JetStreamDelivery)) return Delivery.ackEach(deliveries)
  if (deliveries.length === 0) return Effect.succeed([])
  return Effect.callback((resume) => {
    const errors: Array<Delivery.SettleError | undefined> = new Array(deliveries.length).fill(undefined)
    let left = deliveries.length
    const send = () =>
      deliveries.map((delivery, i) =>
        delivery.sendAck((error) => {
          errors[i] = error
          if (--left === 0) resume(Effect.succeed(errors))
        })
      )
    // One write for the batch's acks, not one per few of them. The deliveries of one batch come
    // from one source, so from one connection.
    const withdrawals = (deliveries[0] as JetStreamDelivery).together(send)
    return Effect.sync(() => {
      for (const withdraw of withdrawals) withdraw()
    })
  })
}

/**
 * Sends a lease extension (`+WPI`) for `pulled`, not yet taken, and calls `done` with `undefined`
 * once the server confirmed it within `timeoutMillis`, else with why not; returns a withdrawal
 * (`done` is then not called).
 */
export const sendExtend = (
  connection: Shape,
  pulled: Pulled,
  timeoutMillis: number,
  done: (error: NatsError.NatsError | undefined) => void
): () => void =>
  connection.send(`Extend ${pulled.stream}#${pulled.streamSequence}`, pulled.reply, WPI, timeoutMillis, (result) =>
    done(result instanceof NatsError.NatsError ? result : undefined))

/** Builds the engine's view of `pulled`. */
export const toDelivery = (settling: Settling, pulled: Pulled): Delivery.Delivery => new JetStreamDelivery(settling, pulled)

/**
 * A delivery: one message handed to this consumer by a broker, with the confirmed commands that
 * settle it. This is the engine's whole view of a broker; `@jetworker/nats` implements it for
 * JetStream. Every command either is confirmed by the broker within its bound or fails with a
 * {@link SettleError}; none of them throws, and none of them retries on its own.
 *
 * @since 0.1.0
 */
import { Data, type Duration, Effect } from "effect"
import type { DeadLetterRecord } from "./Outcome.ts"

/** Which command failed. */
export type SettleCommand = "Ack" | "Nak" | "DeadLetter" | "Term" | "Extend"

/** Why a command could not be confirmed. */
export type SettleFailure =
  /** No confirmation arrived within the bound; the broker may or may not have applied it. */
  | "Timeout"
  /** The connection is closed or the broker has no responder (consumer deleted). */
  | "Unavailable"
  /**
   * The broker answered with an error (for a dead-letter publish: a negative PubAck), or refused
   * the command for lack of permission; sending it again cannot help.
   */
  | "Refused"

/** A broker command that was not confirmed. Retrying is up to the caller: redelivery covers it. */
export class SettleError extends Data.TaggedError("SettleError")<{
  readonly command: SettleCommand
  readonly reason: SettleFailure
  readonly message: string
}> {}

/** One message as delivered, and the means to settle it. */
export interface Delivery {
  /** The subject the message was published on. */
  readonly subject: string
  /** The raw payload. */
  readonly payload: Uint8Array
  /** The broker's position of the message (JetStream: stream sequence). */
  readonly sequence: number
  /** How many times the broker has delivered this message, this time included (1-based). */
  readonly deliveryCount: number
  /** When the broker stored the message, in epoch millis (its own clock), if it says. */
  readonly publishedAt?: number | undefined
  /**
   * How many messages the broker still had for the consumer, beyond this one, when it delivered
   * it (JetStream: the pending count of its ack subject), if the source knows. For progress lines.
   */
  readonly pending?: number | undefined
  /**
   * When the source received the message from the broker, on the monotonic time of the `Clock`
   * the source was opened with, in milliseconds (`Clock.monotonicTimeNanos` / 1e6; not a date), for a
   * source that holds messages before the engine takes them (a prefetch buffer). The broker's
   * lease (JetStream: the ack wait) ran from then at the latest, so the engine counts the lease
   * from here, not from when it took the delivery. Absent: the lease starts when it is taken.
   */
  readonly receivedAt?: number | undefined
  /** Reads one header of the message (the first value when repeated). */
  readonly header: (name: string) => string | undefined
  /** Acknowledges; succeeds only once the broker confirms. */
  readonly ack: Effect.Effect<void, SettleError>
  /** Asks for redelivery after `delay`; succeeds once the broker confirms. */
  readonly nak: (delay: Duration.Duration) => Effect.Effect<void, SettleError>
  /**
   * Publishes the message with `record` to the dead-letter channel (confirmed), then terminates it
   * (confirmed). When the publish fails the message is not terminated.
   */
  readonly deadLetter: (record: DeadLetterRecord) => Effect.Effect<void, SettleError>
  /** Extends the lease (JetStream: resets the ack wait); succeeds once the broker confirms. */
  readonly extend: Effect.Effect<void, SettleError>
}

/**
 * Acks each delivery with its own `ack`, side by side, and gives one result per delivery in
 * order: `undefined` once confirmed, else the `SettleError`. The shape of `Intake.ackAll`, for a
 * source without a cheaper way to ack many at once (or for deliveries it does not know).
 */
export const ackEach = (deliveries: ReadonlyArray<Delivery>): Effect.Effect<ReadonlyArray<SettleError | undefined>> =>
  Effect.forEach(
    deliveries,
    (delivery) => Effect.match(delivery.ack, { onFailure: (error): SettleError | undefined => error, onSuccess: () => undefined }),
    { concurrency: "unbounded" }
  )

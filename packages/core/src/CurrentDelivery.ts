/**
 * The delivery a handler is running for, as a service the engine provides to each handler run:
 * the consumer name (the deduplication scope), the event id, the attempt and the message's place
 * in the broker. Handlers read it for logging or to pass ids on; the idempotency store reads it
 * for its key.
 *
 * @since 0.1.0
 */
import { Context } from "effect"

/** What a running handler knows about its delivery. */
export interface Info {
  /** The consumer name; also the deduplication scope. */
  readonly consumer: string
  /** The event's stable id. */
  readonly eventId: string
  /** The attempt, equal to the broker's delivery count (1-based). */
  readonly attempt: number
  /** The retry policy's attempts: when `attempt === attempts`, this is the last one. */
  readonly attempts: number
  /** The subject the message was published on. */
  readonly subject: string
  /** The broker's position of the message. */
  readonly sequence: number
}

/** The delivery the current handler runs for. */
export class CurrentDelivery extends Context.Service<CurrentDelivery, Info>()("@jetworker/core/CurrentDelivery") {}

/**
 * Outcomes: the one final state every delivery ends in, and the pure mapping from an outcome to
 * the broker command that settles it. Outcomes are values to log, count and assert on; they are
 * never errors, and errors are never outcomes. A transient failure's nak is not an outcome of its
 * own: the delivery ends `Released` with reason `Retrying` and the message comes back later.
 *
 * | outcome      | broker command                         | effect committed?      |
 * |--------------|----------------------------------------|------------------------|
 * | Committed    | Ack (confirmed); Leave if ack withheld | yes, exactly once      |
 * | Duplicate    | Ack                                    | no (it already was)    |
 * | Expired      | Ack, or DeadLetter when so configured  | no                     |
 * | Rejected     | DeadLetter (publish, then term)        | no                     |
 * | DeadLettered | DeadLetter (publish, then term)        | no, unless `effectCommitted` |
 * | Released     | Nak(delay), or Leave for redelivery    | no (rolled back), unless `effectCommitted` |
 *
 * A handler that fails after its `IdempotencyStore.commit` returned (a publish or a log step
 * after it) keeps its failure outcome, `Released` or `DeadLettered`, so that what failed after the
 * commit is retried or kept for an operator rather than dropped; `effectCommitted: true` says that
 * the effect itself is applied, and the redelivery (or a replay of the dead letter) finds it
 * committed and ends `Duplicate` without applying it again.
 *
 * @since 0.1.0
 */
import { Data, type DateTime, Duration } from "effect"
import { describe as describeError, type ErrorSummary } from "./ErrorSummary.ts"

/** Where a delivery came from: enough for an operator to find the message again. */
export interface MessageRef {
  /** The consumer (and deduplication scope) that handled the delivery. */
  readonly consumer: string
  /** The subject the message was published on. */
  readonly subject: string
  /** The broker's position of the message (JetStream stream sequence). */
  readonly sequence: number
  /** How many times the broker has delivered the message, this delivery included (1-based). */
  readonly deliveryCount: number
  /** The event's stable id, when the payload could be decoded far enough to read it. */
  readonly eventId: string | undefined
}

/** Why an undecodable or invalid message was rejected. */
export type RejectReason =
  /** Not UTF-8 JSON. */
  | "MalformedPayload"
  /** JSON that fails the consumer's schema. */
  | "SchemaInvalid"
  /** The consumer's `metadata` threw or gave no usable event id for the decoded event. */
  | "MetadataInvalid"

/** Why a message was dead-lettered. */
export type DeadLetterReason =
  /** The handler failed with an error classified as permanent. */
  | "PermanentError"
  /** Transient failures used up every attempt of the retry policy. */
  | "AttemptsExhausted"
  /** Delivered more often than the consumer's `maxDeliveries` without settling (a crash loop). */
  | "DeliveriesExhausted"
  /**
   * A defect outside the handler: code the engine calls around it (a probe, a source's delivery)
   * died. Dead-lettered with the cause so the message is neither lost nor retried blindly.
   */
  | "Defect"

/** Why a message was released (not acked) for the broker to redeliver. */
export type ReleaseReason =
  /** A transient failure with attempts left: naked with the policy's delay. */
  | "Retrying"
  /**
   * The engine cut the handler (a shutdown past its drain); its transaction rolled back. A handler
   * that ends interrupted by itself (it joined a fiber that was interrupted, or called
   * `Effect.interrupt`) failed instead: `Retrying`, or dead-lettered when its attempts are spent,
   * with the error tag `Interrupted`.
   */
  | "Interrupted"
  /**
   * The lease could not be kept; another consumer may own the message now. Also a failure found
   * past the lease: its nak or dead letter is not sent (the broker would apply it to whoever holds
   * the message), the error stays said, and the next delivery decides.
   */
  | "LeaseLost"
  /**
   * The dead-letter publish failed, so the message was not terminated: naked for a redelivery that
   * writes it again, with the retry policy's delay but at least 5 seconds, so that an outage of the
   * dead-letter stream (a failover) does not use up the message's deliveries in seconds.
   */
  | "DeadLetterFailed"

/** Every variant of {@link Outcome}, each with what an operator needs. */
export type Outcome = Data.TaggedEnum<{
  /** The handler's effects are committed; the message was acked (unless `ackWithheld` says why not). */
  Committed: {
    readonly message: MessageRef
    /**
     * Why no ack was sent although the effect committed: the handler was interrupted while its
     * `COMMIT` ran (`Interrupted`: shutdown; `LeaseLost`: another consumer may own the message;
     * `HandlerTimeout`: the run reached `handlerTimeout`, so what the handler had left after the
     * commit did not run). The redelivery settles as `Duplicate`. Absent when the ack was sent.
     */
    readonly ackWithheld?: "Interrupted" | "LeaseLost" | "HandlerTimeout" | undefined
    /** Whether the server confirmed the ack; if not, expect a harmless `Duplicate` later. */
    readonly confirmed: boolean
    /** Wall time from receipt to settlement, in milliseconds. */
    readonly durationMillis: number
  }
  /** An earlier delivery already committed this event; acked with no new effect. */
  Duplicate: {
    readonly message: MessageRef
    readonly confirmed: boolean
    readonly durationMillis: number
  }
  /** The event expired before its effect; no effect, acked or dead-lettered per contract. */
  Expired: {
    readonly message: MessageRef
    readonly expiresAt: DateTime.Utc
    /** Consumer clock time at which expiry was detected. */
    readonly detectedAt: DateTime.Utc
    /** Whether the check that caught it ran before the handler or after a wait inside it. */
    readonly stage: "BeforeHandler" | "AfterWait"
    readonly confirmed: boolean
    readonly durationMillis: number
  }
  /** The payload could not be decoded or failed its schema; dead-lettered, then terminated. */
  Rejected: {
    readonly message: MessageRef
    readonly reason: RejectReason
    readonly error: ErrorSummary
    readonly confirmed: boolean
    readonly durationMillis: number
  }
  /**
   * A permanent error or exhausted attempts; dead-lettered with the cause, then terminated.
   * `confirmed: false` here (and on `Rejected`) means either that the dead letter was stored but
   * the term of the original was not confirmed (a redelivery writes it again, stored once), or
   * that it could not be written on the broker's last delivery: then the message stays in its
   * stream, no longer delivered, counted in `jetworker.stranded`, until `DeadLetter.recover`
   * stores it.
   */
  DeadLettered: {
    readonly message: MessageRef
    readonly reason: DeadLetterReason
    readonly error: ErrorSummary
    /**
     * `true` when the event's effect is committed (by this delivery, or found committed by the
     * idempotency store) and the failure came after it: what is dead-lettered is the rest of the
     * handler's work, and a replay finds the effect committed (`Duplicate`), running only that
     * rest. Absent otherwise (the engine saw no commit). Also in the dead letter's error fields.
     */
    readonly effectCommitted?: boolean | undefined
    readonly confirmed: boolean
    readonly durationMillis: number
  }
  /** Not acked on purpose; the broker redelivers it (after `retryIn`, or after its ack wait). */
  Released: {
    readonly message: MessageRef
    readonly reason: ReleaseReason
    readonly error: ErrorSummary | undefined
    /**
     * `true` when the event's effect is committed (by this delivery, or found committed by the
     * idempotency store) and the failure came after it: nothing was rolled back, and the
     * redelivery finds the effect committed (`Duplicate`) and runs only what followed the commit.
     * Absent otherwise.
     */
    readonly effectCommitted?: boolean | undefined
    /** The nak delay asked of the broker; undefined when the message was left for the ack wait. */
    readonly retryIn: Duration.Duration | undefined
    readonly confirmed: boolean
    readonly durationMillis: number
  }
}>

const constructors = Data.taggedEnum<Outcome>()

/** Builds a `Committed` outcome: the handler's effect committed (acked unless `ackWithheld`). */
export const Committed = constructors.Committed
/** Builds a `Duplicate` outcome: the event was committed before; acked, no second effect. */
export const Duplicate = constructors.Duplicate
/** Builds an `Expired` outcome: past its deadline, no effect; acked or dead-lettered per contract. */
export const Expired = constructors.Expired
/** Builds a `DeadLettered` outcome: stored in the dead-letter stream, then terminated. */
export const DeadLettered = constructors.DeadLettered
/** Builds a `Rejected` outcome: the payload failed its decoding or checks; dead-lettered. */
export const Rejected = constructors.Rejected
/** Builds a `Released` outcome: left for redelivery (naked, or left to the lease). */
export const Released = constructors.Released
/** A guard for one outcome tag: `Outcome.$is("Committed")(outcome)`. */
export const $is = constructors.$is
/** Exhaustive matching on the outcome's tag: a case for every tag, checked by the compiler. */
export const $match = constructors.$match

type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never

/** An outcome before it is settled: every field but `confirmed` and `durationMillis`. */
export type Verdict = DistributiveOmit<Outcome, "confirmed" | "durationMillis">

/** Builds a {@link Verdict}. */
export const verdict = <const T extends Outcome["_tag"]>(
  tag: T,
  fields: Omit<Extract<Outcome, { readonly _tag: T }>, "_tag" | "confirmed" | "durationMillis">
): Extract<Verdict, { readonly _tag: T }> => ({ _tag: tag, ...fields }) as unknown as Extract<Verdict, { readonly _tag: T }>

/** Completes a verdict into an outcome once its command has been sent. */
export const settled = (verdict: Verdict, confirmed: boolean, durationMillis: number): Outcome =>
  ({ ...verdict, confirmed, durationMillis }) as Outcome

/** The tag of an outcome: `"Committed" | "Duplicate" | ...`. */
export type Tag = Outcome["_tag"]

/** Every outcome tag, in table order. */
export const tags: ReadonlyArray<Tag> = ["Committed", "Duplicate", "Expired", "Rejected", "DeadLettered", "Released"]

/** The record a dead-letter channel stores next to the original message. */
export interface DeadLetterRecord {
  readonly outcome: "Rejected" | "DeadLettered" | "Expired"
  readonly reason: RejectReason | DeadLetterReason | "Expired"
  readonly error: ErrorSummary
  readonly message: MessageRef
  readonly failedAt: DateTime.Utc
  /**
   * `true` when the event's effect was committed before the failure (`DeadLettered`'s
   * `effectCommitted`); the record's `error` then carries the field `effectCommitted: true` too,
   * so that it reaches channels that store only the error. Absent otherwise.
   */
  readonly effectCommitted?: boolean | undefined
}

/** A broker command: what to tell the broker about one delivery. */
export type Command = Data.TaggedEnum<{
  /** Acknowledge: the message is done. */
  Ack: {}
  /** Negative acknowledgement: redeliver after `delay`. */
  Nak: { readonly delay: Duration.Duration }
  /** Publish `record` and the original message to the dead-letter channel (confirmed), then terminate it. */
  DeadLetter: { readonly record: DeadLetterRecord }
  /** Say nothing: the broker redelivers once the ack wait runs out. */
  Leave: {}
}>

/** Constructors for {@link Command}. */
export const Command = Data.taggedEnum<Command>()

/**
 * The dead-letter record an outcome carries to the channel, when it goes there. A defect's stack
 * stays in the log line: the record (a header of the dead letter) keeps its bounded shape.
 */
const deadLetterRecord = (
  outcome: Extract<Verdict, { readonly _tag: "Rejected" | "DeadLettered" | "Expired" }>,
  { stack: _stack, ...error }: ErrorSummary,
  reason: DeadLetterRecord["reason"],
  failedAt: DateTime.Utc
): DeadLetterRecord =>
  outcome._tag === "DeadLettered" && outcome.effectCommitted === true
    ? {
      outcome: outcome._tag,
      reason,
      error: { ...error, fields: { ...error.fields, effectCommitted: true } },
      message: outcome.message,
      failedAt,
      effectCommitted: true
    }
    : { outcome: outcome._tag, reason, error, message: outcome.message, failedAt }

/**
 * The broker command that settles `outcome` (or its verdict): the single place where outcomes meet broker
 * commands. `expiredTo` says what the contract wants for expired work; `now` stamps the
 * dead-letter record.
 */
export const toCommand = (
  outcome: Verdict,
  options: { readonly expiredTo: "Ack" | "DeadLetter"; readonly now: DateTime.Utc }
): Command => {
  switch (outcome._tag) {
    case "Committed":
      return outcome.ackWithheld === undefined ? Command.Ack() : Command.Leave()
    case "Duplicate":
      return Command.Ack()
    case "Expired":
      return options.expiredTo === "Ack" ? Command.Ack() : Command.DeadLetter({
        record: deadLetterRecord(
          outcome,
          {
            kind: "Failure",
            tag: "Expired",
            message: "the event expired before its effect",
            fields: { stage: outcome.stage }
          },
          "Expired",
          options.now
        )
      })
    case "Rejected":
      return Command.DeadLetter({ record: deadLetterRecord(outcome, outcome.error, outcome.reason, options.now) })
    case "DeadLettered":
      return Command.DeadLetter({ record: deadLetterRecord(outcome, outcome.error, outcome.reason, options.now) })
    case "Released":
      return outcome.retryIn === undefined ? Command.Leave() : Command.Nak({ delay: outcome.retryIn })
  }
}

/** What `describe` adds to a failure whose effect was committed before it. */
const effectCommittedNote = " (the effect was committed before the failure: a redelivery or replay is a Duplicate)"

/**
 * A one-line description of an outcome for logs and tables: the outcome, the consumer and
 * sequence, the event id, and for a failure its reason and error down to the innermost cause
 * (`ErrorSummary.describe`: PostgreSQL's own message, say, under the driver's "Query failed").
 */
export const describe = (outcome: Outcome): string => {
  const ref = `${outcome.message.consumer}#${outcome.message.sequence}` +
    (outcome.message.eventId === undefined ? "" : ` (${outcome.message.eventId})`)
  switch (outcome._tag) {
    case "Committed":
      return outcome.ackWithheld !== undefined
        ? `Committed ${ref}, ack withheld (${outcome.ackWithheld}): the redelivery will be a Duplicate`
        : `Committed ${ref}${outcome.confirmed ? "" : ", ack unconfirmed"}`
    case "Duplicate":
      return `${outcome._tag} ${ref}${outcome.confirmed ? "" : ", ack unconfirmed"}`
    case "Expired":
      return `Expired ${ref} ${outcome.stage}`
    case "Rejected":
    case "DeadLettered":
      // The tag only once when it says the same as the reason (`MalformedPayload: MalformedPayload: …`);
      // `describeError` begins with `<tag>: `.
      return `${outcome._tag} ${ref}: ${outcome.reason}: ` +
        (outcome.error.tag === outcome.reason
          ? describeError(outcome.error).slice(outcome.error.tag.length + 2)
          : describeError(outcome.error)) +
        (outcome._tag === "DeadLettered" && outcome.effectCommitted === true ? effectCommittedNote : "")
    case "Released":
      return `Released ${ref}: ${outcome.reason}` +
        (outcome.retryIn === undefined ? "" : ` (retry in ${Duration.format(outcome.retryIn)})`) +
        (outcome.error === undefined ? "" : `: ${describeError(outcome.error)}`) +
        (outcome.effectCommitted === true ? effectCommittedNote : "")
  }
}

/**
 * An in-memory broker with JetStream's delivery semantics, for unit tests and the deterministic
 * simulation of the engine: a stream of messages, one pull consumer with a lease (AckWait) per
 * delivery, redelivery when a lease runs out or after a nak's delay, an optional MaxDeliver, and a
 * dead-letter list, and an optional MaxAckPending (1 for a `Sequential` consumer). Opening checks
 * what `JetStreamSource` checks: a MaxDeliver above the planned attempts, and one message at a time
 * for `Sequential` ordering. Acks are matched by sequence, as on NATS 2.9: an old owner's late ack settles
 * the message for everyone. Time is the Effect `Clock`, so under `TestClock` nothing happens
 * until the test moves time.
 *
 * Faults are injected by chance from the caller's random source (seeded, so a run replays):
 * a command lost before the broker applies it, a confirmation lost after it applied it, a failed
 * extension, a failed dead-letter write, and a spontaneous extra delivery of a message in flight.
 * Every delivery and command is appended to `events`, with a global order, for invariants.
 *
 * It deliberately does not model subjects, several consumers or persistence across "restarts":
 * the broker outlives the consumers that a test starts and stops on it.
 *
 * @since 0.1.0
 */
import { Delivery, DurationInput, type Outcome, Source } from "@jetworker/core"
import { Clock, Deferred, Duration, Effect } from "effect"

/** Probabilities of injected faults, each from 0 (never) to 1. */
export interface Faults {
  /** A command (ack, nak, term) is lost on the way: not applied, reported failed. */
  readonly commandLost?: number | undefined
  /** A command is applied but its confirmation is lost: reported failed. */
  readonly replyLost?: number | undefined
  /** A lease extension fails. */
  readonly extendFails?: number | undefined
  /** A dead-letter write is refused (not stored, the message not terminated). */
  readonly deadLetterFails?: number | undefined
  /** When a message is delivered, it is also due again at once (as if its lease were lost). */
  readonly duplicate?: number | undefined
}

/** What the broker did, in order. */
export type BrokerEvent =
  | { readonly _tag: "Delivered"; readonly index: number; readonly at: number; readonly sequence: number; readonly deliveryCount: number }
  | {
    readonly _tag: "Acked" | "Naked" | "Termed" | "Extended" | "DeadLettered"
    readonly index: number
    readonly at: number
    readonly sequence: number
    readonly deliveryCount: number
  }

/** A stored message and where it is. */
export interface Message {
  readonly sequence: number
  readonly payload: Uint8Array
  readonly headers: Readonly<Record<string, string>>
  /** `pending`: waiting to be (re)delivered; `inflight`: leased to a delivery; `done`: acked or terminated; `dropped`: reached MaxDeliver unsettled. */
  status: "pending" | "inflight" | "done" | "dropped"
  deliveries: number
  /** When it may be delivered (pending) or when its lease runs out (inflight), in epoch millis. */
  dueAt: number
  /** When it was stored, in epoch millis. */
  readonly publishedAt: number
}

/** How the broker behaves. */
export interface Options {
  /**
   * The lease of each delivery (AckWait): a finite duration above zero (anything else makes the
   * source fail to open with a `SourceError` naming it).
   */
  readonly lease: Duration.Input
  /**
   * Deliveries after which an unsettled message is dropped (MaxDeliver): a positive integer, or -1
   * (or 0, which JetStream reads as -1) for no limit. Default: no limit. Anything else (NaN, a
   * fraction, below -1) makes the source fail to open with a `SourceError` naming it, as does one
   * that does not exceed the attempts the source is opened with (the last attempt could not
   * dead-letter the message itself).
   */
  readonly maxDeliver?: number | undefined
  /**
   * How many delivered and unsettled messages (in flight, or waiting for their redelivery) the
   * broker lets the consumer hold (MaxAckPending); a new message waits until one is settled. A
   * positive integer, or -1 (or 0) for no limit. Default: 1 when opened for `Sequential` ordering
   * (which needs it), else no limit. Opening for `Sequential` with any other value fails with a
   * `SourceError`, as `JetStreamSource` does.
   */
  readonly maxAckPending?: number | undefined
  /** Injected faults. Default: none. */
  readonly faults?: Faults | undefined
  /** The random source for faults (seed it to replay a run). Default: `Math.random`. */
  readonly random?: (() => number) | undefined
  /** A global counter shared with other recorders (e.g. a store), so events of both are ordered. */
  readonly clock?: {
    /** The next number of the shared order, greater than every one before. */
    readonly next: () => number
  } | undefined
}

/** An in-memory broker. */
export interface InMemoryBroker {
  /** A source over the broker's one consumer, for `Consumer.make`. */
  readonly source: Source.Source
  /** Stores a message; returns its sequence. */
  readonly publish: (payload: Uint8Array | string, headers?: Readonly<Record<string, string>>) => Effect.Effect<number>
  /** Every message, by sequence order. */
  readonly messages: () => ReadonlyArray<Message>
  /** Everything the broker did, in order. */
  readonly events: () => ReadonlyArray<BrokerEvent>
  /** The dead letters stored, in order. */
  readonly deadLetters: () => ReadonlyArray<Outcome.DeadLetterRecord>
  /** Whether every message is settled (acked, terminated or dropped). */
  readonly quiescent: () => boolean
}

const encoder = new TextEncoder()

/**
 * A JetStream limit option (MaxDeliver, MaxAckPending): `undefined` for no limit (absent, -1, or 0,
 * which JetStream reads as -1), the positive integer, or the refusal naming a value the server
 * would not take (NaN, a fraction, below -1, infinite).
 */
const limit = (name: string, value: number | undefined): number | string | undefined => {
  if (value === undefined || value === -1 || value === 0) return undefined
  return Number.isSafeInteger(value) && value > 0
    ? value
    : `${name} must be a positive integer, or -1 for no limit, got ${String(value)}`
}

/**
 * What `JetStreamSource` refuses at open, worded alike: a MaxDeliver that does not exceed the
 * planned attempts, and `Sequential` ordering on a broker that may hand out more than one message
 * at a time.
 */
const contractProblem = (
  open: Source.OpenOptions,
  maxDeliver: number | undefined,
  maxAckPendingOption: number | undefined,
  maxAckPending: number | undefined
): string | undefined => {
  if (maxDeliver !== undefined && maxDeliver <= open.attempts) {
    return `the in-memory broker has maxDeliver ${maxDeliver}; it must exceed the retry policy's ${open.attempts} ` +
      `attempts so that the last attempt can dead-letter the message itself: raise it to at least ${open.attempts + 1}, ` +
      `or lower the attempts`
  }
  // Left out, it defaults to 1 for Sequential; given, it must be 1, as on a JetStream consumer.
  if (open.ordering === "Sequential" && maxAckPendingOption !== undefined && maxAckPending !== 1) {
    return `the in-memory broker has maxAckPending ${maxAckPendingOption}; sequential ordering needs 1, or the broker ` +
      `delivers later messages while an earlier one waits for its redelivery (set maxAckPending 1 or leave it out, ` +
      `or choose Ordering.perKey)`
  }
  return undefined
}

/**
 * Creates a broker. It never throws: a `lease` that is not a finite duration above zero (a string
 * that does not parse, a NaN, which effect would read as 0, zero, which would redeliver at once,
 * negative or infinite), or a `maxDeliver` or `maxAckPending` that is neither a positive integer
 * nor -1 or 0, makes its source fail to open, as a JetStream source with a wrong option does, with
 * a `SourceError` (reason `ContractMismatch`) naming the value.
 */
export const make = (options: Options): InMemoryBroker => {
  const lease = DurationInput.parse(options.lease)
  const leaseProblem = lease !== undefined && Duration.isFinite(lease) && Duration.toMillis(lease) > 0
    ? undefined
    : `lease must be a finite duration above zero such as "30 seconds", got ${DurationInput.show(options.lease)}`
  const maxDeliverOption = limit("maxDeliver", options.maxDeliver)
  const maxAckPendingOption = limit("maxAckPending", options.maxAckPending)
  const optionProblem = [leaseProblem, maxDeliverOption, maxAckPendingOption].find((x): x is string => typeof x === "string")
  // Read only once the source opened, with valid options.
  const maxDeliver = typeof maxDeliverOption === "number" ? maxDeliverOption : undefined
  const maxAckPending = typeof maxAckPendingOption === "number" ? maxAckPendingOption : undefined
  // The limit in force, set when the source is opened (Sequential defaults it to 1).
  let ackPendingLimit: number | undefined
  // Read only by deliveries, which an intake opened with a valid lease hands out.
  const leaseMillis = lease === undefined ? 0 : Duration.toMillis(lease)
  const random = options.random ?? Math.random
  const faults = options.faults ?? {}
  const chance = (p: number | undefined) => p !== undefined && p > 0 && random() < p
  const order = options.clock ?? (() => {
    let n = 0
    return { next: () => ++n }
  })()
  const messages: Array<Message> = []
  const events: Array<BrokerEvent> = []
  const deadLetters: Array<Outcome.DeadLetterRecord> = []
  // Woken when something may have become deliverable sooner than a sleeping `take` expects.
  let wake = Deferred.makeUnsafe<void>()
  const signal = () => {
    Deferred.doneUnsafe(wake, Effect.void)
    wake = Deferred.makeUnsafe<void>()
  }

  const record = (tag: BrokerEvent["_tag"], at: number, message: Message, deliveryCount: number) =>
    events.push({ _tag: tag, index: order.next(), at, sequence: message.sequence, deliveryCount } as BrokerEvent)

  /** The command's fate: lost before, applied but unconfirmed, or confirmed. */
  const settle = (
    name: Delivery.SettleCommand,
    apply: (now: number) => void
  ): Effect.Effect<void, Delivery.SettleError> =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      if (chance(faults.commandLost)) {
        return Effect.fail(new Delivery.SettleError({ command: name, reason: "Timeout", message: `${name} lost (injected)` }))
      }
      apply(now)
      signal()
      return chance(faults.replyLost)
        ? Effect.fail(new Delivery.SettleError({ command: name, reason: "Timeout", message: `${name} confirmation lost (injected)` }))
        : Effect.void
    })

  const deliveryOf = (message: Message, deliveryCount: number): Delivery.Delivery => ({
    subject: "memory",
    payload: message.payload,
    sequence: message.sequence,
    deliveryCount,
    publishedAt: message.publishedAt,
    header: (name) => message.headers[name],
    ack: settle("Ack", (now) => {
      if (message.status === "done" || message.status === "dropped") return
      message.status = "done"
      record("Acked", now, message, deliveryCount)
    }),
    nak: (delay) =>
      settle("Nak", (now) => {
        if (message.status !== "inflight") return
        message.status = "pending"
        message.dueAt = now + Duration.toMillis(delay)
        record("Naked", now, message, deliveryCount)
      }),
    extend: Effect.flatMap(Clock.currentTimeMillis, (now) => {
      if (chance(faults.extendFails)) {
        return Effect.fail(new Delivery.SettleError({ command: "Extend", reason: "Timeout", message: "extension failed (injected)" }))
      }
      // Like +WPI on 2.9: answered by sequence, whoever asks.
      if (message.status === "inflight") {
        message.dueAt = now + leaseMillis
        record("Extended", now, message, deliveryCount)
      }
      return Effect.void
    }),
    deadLetter: (deadLetter) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (chance(faults.deadLetterFails)) {
          return Effect.fail(
            new Delivery.SettleError({ command: "DeadLetter", reason: "Refused", message: "dead-letter write refused (injected)" })
          )
        }
        deadLetters.push(deadLetter)
        record("DeadLettered", now, message, deliveryCount)
        return settle("Term", (at) => {
          if (message.status === "done" || message.status === "dropped") return
          message.status = "done"
          record("Termed", at, message, deliveryCount)
        })
      })
  })

  /** The next deliverable message at `now`, lowest sequence first, or the time one becomes due. */
  const next = (now: number): Message | number => {
    // Delivered and not settled: what counts against MaxAckPending (a naked message too); counted
    // only under a limit.
    let ackPending = 0
    if (ackPendingLimit !== undefined) {
      for (const message of messages) {
        if (message.deliveries > 0 && (message.status === "pending" || message.status === "inflight")) ackPending++
      }
    }
    let soonest = Number.POSITIVE_INFINITY
    for (const message of messages) {
      if (message.status === "done" || message.status === "dropped") continue
      // A new message waits while the consumer holds its MaxAckPending; a settle wakes `take`.
      if (message.deliveries === 0 && ackPendingLimit !== undefined && ackPending >= ackPendingLimit) continue
      if (message.dueAt <= now) {
        if (maxDeliver !== undefined && message.deliveries >= maxDeliver) {
          // Reached MaxDeliver unsettled: the server drops it from the consumer.
          message.status = "dropped"
          ackPending--
          continue
        }
        return message
      }
      soonest = Math.min(soonest, message.dueAt)
    }
    return soonest
  }

  const take: Effect.Effect<Delivery.Delivery> = Effect.suspend(function loop(): Effect.Effect<Delivery.Delivery> {
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const found = next(now)
      if (typeof found === "number") {
        const woken = wake
        const wait = Number.isFinite(found) ? Effect.sleep(Duration.millis(found - now)) : Effect.never
        return Effect.andThen(Effect.raceFirst(wait, Deferred.await(woken)), Effect.suspend(loop))
      }
      found.status = "inflight"
      found.deliveries++
      found.dueAt = chance(faults.duplicate) ? now : now + leaseMillis
      record("Delivered", now, found, found.deliveries)
      return Effect.succeed(deliveryOf(found, found.deliveries))
    })
  })

  const source: Source.Source = {
    name: "memory",
    open: (openOptions) => {
      const problem = optionProblem ?? contractProblem(openOptions, maxDeliver, options.maxAckPending, maxAckPending)
      if (problem !== undefined) return Effect.fail(new Source.SourceError({ reason: "ContractMismatch", message: problem }))
      ackPendingLimit = openOptions.ordering === "Sequential" ? 1 : maxAckPending
      return Effect.succeed({
        lease: Duration.millis(leaseMillis),
        maxDeliver,
        take,
        // A batch's acks, each with its own faults, as the JetStream source's `ackAll` settles them.
        ackAll: Delivery.ackEach,
        close: Effect.void
      })
    }
  }

  return {
    source,
    publish: (payload, headers = {}) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.sync(() => {
          const message: Message = {
            sequence: messages.length + 1,
            payload: typeof payload === "string" ? encoder.encode(payload) : payload,
            headers,
            status: "pending",
            deliveries: 0,
            dueAt: now,
            publishedAt: now
          }
          messages.push(message)
          signal()
          return message.sequence
        })),
    messages: () => messages,
    events: () => events,
    deadLetters: () => deadLetters,
    quiescent: () => messages.every((m) => m.status === "done" || m.status === "dropped")
  }
}

/**
 * A source of deliveries: the engine's abstract broker intake. Opening a source in a scope
 * reserves messages on demand, never more than `prefetch` ahead of what the engine has taken;
 * closing the intake stops reserving and releases whatever it still holds. `@jetworker/nats`
 * implements it for a JetStream pull consumer.
 *
 * @since 0.1.0
 */
import { Data, type Duration, type Effect, type Scope } from "effect"
import type { Delivery, SettleError } from "./Delivery.ts"

/**
 * Why a source failed; the engine stops when its source fails, so the process can restart.
 * `NotAuthorized`: the broker refuses this client something the source needs (a permission),
 * such as settling the messages it delivers; the message names what to grant.
 */
export class SourceError extends Data.TaggedError("SourceError")<{
  readonly reason:
    | "ConnectionClosed"
    | "StreamNotFound"
    | "ConsumerNotFound"
    | "ConsumerDeleted"
    | "ContractMismatch"
    | "NotAuthorized"
    | "Unknown"
  readonly message: string
}> {}

/** An open intake of deliveries. */
export interface Intake {
  /** The broker's lease on each delivery (JetStream: AckWait). */
  readonly lease: Duration.Duration
  /**
   * The delivery after which the broker stops delivering a message (JetStream: MaxDeliver), or
   * `undefined` for no limit. The engine dead-letters before it.
   */
  readonly maxDeliver: number | undefined
  /**
   * The next delivery, waiting for one when none is buffered. Fails with `SourceError` when the
   * source can deliver no more (connection closed for good, consumer deleted) or has been closed.
   * Never call it concurrently with itself.
   */
  readonly take: Effect.Effect<Delivery, SourceError>
  /**
   * Optional: acks several deliveries of this intake at once, each acknowledged and confirmed on
   * its own as its `ack` would be, for less than an effect and a fiber per delivery (a batch's
   * acks). One entry per delivery, in order: `undefined` once confirmed, else why not. Without
   * it the engine runs each delivery's `ack`.
   */
  readonly ackAll?: ((deliveries: ReadonlyArray<Delivery>) => Effect.Effect<ReadonlyArray<SettleError | undefined>>) | undefined
  /**
   * Optional: keeps the leases of the deliveries reserved and not yet taken for `forMillis` from
   * now, extending them before they run out as the engine does for a delivery it runs. The engine
   * asks for it while it takes nothing (paused on a dependency, at most `dependencies.maxHold`), so
   * that a pause longer than the lease does not hand them back to the broker, to be delivered
   * again while this intake still holds them; and calls it with 0 once it takes again, when a
   * source should renew each lease it kept once more, so that what waited through the pause does
   * not start with part of its lease spent. Closing the intake ends it too. A source whose leases
   * do not run while it buffers need not have it. It returns at once and never fails.
   */
  readonly holdBuffered?: ((forMillis: number) => void) | undefined
  /** Stops reserving new messages and releases those still buffered. Idempotent. */
  readonly close: Effect.Effect<void>
}

/**
 * How a source's intake stands, as it reports it to the engine through `OpenOptions.onHealth`:
 * `Stalled` while the broker does not answer it (no message can be taken meanwhile), with a
 * `reason` an operator can read on the readiness probe; `Healthy` once it answers again.
 *
 * @since 0.1.0
 */
export type Health =
  | { readonly _tag: "Healthy" }
  | { readonly _tag: "Stalled"; readonly reason: string }

/** What the engine tells a source when it opens it. */
export interface OpenOptions {
  /** The name of the consumer opening it (`Consumer.make`'s `name`); a source may default to it. */
  readonly consumer: string
  /** Bound on reserved deliveries waiting locally. */
  readonly prefetch: number
  /** Handlers the engine runs at once; with `prefetch`, what the broker should let it hold. */
  readonly concurrency?: number | undefined
  /** Deliveries the retry policy plans; the broker's own limit must be above it. */
  readonly attempts: number
  /** The longest one handler attempt may run; a lease shorter than it rests on extensions. */
  readonly handlerTimeout?: Duration.Duration | undefined
  /**
   * The consumer's ordering model. `Sequential` promises stream order across redeliveries, which
   * holds only when the broker hands out one message at a time (JetStream: `max_ack_pending` 1);
   * a source that cannot ensure that fails to open with `ContractMismatch`.
   */
  readonly ordering: "Unordered" | "PerKey" | "Sequential"
  /**
   * Optional: where the source reports its intake's health, from `open` on until it is closed.
   * The engine shows a `Stalled` consumer down on the readiness probe, with the reason, and a
   * `Healthy` one up again (a stall reported while opening shows once the consumer has started;
   * once it is stopping, reports change nothing). It never fails and returns at once, so a source
   * may run it from a client's callback. A source that cannot tell ignores it.
   *
   * @since 0.1.0
   */
  readonly onHealth?: ((health: Health) => Effect.Effect<void>) | undefined
}

/** A broker-side consumer the engine can open; `R` is what opening it needs (e.g. a connection). */
export interface Source<out R = never> {
  /** A name for logs and outcomes, such as `LEDGER/ledger-applier`. */
  readonly name: string
  /**
   * Opens the intake, after checking the broker-side consumer against `options` (a mismatch is a
   * `SourceError` with reason `ContractMismatch`). Closing the scope closes the intake.
   */
  readonly open: (options: OpenOptions) => Effect.Effect<Intake, SourceError, Scope.Scope | R>
}

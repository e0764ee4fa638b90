/**
 * The single delivery's path: `one` gives a delivery its span and runs `process`, which holds its
 * lease from receipt, prepares it (`judge`), admits it under per-key ordering (its key's lane, its
 * turn, then a slot), runs the handler, and settles the verdict; `judgeSafely` is the safety net
 * that ends it in an outcome whatever dies on the way.
 */
import { Context, Deferred, Duration, Effect, Exit, Option, Result, Tracer } from "effect"
import type { Tagged } from "../../Classification.ts"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import * as Outcome from "../../Outcome.ts"
import * as Telemetry from "../../Telemetry.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import { leaseStart } from "./helpers.ts"
import type { PrepareStage } from "./prepare.ts"
import type { RunStage } from "./runHandler.ts"
import type { SettleStage } from "./settle.ts"
import type { Shared } from "./shared.ts"
import type { Admission, Prepared, Verdict } from "./types.ts"

/** Builds the single delivery's path of one consumer run. */
export const makeSinglePath = <A, E extends Tagged, R>(
  shared: Shared<A, E, R>,
  { messageRef, defect, defectVerdict, prepare, checkNow, readsStores }: PrepareStage<A, E, R>,
  { runHandler }: RunStage<A, E, R>,
  { settle }: SettleStage<A, E, R>
) => {
  const {
    definition,
    keeper,
    slots,
    lanes,
    env,
    now,
    record,
    inFlightGauge,
    redeliveries,
    progress,
    fullSpans,
    sampledByLevel,
    timed,
    noParent
  } = shared
  // Named by the consumer's source, not the subject (see `Telemetry.processSpanName`): one name per consumer.
  const spanName = Telemetry.processSpanName(definition.source.name)

  // Per-key ordering: the delivery joins its key's lane, waits for its turn, then for a slot.
  // Each step is recorded on the admission as it completes, so whatever ends the delivery gives
  // back exactly what it took.
  const admit = (admission: Admission, key: string): Effect.Effect<void> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        yield* restore(lanes!.join(key, (place) => {
          admission.place = place
        }))
        Deferred.doneUnsafe(admission.entered, Effect.void)
        yield* restore(lanes!.turn(admission.place!))
        yield* restore(slots.take)
        admission.slot = true
      })
    )

  // The safety net: a defect anywhere on the per-delivery path outside the handler (a probe, a
  // source) still ends the delivery in an outcome, dead-lettered with the cause.
  const judgeSafely = (
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> => {
    // `judge` builds its effect here, preparing the delivery at once: what that throws is caught too.
    let judged: Effect.Effect<Verdict, never, R>
    try {
      judged = judge(delivery, restore, lease, admission)
    } catch (error) {
      return Effect.succeed(defect(messageRef(delivery), ErrorSummary.fromError(error, "Defect")))
    }
    return Effect.catchCause(judged, defectVerdict(messageRef(delivery)))
  }

  // Called when the delivery's effect runs (inside `process`): a delivery whose checks need no
  // I/O is prepared at once, without the steps of an effect (see "Where the time goes", docs/performance.md).
  const judge = (
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> =>
    !readsStores(delivery)
      ? judgePrepared(checkNow(delivery), delivery, restore, lease, admission)
      : Effect.flatMap(prepare(delivery), (prepared) => judgePrepared(prepared, delivery, restore, lease, admission))

  /** `judge` once the delivery is prepared: the verdict of its checks, or its run. */
  const judgePrepared = (
    prepared: Result.Result<Prepared<A>, Verdict>,
    delivery: Delivery,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    lease: LeaseKeeper.Lease,
    admission: Admission | undefined
  ): Effect.Effect<Verdict, never, R> => {
    if (Result.isFailure(prepared)) return Effect.succeed(prepared.failure)
    if (admission === undefined) return runHandler(prepared.success, delivery, restore, lease)
    // Interruptible: a shutdown past its drain, or a lost lease, ends the wait. Expiry is
    // checked again before the handler runs (stage AfterWait).
    // A turn that comes once the consumer is stopping is not run: the delivery waited (it was
    // not started), so it is released as the intake's buffer is, in its key's order.
    return Effect.flatMap(Effect.exit(restore(admit(admission, prepared.success.orderKey))), (waited) => {
      if (Exit.isSuccess(waited) && !shared.stopping) return runHandler(prepared.success, delivery, restore, lease)
      const message = prepared.success.message
      return Effect.succeed(
        lease.lost
          ? Outcome.verdict("Released", {
            message,
            reason: "LeaseLost",
            error: ErrorSummary.make("LeaseLost", "no lease extension was confirmed while the delivery waited for its key"),
            retryIn: undefined
          })
          : Outcome.verdict("Released", { message, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
      )
    })
  }

  /** Processes `delivery`; called where interruption is masked, `restore` unmasks the waits and the handler. */
  const process = (
    delivery: Delivery,
    admission: Admission | undefined,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<void, never, R> =>
    Effect.withFiber((fiber) => {
      const receivedAt = now()
      record(inFlightGauge, ++shared.running)
      if (delivery.deliveryCount > 1) record(redeliveries, 1)
      if (delivery.pending !== undefined) progress.pending = delivery.pending
      // The lease is watched from receipt, the source's if it held the delivery in a buffer
      // (the broker's lease ran meanwhile), and also while the delivery waits for its key's turn.
      const lease = keeper.register(delivery, leaseStart(delivery, receivedAt), fiber, receivedAt)
      return Effect.flatMap(judgeSafely(delivery, restore, lease, admission), (judged) => {
        keeper.unregister(lease)
        if (admission !== undefined) {
          Deferred.doneUnsafe(admission.entered, Effect.void)
          const place = admission.place
          admission.place = undefined
          if (place !== undefined) {
            // A delivery released without running (the consumer stopping) keeps its key's turn
            // until its release is sent: the next turn runs inline, so released one after another
            // the later ones would settle first, and the broker would redeliver the key in reverse.
            if (judged._tag === "Released" && judged.reason === "Interrupted") {
              return Effect.ensuring(settle(delivery, judged, receivedAt, lease), Effect.sync(() => lanes!.leave(place)))
            }
            // The next delivery of the key may run while this one settles: its effect is decided.
            lanes!.leave(place)
          }
        }
        return settle(delivery, judged, receivedAt, lease)
      })
    })

  // One span per delivery, after the messaging semantic conventions; it continues the trace of
  // the `traceparent` header when the message has one, and is a root span otherwise.
  // Called where interruption is masked (a worker between its take and the delivery's outcome),
  // so nothing can end a taken delivery before it has its outcome.
  const one = (
    delivery: Delivery,
    admission: Admission | undefined,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
  ): Effect.Effect<void, never, R> => {
    const parent = Telemetry.parseTraceparent(delivery.header(Telemetry.traceparentHeader))
    if (!fullSpans) return withLocalSpan(process(delivery, admission, restore), parent)
    return process(delivery, admission, restore).pipe(
      Effect.withSpan(spanName, {
        kind: "consumer",
        ...(parent === undefined ? { root: true } : { parent }),
        attributes: {
          [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
          [Telemetry.Attribute.operationType]: "process",
          [Telemetry.Attribute.operationName]: "process",
          [Telemetry.Attribute.destinationName]: delivery.subject,
          [Telemetry.Attribute.consumerGroup]: definition.name,
          [Telemetry.Attribute.bodySize]: delivery.payload.byteLength,
          [Telemetry.Attribute.attempt]: delivery.deliveryCount,
          [Telemetry.Attribute.streamSequence]: delivery.sequence
        }
        // The call site is always this line: a stack capture per delivery would tell nothing.
      }, { captureStackTrace: false })
    )
  }

  /**
   * A delivery's span when no backend will see it: a native span built here and provided as the
   * parent span, so that its ids still reach the delivery's log lines and continue into the spans
   * and messages the handler creates (and `Effect.currentSpan` finds it), without what only a
   * backend could observe: its attributes, stack frame and the context's span annotations.
   * `Effect.withSpan` cost five times as much (1.85 against 0.35 µs alone; about a tenth of the
   * no-op path's CPU over NATS).
   */
  const withLocalSpan = (
    effect: Effect.Effect<void, never, R>,
    parent: Tracer.AnySpan | undefined
  ): Effect.Effect<void, never, R> => {
    const span = new Tracer.NativeSpan({
      name: spanName,
      parent: parent === undefined ? noParent : Option.some(parent),
      annotations: Context.empty(),
      links: [],
      startTime: timed ? env.clock.currentTimeNanosUnsafe() : 0n,
      kind: "consumer",
      sampled: parent?.sampled === false ? false : sampledByLevel
    })
    return Effect.onExit(
      Effect.provideService(effect, Tracer.ParentSpan, span),
      (exit) => Effect.sync(() => span.end(timed ? env.clock.currentTimeNanosUnsafe() : 0n, exit))
    )
  }

  return { one }
}

/**
 * The consumer engine. Without per-key ordering, `concurrency` long-lived workers each take a
 * delivery and carry it to its outcome before they take the next (the source's `take` in turn);
 * with per-key ordering an intake loop takes deliveries within the limits (room in the key lanes,
 * then a slot) and runs each in a fiber of its own; a batch consumer's loop collects batches, a
 * slot per batch. A delivery, or a batch, goes through named stages:
 *
 * - `prepare`: decode, metadata, ordering key, expiry, the delivery and attempt bounds (`check`,
 *   synchronous, and done at once by `checkNow` unless a store must be read, for a redelivery: its
 *   failed attempts, or whether an expired event was committed before);
 * - admit (per key only): the key's lane, its turn, then a slot;
 * - run (`runHandler`): the handler (`attempt`: expiry before each run; each run a fiber of its
 *   own, cut at `handlerTimeout` by the consumer's one deadline watcher; in-process retries built
 *   only after a transient failure), or the batch handler once for all its elements
 *   (`processBatch`), under the lease keeper;
 * - `conclude`: the verdict from the run's exit and the store's reports;
 * - `settle`: the broker command (never an ack past the lease), then `recordOutcome`: metrics,
 *   span, log, progress and `onOutcome`.
 *
 * The success path is kept cheap on purpose (the performance notes in docs/performance.md): no
 * fiber, slot or timer per delivery beyond the handler run's own fiber, the clock, the metric
 * series and the probe read once per run, the stages `flatMap`s rather than generators, a stage
 * that needs no effect done as plain code where the delivery's effect runs (each step of a fiber
 * is CPU on every message: `bench/commit-in-memory.ts` counts them), and nothing waits for an
 * event-loop turn that it does not need.
 *
 * Each stage is a module of `engine/`, a factory of the stage's closures, built once per consumer
 * run over the run environment they share (`engine/shared.ts`): `prepare.ts`, `runHandler.ts`
 * (its runs bounded by `bounded.ts`), `conclude.ts`, `settle.ts` and `record.ts`; `single.ts` is
 * a single delivery's path through them (with admit), `batch.ts` the batch path; `types.ts` holds
 * the data they pass on. This module composes them (`makeProcess`) and runs the loops (`run`).
 *
 * On interruption it drains. Internal: the public face is `Consumer`.
 */
import { Clock, Deferred, Duration, Effect, Exit, Fiber, FiberSet, LogLevel, Option } from "effect"
import { AttemptStore } from "../AttemptStore.ts"
import type { Tagged } from "../Classification.ts"
import type { Delivery } from "../Delivery.ts"
import { IdempotencyStore } from "../IdempotencyStore.ts"
import * as Lifecycle from "../Lifecycle.ts"
import * as Probe from "../Probe.ts"
import type { Health, SourceError } from "../Source.ts"
import * as Deadlines from "./deadlines.ts"
import { makeBatchPath } from "./engine/batch.ts"
import { makeBounded } from "./engine/bounded.ts"
import { makeConclude } from "./engine/conclude.ts"
import { countsInTableOrder } from "./engine/helpers.ts"
import { makePrepare } from "./engine/prepare.ts"
import { makeRecord } from "./engine/record.ts"
import { makeRunHandler } from "./engine/runHandler.ts"
import { makeSettle } from "./engine/settle.ts"
import { makeShared, type Shared } from "./engine/shared.ts"
import { makeSinglePath } from "./engine/single.ts"
import type { Admission, Definition, RunEnvironment } from "./engine/types.ts"
import * as Lanes from "./lanes.ts"
import * as LeaseKeeper from "./leaseKeeper.ts"
import * as Slots from "./slots.ts"

export { outcomesCounter } from "./engine/shared.ts"
export type { BatchDefinition, Definition, OrderingDefinition, Rejection } from "./engine/types.ts"
export { HandlerTimeout } from "./engine/types.ts"

/** Fails the engine before it starts. */
export const fail = <E>(error: E): Effect.Effect<never, E> => Effect.fail(error)

/** Processes one delivery into exactly one settled outcome. Never fails. */
const makeProcess = <A, E extends Tagged, R>(shared: Shared<A, E, R>) => {
  const { definition, progress } = shared
  // The stages, each built once per run, after the stages it calls.
  const bounded = makeBounded(shared)
  const prepare = makePrepare(shared, bounded)
  const conclude = makeConclude(shared, prepare)
  const runHandler = makeRunHandler(shared, bounded, conclude)
  const settle = makeSettle(shared, makeRecord(shared, bounded), bounded)
  const { one } = makeSinglePath(shared, prepare, runHandler, settle)
  const { many } = makeBatchPath(shared, prepare, bounded, runHandler, conclude, settle)

  // The periodic INFO line: outcomes by tag since the last one, in flight, left on the broker, and
  // released deliveries awaiting their redelivery (the broker counts those delivered, not pending).
  const summary = Effect.suspend(() => {
    const awaiting = shared.awaitingRedelivery(shared.now())
    if (progress.counts.size === 0 && shared.running === 0 && awaiting === 0) return Effect.void
    const counts = countsInTableOrder(progress.counts)
    progress.counts.clear()
    const text = Object.entries(counts).map(([tag, n]) => `${n} ${tag}`).join(", ")
    return Effect.logInfo(
      `consumer ${definition.name}: ${text === "" ? "nothing settled" : text} in the last ` +
        `${Duration.format(definition.progressInterval)}; ${shared.running} in flight` +
        (progress.pending === undefined ? "" : `, ${progress.pending} left on the broker`) +
        (awaiting === 0 ? "" : `, ${awaiting} awaiting redelivery`)
    ).pipe(Effect.annotateLogs({
      event: "consumer.progress",
      counts,
      inFlight: shared.running,
      pending: progress.pending ?? null,
      awaitingRedelivery: awaiting
    }))
  })

  // Served from the start (a dashboard or an `absent()` alert reads no series as "no data"), not
  // from their first change; a counter first served at its first increment is invisible to
  // `increase()`, which takes a new series' first sample as its baseline (the first stranded or
  // dead-lettered message after a start would raise no alert). Counters keyed by a reason or stage
  // have no fixed set: they start at their first use.
  const zeroSeries = () => {
    shared.record(shared.inFlightGauge, 0)
    shared.record(shared.heldGauge, 0)
    shared.record(shared.pausedGauge, 0)
    for (const counter of shared.counters.values()) shared.record(counter, 0)
    shared.record(shared.stranded, 0)
    shared.record(shared.redeliveries, 0)
    shared.record(shared.retries, 0)
  }
  const stop = () => {
    shared.stopping = true
  }

  return { one, many, summary, running: () => shared.running, dependencyGate: shared.dependencyGate, zeroSeries, stop }
}

/** Runs the engine until interrupted (then drains) or until the source fails. */
export const run = <A, E extends Tagged, R>(definition: Definition<A, E, R>): Effect.Effect<never, SourceError, R> =>
  Effect.scoped(
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      // Readiness counts this consumer as starting until its intake is open.
      const component = yield* lifecycle.component(definition.name, "consumer")
      // Set once shutdown has begun: a worker whose take then fails ends quietly.
      let closing = false
      // The source's last report: a stall shows on readiness from when the consumer has started
      // (before, it is "starting") until it stops (then "stopping" stays).
      let stalled: string | undefined
      let started = false
      const onHealth = (health: Health): Effect.Effect<void> =>
        Effect.suspend(() => {
          stalled = health._tag === "Stalled" ? health.reason : undefined
          if (!started || closing) return Effect.void
          return stalled === undefined ? component.up : component.down(stalled)
        })
      const intake = yield* definition.source.open({
        consumer: definition.name,
        prefetch: definition.prefetch,
        concurrency: definition.concurrency,
        attempts: definition.retry.attempts,
        handlerTimeout: definition.handlerTimeout,
        ordering: definition.ordering._tag,
        onHealth
      })
      const slots = Slots.make(definition.concurrency)
      const releaseSlot = Effect.sync(slots.release)
      // Created before the FiberSet, so they outlive its finalizer: it interrupts what outlived the
      // drain and waits for it, and meanwhile leases must still be extended, and a settling's
      // handler run and onOutcome still cut at their bounds.
      const keeper = yield* LeaseKeeper.make(intake.lease)
      const clock = yield* Clock.Clock
      const deadlines = yield* Deadlines.make(definition.handlerTimeout, clock)
      const outcomeDeadlines = definition.onOutcome === undefined ? Deadlines.none : yield* Deadlines.make(definition.onOutcomeTimeout, clock)
      // The workers (or, with per-key ordering and for batches, the deliveries and batches) running.
      const inFlight = yield* FiberSet.make<void, SourceError>()
      // The workers waiting for a delivery (without per-key ordering and batches): shutdown ends their wait.
      const idleWorkers = new Set<Fiber.Fiber<unknown, unknown>>()
      // The dependency gate's `stop` and the deliveries' stop flag, once they exist (the finalizer
      // may run before).
      let stopGate = (): void => undefined
      let stopDeliveries = (): void => undefined
      // Runs before the FiberSet's own finalizer (which interrupts what is left) and before the
      // intake's: stop reserving, then let running handlers finish until the drain share of the
      // worker's shutdown budget ends (unmanaged: for `drainTimeout`).
      yield* Effect.addFinalizer(() =>
        Effect.gen(function*() {
          closing = true
          // A held delivery is released at once, uncounted, instead of holding the drain; so is a
          // delivery whose key's turn comes from now on (it is not run).
          stopGate()
          stopDeliveries()
          yield* component.down("stopping")
          yield* lifecycle.stage("intake", definition.name, "drain", intake.close)
          // Workers waiting for a delivery stop waiting (a source need not fail a waiting take).
          for (const fiber of idleWorkers) fiber.interruptUnsafe()
          const drained = lifecycle.deadline("drain") === undefined
            ? Option.isSome(yield* FiberSet.awaitEmpty(inFlight).pipe(Effect.timeoutOption(definition.drainTimeout)))
            : (yield* lifecycle.stage("drain", definition.name, "drain", FiberSet.awaitEmpty(inFlight))) === "completed"
          if (!drained) {
            yield* Effect.logWarning(`drain budget spent; interrupting ${processor.running()} handlers`)
          }
        })
      )
      const attemptStore = Option.getOrUndefined(yield* Effect.serviceOption(AttemptStore))
      // Asked only whether an expired event's redelivery was committed before (see `prepare.ts`).
      const idempotencyStore = Option.getOrUndefined(yield* Effect.serviceOption(IdempotencyStore))
      // The crash-loop guard: the consumer's own bound, and below the broker's MaxDeliver so the
      // engine still gets the delivery on which it dead-letters the message itself.
      const deliveryBound = intake.maxDeliver === undefined
        ? definition.maxDeliveries
        : Math.min(definition.maxDeliveries, intake.maxDeliver - 1)
      const ordering = definition.ordering
      const lanes = ordering._tag === "PerKey" ? Lanes.make(ordering.limits) : undefined
      const probe = yield* Probe.Probe
      const env: RunEnvironment = {
        context: yield* Effect.context<never>(),
        clock,
        lifecycle,
        probe: probe === Probe.noop ? undefined : probe,
        debugLogs: yield* LogLevel.isEnabled("Debug")
      }
      const processor = makeProcess(makeShared(
        definition,
        intake.lease,
        keeper,
        attemptStore,
        idempotencyStore,
        deliveryBound,
        intake.maxDeliver,
        slots,
        lanes,
        deadlines,
        outcomeDeadlines,
        intake,
        env
      ))
      stopGate = processor.dependencyGate.stop
      stopDeliveries = processor.stop
      const runFiber = FiberSet.run(inFlight)
      // `take`, once no dependency the consumer pauses on is down (see `dependencyGate.ts`).
      const gate = processor.dependencyGate
      const gated = <X, Y>(take: Effect.Effect<X, Y>): Effect.Effect<X, Y> =>
        gate.active ? Effect.suspend(() => (gate.open() ? take : Effect.andThen(gate.awaitOpen, take))) : take
      if (Duration.toMillis(definition.progressInterval) > 0) {
        yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(definition.progressInterval), processor.summary)))
      }
      // The broker's MaxDeliver at or below `maxDeliveries` lowers the crash-loop guard: a release
      // that spends no attempt (a shutdown, a lost lease, a buffered message handed back) still
      // spends a delivery, so the message can be dead-lettered before its attempts are run.
      if (deliveryBound < definition.maxDeliveries) {
        yield* Effect.logWarning(
          `consumer ${definition.name}: the broker consumer's max_deliver ${intake.maxDeliver} lowers the crash-loop guard ` +
            `to ${deliveryBound} deliveries, below maxDeliveries ${definition.maxDeliveries}: a release that spends no ` +
            `attempt (a shutdown, a lost lease) still spends a delivery, so a message can be dead-lettered ` +
            `DeliveriesExhausted before its ${definition.retry.attempts} attempts are run; raise max_deliver to at least ` +
            `${definition.maxDeliveries + 1}, or lower maxDeliveries`
        ).pipe(Effect.annotateLogs({
          event: "consumer.delivery_guard_lowered",
          consumer: definition.name,
          maxDeliver: intake.maxDeliver ?? null,
          maxDeliveries: definition.maxDeliveries
        }))
      }
      // A name in `pauseOn` that no dependency has would silently never pause the consumer.
      const pauseOn = definition.pauseOn
      if (lifecycle.managed && pauseOn !== undefined && pauseOn !== "all") {
        const known = lifecycle.dependencyNames()
        const unknown = pauseOn.filter((name) => !known.includes(name))
        if (unknown.length > 0) {
          yield* Effect.logWarning(
            `consumer ${definition.name}: dependencies.pauseOn names ${unknown.map((name) => JSON.stringify(name)).join(", ")}, ` +
              `which ${unknown.length === 1 ? "is" : "are"} no dependency of this process (its dependencies: ` +
              `${known.length === 0 ? "none" : known.join(", ")}); the consumer does not pause on ${unknown.length === 1 ? "it" : "them"}`
          ).pipe(Effect.annotateLogs({ event: "consumer.pause_on_unknown", consumer: definition.name, unknown: unknown.join(",") }))
        }
      }
      started = true
      processor.zeroSeries()
      yield* (stalled === undefined ? component.up : component.down(stalled))
      yield* Effect.logInfo(
        `consumer ${definition.name} started on ${definition.source.name} ` +
          `(concurrency ${definition.concurrency}, prefetch ${definition.prefetch}, lease ${Duration.format(intake.lease)}, ` +
          `ordering ${
            ordering._tag === "PerKey"
              ? `per key: at most ${ordering.limits.maxHeld} held, ${ordering.limits.maxKeys} keys, ${ordering.limits.maxPerLane} per key`
              : ordering._tag.toLowerCase()
          })`
      )
      const batch = definition.batch
      if (batch !== undefined) {
        // A slot per batch, then up to `maxSize` deliveries, waiting at most `maxWait` after the
        // first for the rest. Deliveries collected when the intake stops (shutdown, a failed
        // source) still run as a batch, in the drain.
        const maxWaitMillis = Duration.toMillis(batch.maxWait)
        // The rest of a batch: one bound for all of it (a take cut by the bound takes nothing, so
        // what was collected is all there is); what is buffered is taken without waiting.
        const collectRest = (into: Array<Delivery>): Effect.Effect<void, SourceError> =>
          Effect.suspend(() =>
            into.length >= batch.maxSize
              ? Effect.void
              : Effect.flatMap(intake.take, (delivery) => {
                into.push(delivery)
                return collectRest(into)
              })
          )
        const collect = (into: Array<Delivery>): Effect.Effect<void, SourceError> =>
          Effect.flatMap(intake.take, (first) => {
            into.push(first)
            return into.length >= batch.maxSize || maxWaitMillis <= 0
              ? Effect.void
              : Effect.asVoid(Effect.timeoutOption(collectRest(into), batch.maxWait))
          })
        return yield* Effect.forever(
          Effect.uninterruptibleMask((restore) =>
            Effect.gen(function*() {
              yield* restore(slots.take)
              const deliveries: Array<Delivery> = []
              const collected = yield* Effect.exit(restore(gated(collect(deliveries))))
              if (deliveries.length > 0) {
                yield* runFiber(processor.many(deliveries, batch).pipe(Effect.ensuring(releaseSlot)))
              } else {
                slots.release()
              }
              if (Exit.isFailure(collected)) return yield* collected
            })
          ),
          // No yield per delivery: the loop waits on the intake and slots anyway, and a yield
          // is an event-loop turn per message.
          { disableYield: true }
        )
      }
      if (lanes === undefined) {
        // `concurrency` long-lived workers, each taking its next delivery once the last one has its
        // outcome: no fiber, slot or scheduler turn per message. The source's `take` must not run
        // concurrently with itself, so the workers take in turn (`turn`, a slot of one, handed on
        // inline). A worker's take that fails ends it: quietly once shutdown has begun, else with
        // the source's error, which ends the run. A worker interrupted outside shutdown (the lease
        // keeper cut its delivery) ends after settling it, and a new one takes its place.
        const turn = Slots.make(1)
        const takeInTurn = gated(Effect.andThen(turn.take, Effect.ensuring(intake.take, Effect.sync(turn.release))))
        // A worker is idle while it waits to take (shutdown interrupts it there); once shutdown has
        // begun it takes nothing more, whatever the source would still give.
        const worker: Effect.Effect<void, SourceError, R> = Effect.withFiber((self) =>
          Effect.uninterruptibleMask((restore) => {
            const loop: Effect.Effect<void, SourceError, R> = Effect.suspend(() => {
              if (closing) return Effect.void
              idleWorkers.add(self)
              return Effect.flatMap(restore(takeInTurn), (delivery) => {
                idleWorkers.delete(self)
                return Effect.andThen(processor.one(delivery, undefined, restore), loop)
              })
            })
            return loop
          }).pipe(
            Effect.ensuring(Effect.sync(() => idleWorkers.delete(self))),
            Effect.catch((error) => (closing ? Effect.void : Effect.fail(error))),
            Effect.onInterrupt(() => Effect.suspend(() => (closing ? Effect.void : Effect.asVoid(start()))))
          )
        )
        const start = (): Effect.Effect<Fiber.Fiber<void, SourceError>, never, R> => runFiber(worker)
        for (let i = 0; i < definition.concurrency; i++) yield* start()
        return yield* FiberSet.join(inFlight).pipe(Effect.andThen(Effect.never))
      }
      // Per key: room among the held deliveries first, then a delivery, whose fiber finds its
      // key's lane (waiting there, not here, for its turn and a slot). The next take waits until
      // it has found its place: a full lane stops the intake instead of buffering past the limits.
      return yield* Effect.forever(
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(function*() {
            yield* restore(lanes.awaitRoom)
            const delivery = yield* restore(gated(intake.take))
            const admission: Admission = { place: undefined, slot: false, entered: Deferred.makeUnsafe<void>() }
            lanes.hold()
            yield* runFiber(Effect.uninterruptibleMask((unmask) => processor.one(delivery, admission, unmask)).pipe(
              Effect.ensuring(Effect.suspend(() => {
                Deferred.doneUnsafe(admission.entered, Effect.void)
                if (admission.place !== undefined) lanes.leave(admission.place)
                lanes.unhold()
                if (admission.slot) slots.release()
                return Effect.void
              }))
            ))
            yield* restore(Deferred.await(admission.entered))
          })
        ),
        // No yield per delivery: the loop waits on the intake and slots anyway, and a yield
        // is an event-loop turn per message.
        { disableYield: true }
      )
    })
  ).pipe(Effect.annotateLogs({ consumer: definition.name }))

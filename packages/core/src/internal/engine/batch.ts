/**
 * The batch path (BE-JOB-007): `many` gives a batch its span and runs `processBatch`, which
 * prepares each element on its own, runs the batch handler once for the rest, judges each element
 * from its own result and settles them together (`settleAll`); when the run fails as a whole,
 * `runEachAlone` runs each element alone and settles each as soon as its verdict is reached.
 * `batchDefect` is its safety net.
 */
import { Cause, Duration, Effect, Exit, Fiber, Result, type Tracer } from "effect"
import type { Tagged } from "../../Classification.ts"
import { CurrentBatch } from "../../CurrentDelivery.ts"
import type { Delivery } from "../../Delivery.ts"
import * as ErrorSummary from "../../ErrorSummary.ts"
import { isAlreadyCommitted } from "../../IdempotencyStore.ts"
import * as Outcome from "../../Outcome.ts"
import * as Telemetry from "../../Telemetry.ts"
import type * as LeaseKeeper from "../leaseKeeper.ts"
import type { BoundedRuns } from "./bounded.ts"
import type { ConcludeStage } from "./conclude.ts"
import { leaseDeadlineOf, leaseStart, noDeadline, pastLease, reporter, takenPastLease } from "./helpers.ts"
import type { PrepareStage } from "./prepare.ts"
import type { Holding, RunStage } from "./runHandler.ts"
import type { SettleStage } from "./settle.ts"
import type { Shared } from "./shared.ts"
import { type BatchDefinition, noReportsYet, type Prepared, type PreparedBatch, type Reports, type Runnable, type Verdict } from "./types.ts"

const noop = (): void => undefined

/** Builds the batch path of one consumer run. */
export const makeBatchPath = <A, E extends Tagged, R>(
  shared: Shared<A, E, R>,
  { messageRef, defect, defectVerdict, prepare, checkNow, readsStores }: PrepareStage<A, E, R>,
  { supervised }: BoundedRuns<A, E, R>,
  { attempt, attemptInSteps, heldAfter, gated }: RunStage<A, E, R>,
  { conclude }: ConcludeStage<A, E, R>,
  { settleAll }: SettleStage<A, E, R>
) => {
  const { definition, keeper, env, now, record, probe, hit, leaseMillis, handlerDuration, inFlightGauge, redeliveries, progress } =
    shared

  // The batch's safety net, as `judgeSafely` is the single delivery's: a defect while judging an
  // element still ends it in an outcome.
  const concludeSafely = (
    prepared: Prepared<A>,
    delivery: Delivery,
    exit: Exit.Exit<unknown, unknown>,
    reports: Reports,
    lease: LeaseKeeper.Lease
  ): Effect.Effect<Verdict, never, R> =>
    conclude(prepared, delivery, exit, reports, lease).pipe(Effect.catchCause(defectVerdict(prepared.message)))

  /**
   * A batch (BE-JOB-007): every delivery is prepared on its own (a rejected or expired one ends
   * there), the rest go to the batch handler in one run, and each element is judged from its own
   * result and the store's reports, and settled with its own command. A run that fails as a whole
   * (its transaction, a defect, an interruption of its own, a result that is not one `Result` per
   * element) is not charged to every element: each element then runs alone, as a batch of one
   * with the consumer's in-process retries, and is settled as soon as its verdict is reached
   * (`runEachAlone`), so a poison element fails by itself and the others commit without waiting
   * for it. Whatever dies on the way, every element still ends in an outcome and its lease is
   * given back.
   */
  const processBatch = (deliveries: ReadonlyArray<Delivery>, batch: BatchDefinition<A, E, R>): Effect.Effect<void, never, R> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.withFiber((fiber) => {
        const receivedAt = now()
        shared.running += deliveries.length
        const last = deliveries[deliveries.length - 1]!
        if (last.pending !== undefined) progress.pending = last.pending
        record(inFlightGauge, shared.running)
        const leases = deliveries.map((delivery) => keeper.register(delivery, leaseStart(delivery, receivedAt), fiber, receivedAt))
        const unregister = () => {
          for (const lease of leases) keeper.unregister(lease)
        }
        // What the safety net keeps: the verdicts reached before a defect, and the elements' refs.
        let prepared: PreparedBatch<A> | undefined
        const settling = settlingOf(deliveries, receivedAt, leases)
        return prepareBatch(deliveries).pipe(
          Effect.flatMap((batchPrepared) => {
            prepared = batchPrepared
            const { verdicts } = batchPrepared
            const runnable = withoutTakenPastLease(batchPrepared, leases)
            return runnable.length === 0
              ? Effect.succeed(verdicts)
              : runBatch(deliveries, batch, leases, verdicts, runnable, restore, settling.now)
          }),
          Effect.catchCause((cause) => Effect.sync(() => batchDefect(deliveries, prepared, cause))),
          Effect.flatMap((verdicts) => {
            unregister()
            return settling.rest(verdicts as ReadonlyArray<Verdict>)
          }),
          // Never left to the keeper: it would extend these leases for as long as the process lives.
          Effect.ensuring(Effect.sync(unregister))
        )
      })
    )

  /**
   * How a batch's elements are settled, each with its own command (individual acks, naks and dead
   * letters). An element run alone is settled as soon as its verdict is reached (`now`), in a fiber
   * of its own, so that neither its command nor its `onOutcome` holds back the next element's run;
   * its lease is given back to the keeper first (nothing of it is left to run, and a lease the
   * keeper found lost would interrupt the batch's other elements). The others are settled together
   * once the batch is judged (`rest`, sent at once), which then waits for the early ones: the
   * batch ends once every element has its outcome.
   */
  const settlingOf = (deliveries: ReadonlyArray<Delivery>, receivedAt: number, leases: ReadonlyArray<LeaseKeeper.Lease>) => {
    // By index, the fiber settling each element settled early; none on a batch that did not fail as a whole.
    const early = new Map<number, Fiber.Fiber<void>>()
    const now = (index: number, verdict: Verdict): Effect.Effect<void> =>
      Effect.suspend(() => {
        keeper.unregister(leases[index]!)
        const settling = settleAll([deliveries[index]!], [verdict], receivedAt, [leases[index]!])
        return Effect.map(Effect.forkChild(Effect.uninterruptible(settling), { startImmediately: true }), (fiber) => {
          early.set(index, fiber)
        })
      })
    const rest = (verdicts: ReadonlyArray<Verdict>): Effect.Effect<void> => {
      if (early.size === 0) return settleAll(deliveries, verdicts, receivedAt, leases)
      const left = deliveries.flatMap((_, index) => (early.has(index) ? [] : [index]))
      return Effect.andThen(
        settleAll(left.map((i) => deliveries[i]!), left.map((i) => verdicts[i]!), receivedAt, left.map((i) => leases[i]!)),
        Effect.asVoid(Fiber.joinAll(early.values()))
      )
    }
    return { now, rest }
  }

  /**
   * The runnable elements of a batch but those taken past their lease (they waited in the source's
   * buffer): each of those gets its verdict, released without running, as a single delivery
   * (`takenPastLease`). Most batches have none, and keep their array.
   */
  const withoutTakenPastLease = (batch: PreparedBatch<A>, leases: ReadonlyArray<LeaseKeeper.Lease>): ReadonlyArray<Runnable<A>> => {
    if (!(leaseMillis > 0)) return batch.runnable
    const at = now()
    const stale = (element: Runnable<A>) => pastLease(leases[element.index]!.hold, leaseMillis, at)
    if (!batch.runnable.some(stale)) return batch.runnable
    for (const element of batch.runnable) {
      if (stale(element)) batch.verdicts[element.index] = takenPastLease(element.prepared.message)
    }
    return batch.runnable.filter((element) => !stale(element))
  }

  /**
   * The batch's safety net, as `judgeSafely` is the single delivery's: after a defect anywhere on
   * the batch's path (user code the engine reads, such as a result array, or the engine's own), an
   * element keeps the verdict it had reached, and every other one is dead-lettered with the cause
   * (`Defect`), so none is left without an outcome.
   */
  const batchDefect = (
    deliveries: ReadonlyArray<Delivery>,
    prepared: PreparedBatch<A> | undefined,
    cause: Cause.Cause<unknown>
  ): ReadonlyArray<Verdict> => {
    const messages = deliveries.map(messageRef)
    for (const { index, prepared: element } of prepared?.runnable ?? []) messages[index] = element.message
    // Masked throughout, so an interruption here is not expected; if one is, it releases.
    const interrupted = Cause.hasInterruptsOnly(cause)
    const error = ErrorSummary.fromCause(cause)
    return deliveries.map((_, index) =>
      prepared?.verdicts[index] ??
        (interrupted
          ? Outcome.verdict("Released", { message: messages[index]!, reason: "Interrupted", error: undefined, retryIn: Duration.zero })
          : defect(messages[index]!, error))
    )
  }

  /**
   * A batch's elements, prepared each on its own: a verdict for those that end here, the rest
   * runnable. Without I/O (no store to read, `readsStores`) as most elements are; a
   * defect in the checks dead-letters the element alone.
   */
  const prepareBatch = (deliveries: ReadonlyArray<Delivery>): Effect.Effect<PreparedBatch<A>, never, R> => {
    const verdicts: Array<Verdict | undefined> = []
    const runnable: Array<Runnable<A>> = []
    const add = (index: number, prepared: Result.Result<Prepared<A>, Verdict>) => {
      if (Result.isFailure(prepared)) verdicts.push(prepared.failure)
      else {
        verdicts.push(undefined)
        runnable.push({ index, prepared: prepared.success, reports: noReportsYet() })
      }
    }
    for (const delivery of deliveries) {
      if (delivery.deliveryCount > 1) record(redeliveries, 1)
    }
    if (!deliveries.some(readsStores)) {
      for (const [index, delivery] of deliveries.entries()) add(index, checkNow(delivery))
      return Effect.succeed({ verdicts, runnable })
    }
    return Effect.as(
      Effect.forEach(deliveries, (delivery, index) =>
        readsStores(delivery)
          ? prepare(delivery).pipe(
            Effect.catchCause((cause) => Effect.map(defectVerdict(messageRef(delivery))(cause), Result.fail)),
            Effect.map((prepared) => add(index, prepared))
          )
          : Effect.sync(() => add(index, checkNow(delivery))), { discard: true }),
      { verdicts, runnable }
    )
  }

  /**
   * What is wrong with a batch handler's value, or `undefined` when it is one `Result` per element.
   * Every entry is read (a hole is not skipped, as `every` would): the judging reads them all.
   */
  const resultsProblem = (value: unknown, elements: number): string | undefined => {
    if (!Array.isArray(value)) return `the batch handler gave ${value === null ? "null" : typeof value}, not an array of results`
    if (value.length !== elements) return `the batch handler gave ${value.length} results for ${elements} elements`
    for (let i = 0; i < elements; i++) {
      const entry: unknown = value[i]
      if (!Result.isResult(entry)) {
        return `the batch handler's result ${i} (of ${elements}) is ${entry === undefined ? "missing" : entry === null ? "null" : typeof entry}, not a Result`
      }
    }
    return undefined
  }

  /**
   * The verdict on a batch element whose result succeeded: as `succeeded` for a single delivery,
   * the store's reports decide with the value (a handler may map `commitBatch`'s values away). But
   * a store reports per event id, to every element of that id: of two copies of one event in the
   * batch (the store ran its effect once), only the first that succeeded is the commit, the other a
   * duplicate; `committedIds` holds the ids already judged committed in this batch.
   */
  const elementSucceeded = (prepared: Prepared<A>, value: unknown, reports: Reports, committedIds: Set<string>): Verdict => {
    const id = prepared.key.id
    const duplicate = isAlreadyCommitted(value) || (reports.committed ? committedIds.has(id) : reports.alreadyCommitted)
    if (duplicate) return Outcome.verdict("Duplicate", { message: prepared.message })
    if (reports.committed) committedIds.add(id)
    return Outcome.verdict("Committed", { message: prepared.message })
  }

  /** The batch handler's run over the runnable elements, then each element's verdict. */
  const runBatch = (
    deliveries: ReadonlyArray<Delivery>,
    batch: BatchDefinition<A, E, R>,
    leases: ReadonlyArray<LeaseKeeper.Lease>,
    verdicts: Array<Verdict | undefined>,
    runnable: ReadonlyArray<Runnable<A>>,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    settleNow: (index: number, verdict: Verdict) => Effect.Effect<void>
  ): Effect.Effect<Array<Verdict | undefined>, never, R> => {
    // A probe's defect must not cost the batch its outcomes.
    const hits = probe === undefined ? Effect.void : Effect.forEach(runnable, ({ index, prepared }) =>
      hit({ point: "received", consumer: definition.name, sequence: deliveries[index]!.sequence, eventId: prepared.metadata.id })
        .pipe(Effect.catchCause((cause) => Effect.logWarning("probe failed", ErrorSummary.fromCause(cause)))), { discard: true })
    const elements = runnable.map(({ index, prepared, reports }) => ({
      eventId: prepared.metadata.id,
      subject: deliveries[index]!.subject,
      sequence: deliveries[index]!.sequence,
      deliveryCount: deliveries[index]!.deliveryCount,
      // For `Expiry.ensure` and `Lease.ensure` in the batch handler, as a delivery's are.
      expiresAt: prepared.metadata.expiresAt === undefined ? undefined : prepared.metadata.expiresAt.epochMilliseconds + definition.skewMillis,
      leaseDeadline: leaseMillis > 0 ? leaseDeadlineOf(leases[index]!.hold, leaseMillis, env.clock) : noDeadline,
      report: reporter(reports, now)
    }))
    const run = Effect.suspend(() => {
      const startedAt = now()
      return Effect.map(
        Effect.exit(restore(
          supervised(Effect.suspend(() => batch.handle(runnable.map((r) => r.prepared.event))), batchTimeoutMessage)
            .pipe(Effect.provideService(CurrentBatch, { consumer: definition.name, elements }))
        )),
        (exit) => {
          record(handlerDuration, now() - startedAt)
          return exit
        }
      )
    })
    // Each of `elements` judged in turn, its verdict put in its place.
    const judgeEach = <T extends { readonly index: number }>(
      elements: ReadonlyArray<T>,
      judge: (element: T) => Effect.Effect<Verdict, never, R>
    ) =>
      Effect.as(Effect.forEach(elements, (element) => Effect.map(judge(element), (verdict) => {
        verdicts[element.index] = verdict
      }), { discard: true }), verdicts)
    // One result per element: each element's own decides. A success is judged at once, without an
    // effect of its own, unless a probe watches its commit.
    const judgeResults = (results: ReadonlyArray<Result.Result<unknown, unknown>>) => {
      const failed: Array<{ readonly index: number; readonly prepared: Prepared<A>; readonly failure: unknown }> = []
      const watched: Array<{ readonly index: number; readonly prepared: Prepared<A>; readonly verdict: Verdict }> = []
      const committedIds = new Set<string>()
      for (const [i, { index, prepared, reports }] of runnable.entries()) {
        const result = results[i]!
        if (Result.isFailure(result)) {
          failed.push({ index, prepared, failure: result.failure })
          continue
        }
        const verdict = elementSucceeded(prepared, result.success, reports, committedIds)
        verdicts[index] = verdict
        if (probe !== undefined && verdict._tag === "Committed") watched.push({ index, prepared, verdict })
      }
      const afterCommits = watched.length === 0 ? Effect.succeed(verdicts) : judgeEach(watched, ({ index, prepared, verdict }) =>
        hit({ point: "after-commit", consumer: definition.name, sequence: deliveries[index]!.sequence, eventId: prepared.metadata.id })
          .pipe(Effect.as(verdict), Effect.catchCause(defectVerdict(prepared.message))))
      if (failed.length === 0) return afterCommits
      // A failed element is judged by its own failure (its effect was undone, whatever the store
      // reported for another element of its id).
      return Effect.andThen(afterCommits, judgeEach(failed, ({ index, prepared, failure }) =>
        concludeSafely(prepared, deliveries[index]!, Exit.fail(failure), noReportsYet(), leases[index]!)))
    }
    // Whether the engine itself cut the run: a lease the keeper found lost, or this fiber
    // interrupted (a shutdown past its drain). An interruption still pending on this masked fiber
    // fails a `restore` of nothing at once. Any other interruption is the run's own (an element's
    // effect that interrupted itself, say): a failure of the whole run, not a cut.
    const cutByEngine: Effect.Effect<boolean> = leases.some((lease) => lease.lost)
      ? Effect.succeed(true)
      : Effect.map(Effect.exit(restore(Effect.void)), Exit.isFailure)
    // The elements held one after another share one hold: `maxHold` bounds them together.
    const holding: Holding = { until: undefined }
    // The verdict on an element from the exit of its run alone; paused on dependencies, an element
    // that failed is held as a single delivery is, and runs alone again once they are back.
    const judgeAlone = ({ index, prepared, reports }: Runnable<A>, exit: Exit.Exit<unknown, unknown>): Effect.Effect<Verdict, never, R> => {
      const delivery = deliveries[index]!
      return gated && Exit.isFailure(exit)
        ? Effect.flatMap(
          heldAfter(exit.cause, runAlone(prepared, delivery, reports, leases[index]!), delivery, prepared, reports, leases[index]!, restore, noop, holding),
          (held) => concludeSafely(prepared, delivery, held, reports, leases[index]!)
        )
        : concludeSafely(prepared, delivery, exit, reports, leases[index]!)
    }
    // An element run alone: its verdict in its place, and settled at once.
    const settleAlone = (index: number, verdict: Verdict) => {
      verdicts[index] = verdict
      return settleNow(index, verdict)
    }
    const failedAsWhole = (exit: Exit.Exit<unknown, unknown>, problem: string | undefined) => {
      if (runnable.length === 1) {
        const failed = Exit.isFailure(exit) ? exit : Exit.die(new Error(problem))
        // Paused on dependencies, a batch of one is held as a single delivery is, and runs alone.
        return judgeEach(runnable, (element) => judgeAlone(element, failed))
      }
      return Effect.andThen(
        Effect.logWarning(
          `batch of ${runnable.length} failed as a whole; running its elements one by one`,
          Exit.isFailure(exit) ? ErrorSummary.fromCause(exit.cause) : ErrorSummary.make("BatchResultInvalid", problem ?? "")
        ),
        Effect.as(runEachAlone(deliveries, leases, runnable, restore, judgeAlone, settleAlone), verdicts)
      )
    }
    return Effect.andThen(hits, Effect.flatMap(run, (exit): Effect.Effect<Array<Verdict | undefined>, never, R> => {
      if (Exit.isSuccess(exit)) {
        const problem = resultsProblem(exit.value, runnable.length)
        return problem === undefined ? judgeResults(exit.value) : failedAsWhole(exit, problem)
      }
      if (!Cause.hasInterrupts(exit.cause)) return failedAsWhole(exit, undefined)
      return Effect.flatMap(cutByEngine, (cut) =>
        cut
          // Cut (shutdown past its drain, a lease lost): released, or committed with the ack withheld.
          ? judgeEach(runnable, ({ index, prepared, reports }) => concludeSafely(prepared, deliveries[index]!, exit, reports, leases[index]!))
          : failedAsWhole(exit, undefined))
    }))
  }

  /**
   * The elements of a batch that failed as a whole, each run alone (BE-JOB-007): first every
   * element's first run, in order, then the in-process retries of those whose first run failed
   * for a while, in order; each is judged (`judge`) and settled (`settle`) as soon as its runs
   * end. So an element waits for a poison element's first run at most (cut at `handlerTimeout`),
   * never for its retries or its hold, and its ack is not held back by them.
   */
  const runEachAlone = (
    deliveries: ReadonlyArray<Delivery>,
    leases: ReadonlyArray<LeaseKeeper.Lease>,
    runnable: ReadonlyArray<Runnable<A>>,
    restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
    judge: (element: Runnable<A>, exit: Exit.Exit<unknown, unknown>) => Effect.Effect<Verdict, never, R>,
    settle: (index: number, verdict: Verdict) => Effect.Effect<void>
  ): Effect.Effect<void, never, R> =>
    Effect.suspend(() => {
      const finish = (element: Runnable<A>, exit: Exit.Exit<unknown, unknown>) =>
        Effect.flatMap(judge(element, exit), (verdict) => settle(element.index, verdict))
      const retriesDue: Array<{ readonly element: Runnable<A>; readonly retries: Effect.Effect<unknown, unknown, R> }> = []
      const firstRuns = Effect.forEach(runnable, ({ index, prepared }) => {
        const delivery = deliveries[index]!
        // Its own reports: the batch's run (rolled back) reported nothing that holds.
        const element: Runnable<A> = { index, prepared, reports: noReportsYet() }
        const steps = attemptInSteps(prepared.event, delivery, prepared.metadata, prepared.failedBefore + 1, element.reports, leases[index]!)
        return Effect.flatMap(Effect.exit(restore(steps.first)), (exit) => {
          const retries = steps.retriesAfter(exit)
          if (retries === undefined) return finish(element, exit)
          retriesDue.push({ element, retries })
          return Effect.void
        })
      }, { discard: true })
      const thenRetries = Effect.suspend(() =>
        Effect.forEach(retriesDue, ({ element, retries }) => Effect.flatMap(Effect.exit(restore(retries)), (exit) => finish(element, exit)), { discard: true })
      )
      return Effect.andThen(firstRuns, thenRetries)
    })

  /** An element run alone, as a batch of one with the consumer's in-process retries. */
  const runAlone = (prepared: Prepared<A>, delivery: Delivery, reports: Reports, lease: LeaseKeeper.Lease) =>
    attempt(prepared.event, delivery, prepared.metadata, prepared.failedBefore + 1, reports, lease)

  const batchTimeoutMessage = `batch handler ran longer than ${Duration.format(definition.handlerTimeout)}`

  // One span per batch; its elements' outcomes are in their own log lines and metrics. A batch
  // has many publishers: a root span linked to each element's publish span (`traceparent`), as
  // OpenTelemetry's messaging conventions have it, so each producer's trace leads to the batch.
  const linksOf = (deliveries: ReadonlyArray<Delivery>): Array<Tracer.SpanLink> => {
    const links: Array<Tracer.SpanLink> = []
    for (const delivery of deliveries) {
      const publish = Telemetry.parseTraceparent(delivery.header(Telemetry.traceparentHeader))
      if (publish !== undefined) links.push({ span: publish, attributes: {} })
    }
    return links
  }
  // Named by the consumer's source, not a subject (see `Telemetry.processSpanName`).
  const spanName = Telemetry.processSpanName(definition.source.name)
  const many = (deliveries: ReadonlyArray<Delivery>, batch: BatchDefinition<A, E, R>): Effect.Effect<void, never, R> =>
    processBatch(deliveries, batch).pipe(
      Effect.withSpan(spanName, {
        kind: "consumer",
        root: true,
        links: linksOf(deliveries),
        attributes: {
          [Telemetry.Attribute.messagingSystem]: Telemetry.messagingSystem,
          [Telemetry.Attribute.operationType]: "process",
          [Telemetry.Attribute.operationName]: "process",
          [Telemetry.Attribute.destinationName]: deliveries[0]!.subject,
          [Telemetry.Attribute.consumerGroup]: definition.name,
          [Telemetry.Attribute.batchSize]: deliveries.length
        }
      }, { captureStackTrace: false })
    )

  return { many }
}

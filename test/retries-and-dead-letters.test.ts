/**
 * BE-JOB-003 (bounded retries and a terminal outcome) against a real NATS JetStream and a real
 * PostgreSQL: transient errors are retried (in process, then by nak with a growing delay counted
 * by the server's delivery count) and then commit once; permanent errors, exhausted attempts and
 * invalid messages end in an observable terminal outcome, stored in the dead-letter stream before
 * the original is terminated; and a dead letter can be replayed, once, after its cause is fixed.
 *
 * Every wait is bounded and waits on an observable event (an outcome, an advisory); the server's
 * consumer state is read to prove that nothing more will be delivered.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, IdempotencyStore, type Outcome, Retry, type Source } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection, NatsError, Publisher } from "@jetworker/nats"
import { OutcomeLog, TestStream } from "@jetworker/testing"
import type { ConsumerInfo } from "@nats-io/jetstream"
import { headers } from "@nats-io/transport-node"
import { Clock, Data, Duration, Effect, Metric } from "effect"
import { applyTransfer } from "../examples/ledger/src/Ledger.ts"
import { metadata, TransferEvent } from "../examples/ledger/src/TransferEvent.ts"
import { openAccount, totalBalance, transfer, transferCount, uniquePrefix } from "./support/ledger.ts"
import { LedgerTestLive } from "./support/services.ts"

/** A failure the test injects into the handler; classified transient. */
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string; readonly run: number }> {}

/** One run of the handler: which event, on which delivery (the server's count), and when. */
interface Run {
  readonly eventId: string
  readonly attempt: number
  readonly startedAt: number
  readonly endedAt: number
  readonly failed: boolean
}

interface WorkerOptions {
  readonly attempts: number
  readonly inProcessRetries?: number
  readonly base?: Duration.Input
  readonly concurrency?: number
  readonly name?: string
  readonly deadLetter?: DeadLetter.Options
  /** Whether the `run`-th run (1-based, per event) of the handler for `eventId` fails with `Flaky`. */
  readonly fail?: (eventId: string, run: number) => boolean
  /** Whether the `run`-th run for `eventId` throws (a defect, not a typed error). */
  readonly die?: (eventId: string, run: number) => boolean
}

const encoder = new TextEncoder()
const wait = "20 seconds"

/**
 * Runs a ledger consumer (the reference handler: an idempotent commit of `applyTransfer`, with
 * `Flaky` failures injected in front of it) on `stream` until the test's scope closes.
 */
const startWorker = (stream: TestStream.TestStream, log: OutcomeLog.OutcomeLog, options: WorkerOptions) =>
  Effect.gen(function*() {
    const runs: Array<Run> = []
    const perEvent = new Map<string, number>()
    const consumer = Consumer.make({
      name: options.name ?? stream.consumer,
      source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, deadLetter: options.deadLetter }),
      schema: TransferEvent,
      metadata,
      handle: (event) =>
        Effect.gen(function*() {
          const current = yield* CurrentDelivery.CurrentDelivery
          const startedAt = yield* Clock.currentTimeMillis
          const run = (perEvent.get(event.id) ?? 0) + 1
          perEvent.set(event.id, run)
          const failed = options.fail?.(event.id, run) ?? false
          const record = (endedAt: number) => runs.push({ eventId: event.id, attempt: current.attempt, startedAt, endedAt, failed })
          if (failed) {
            record(yield* Clock.currentTimeMillis)
            return yield* new Flaky({ message: `injected failure of run ${run}`, run })
          }
          if (options.die?.(event.id, run) === true) {
            record(yield* Clock.currentTimeMillis)
            throw new RangeError(`injected defect in run ${run}`)
          }
          return yield* IdempotencyStore.commit(event.id, applyTransfer(event)).pipe(
            Effect.ensuring(Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => record(now))))
          )
        }),
      classify: {
        Flaky: "transient",
        UnknownAccount: "permanent",
        InsufficientFunds: "permanent",
        CurrencyMismatch: "permanent",
        SqlError: "isRetryable",
        IdempotencyError: "isRetryable"
      },
      retry: Retry.exponential({
        attempts: options.attempts,
        base: options.base ?? "50 millis",
        cap: "5 seconds",
        inProcessRetries: options.inProcessRetries ?? 0
      }),
      concurrency: options.concurrency ?? 4,
      drainTimeout: "2 seconds",
      onOutcome: log.record
    })
    yield* Effect.forkScoped(Consumer.run(consumer))
    return {
      /** The handler's runs for `eventId`, in order. */
      runsOf: (eventId: string) => runs.filter((run) => run.eventId === eventId)
    }
  })

const ofEvent = (outcomes: ReadonlyArray<Outcome.Outcome>, eventId: string) =>
  outcomes.filter((outcome) => outcome.message.eventId === eventId)

const ofSequence = (outcomes: ReadonlyArray<Outcome.Outcome>, sequence: number) =>
  outcomes.filter((outcome) => outcome.message.sequence === sequence)

const millis = (duration: Duration.Duration | undefined): number =>
  duration === undefined ? Number.NaN : Duration.toMillis(duration)

/** The server's view: nothing of the stream up to `sequence` is pending, awaiting an ack or due for redelivery. */
const assertSettledOnServer = (info: ConsumerInfo, sequence: number) => {
  assert.isAtLeast(info.ack_floor.stream_seq, sequence, "the ack floor is past the message")
  assert.strictEqual(info.num_ack_pending, 0, "nothing awaits an ack")
  assert.strictEqual(info.num_redelivered, 0, "nothing is being redelivered")
  assert.strictEqual(info.num_pending, 0, "nothing is left to deliver")
}

/** The `jetworker.outcomes` counter of consumer `name`, by outcome tag. */
const outcomeCounts = (name: string) =>
  Effect.map(Metric.snapshot, (snapshots) => {
    const counts: Record<string, number> = {}
    for (const snapshot of snapshots) {
      if (snapshot.id !== "jetworker.outcomes" || snapshot.attributes?.consumer !== name) continue
      const outcome = snapshot.attributes.outcome ?? "?"
      const count = Number((snapshot.state as { readonly count: number | bigint }).count)
      // Every outcome's series is served from the start, at 0: only those that happened count here.
      if (count > 0) counts[outcome] = (counts[outcome] ?? 0) + count
    }
    return counts
  })

/** The `jetworker.stranded` counter of consumer `name`. */
const strandedCount = (name: string) =>
  Effect.map(Metric.snapshot, (snapshots) =>
    snapshots
      .filter((s) => s.id === "jetworker.stranded" && s.attributes?.consumer === name)
      .reduce((sum, s) => sum + Number((s.state as { readonly count: number | bigint }).count), 0))

describe("retries and dead letters", () => {
  layer(LedgerTestLive, { excludeTestServices: true })((it) => {
    it.effect(
      "BE-JOB-003: transient error: naked with a growing jittered delay, redelivered with a growing server delivery count, then committed once",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("transient")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const worker = yield* startWorker(stream, log, {
            attempts: 5,
            inProcessRetries: 0,
            fail: (eventId, run) => eventId === id && run <= 2
          })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 30_00), id)
          const outcomes = yield* log.waitUntil(
            (all) => all.some((o) => o._tag === "Committed"),
            wait,
            "the transfer to commit"
          )

          const trail = ofEvent(outcomes, id)
          assert.deepStrictEqual(trail.map((o) => o._tag), ["Released", "Released", "Committed"])
          assert.deepStrictEqual(trail.map((o) => o.message.deliveryCount), [1, 2, 3], "the server's delivery count grows")
          for (const o of trail) {
            assert.strictEqual(o.message.sequence, seq)
            assert.isTrue(o.confirmed, `${o._tag} on delivery ${o.message.deliveryCount} confirmed by the server`)
          }
          const released = trail.filter((o) => o._tag === "Released")
          for (const [i, o] of released.entries()) {
            assert.strictEqual(o.reason, "Retrying")
            assert.strictEqual(o.error?.tag, "Flaky")
            // base 50 ms doubling, jittered by 0.8..1.2: attempt 1 -> 40..60 ms, attempt 2 -> 80..120 ms.
            const expected = 50 * 2 ** i
            assert.isAtLeast(millis(o.retryIn), expected * 0.8)
            assert.isAtMost(millis(o.retryIn), expected * 1.2)
          }

          // The handler ran once per delivery, and each redelivery came no sooner than the nak asked.
          const runs = worker.runsOf(id)
          assert.deepStrictEqual(runs.map((r) => [r.attempt, r.failed]), [[1, true], [2, true], [3, false]])
          for (let i = 1; i < runs.length; i++) {
            const gap = runs[i]!.startedAt - runs[i - 1]!.endedAt
            assert.isAtLeast(gap, millis(released[i - 1]!.retryIn) - 5, `redelivery ${i + 1} honoured the nak delay`)
          }

          // One effect.
          assert.strictEqual(yield* transferCount(id), 1)
          assert.strictEqual(yield* totalBalance([`${p}.a`]), 70_00n)
          assert.strictEqual(yield* totalBalance([`${p}.b`]), 30_00n)
          assertSettledOnServer(yield* stream.info, seq)
        })
    )

    it.effect(
      "BE-JOB-003: transient error: in-process retries run the handler again inside one delivery before it is naked",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("inprocess")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          // One in-process retry per delivery: runs 1 and 2 (delivery 1) fail, so delivery 1 is
          // naked; run 3 (delivery 2) fails and its in-process retry, run 4, commits.
          const worker = yield* startWorker(stream, log, {
            attempts: 5,
            inProcessRetries: 1,
            fail: (eventId, run) => eventId === id && run <= 3
          })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 10_00), id)
          const outcomes = yield* log.waitUntil((all) => all.some((o) => o._tag === "Committed"), wait)

          const trail = ofEvent(outcomes, id)
          assert.deepStrictEqual(trail.map((o) => [o._tag, o.message.deliveryCount]), [["Released", 1], ["Committed", 2]])
          const released = trail[0]!
          assert.isTrue(released._tag === "Released" && released.reason === "Retrying")
          const runs = worker.runsOf(id)
          assert.deepStrictEqual(
            runs.map((r) => [r.attempt, r.failed]),
            [[1, true], [1, true], [2, true], [2, false]],
            "4 handler runs for 2 deliveries"
          )
          // The in-process retry waited the policy's first (jittered) delay, not a redelivery.
          assert.isAtLeast(runs[1]!.startedAt - runs[0]!.endedAt, 40 - 5)
          assert.strictEqual(yield* transferCount(id), 1)
          assert.strictEqual(yield* totalBalance([`${p}.b`]), 10_00n)
          assertSettledOnServer(yield* stream.info, seq)
        })
    )

    it.effect(
      "BE-JOB-003: permanent error: an unknown account or insufficient funds is dead-lettered on the first delivery, with no effect and no redelivery",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("permanent")
          yield* openAccount(`${p}.a`, "EUR", 10_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const worker = yield* startWorker(stream, log, { attempts: 5, inProcessRetries: 2 })
          const unknown = `${p}.unknown`
          const poor = `${p}.poor`
          const seq1 = yield* stream.publish("eur", transfer(unknown, `${p}.a`, `${p}.nobody`, 1_00), unknown)
          const seq2 = yield* stream.publish("eur", transfer(poor, `${p}.a`, `${p}.b`, 50_00), poor)
          const outcomes = yield* log.waitUntil((all) => all.length >= 2, wait, "two outcomes")

          assert.strictEqual(outcomes.length, 2)
          for (const [id, seq, tag] of [[unknown, seq1, "UnknownAccount"], [poor, seq2, "InsufficientFunds"]] as const) {
            const trail = ofEvent(outcomes, id)
            assert.strictEqual(trail.length, 1)
            const o = trail[0]!
            assert.strictEqual(o._tag, "DeadLettered")
            if (o._tag !== "DeadLettered") continue
            assert.strictEqual(o.reason, "PermanentError")
            assert.strictEqual(o.error.tag, tag)
            assert.strictEqual(o.message.deliveryCount, 1)
            assert.strictEqual(o.message.sequence, seq)
            assert.isTrue(o.confirmed)
            // No retry of any kind: one run, despite two in-process retries being allowed.
            assert.deepStrictEqual(worker.runsOf(id).map((r) => r.attempt), [1])
            assert.strictEqual(yield* transferCount(id), 0)
          }
          assert.strictEqual(yield* totalBalance([`${p}.a`, `${p}.b`]), 10_00n)
          // Terminated on the server: the ack floor is past both, nothing pending or redelivered.
          assertSettledOnServer(yield* stream.info, seq2)
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          // By source sequence: the two run at once, and either may be dead-lettered first.
          assert.deepStrictEqual(
            dead.map((d) => [d.sourceSequence, d.outcome, d.reason, d.deliveries]).sort((x, y) => Number(x[0]) - Number(y[0])),
            [[seq1, "DeadLettered", "PermanentError", 1], [seq2, "DeadLettered", "PermanentError", 1]]
          )
        })
    )

    it.effect(
      "BE-JOB-003: attempts limit: an always-transient failure is naked on deliveries 1 and 2 and dead-lettered on delivery 3 as AttemptsExhausted, then never delivered again",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 5 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("attempts")
          const name = `attempts-${p.slice(-8)}`
          const id = `${p}.t1`
          const next = `${p}.t2`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const worker = yield* startWorker(stream, log, {
            name,
            attempts: 3,
            inProcessRetries: 0,
            fail: (eventId) => eventId === id
          })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 5_00), id)
          const outcomes = yield* log.waitUntil(
            (all) => all.some((o) => o._tag === "DeadLettered"),
            wait,
            "the transfer to be dead-lettered"
          )

          const trail = ofEvent(outcomes, id)
          assert.deepStrictEqual(
            trail.map((o) => [o._tag, o.message.deliveryCount, "reason" in o ? o.reason : undefined]),
            [["Released", 1, "Retrying"], ["Released", 2, "Retrying"], ["DeadLettered", 3, "AttemptsExhausted"]]
          )
          const last = trail[2]!
          assert.isTrue(last._tag === "DeadLettered" && last.confirmed && last.error.tag === "Flaky", "the last cause is kept")
          assert.deepStrictEqual(worker.runsOf(id).map((r) => r.attempt), [1, 2, 3])

          // The server will not deliver it again: terminated, ack floor past it, nothing pending.
          assertSettledOnServer(yield* stream.info, seq)
          // And the worker carries on: the next message commits, and nothing more came for the first.
          const seq2 = yield* stream.publish("eur", transfer(next, `${p}.a`, `${p}.b`, 1_00), next)
          const after = yield* log.waitUntil((all) => ofEvent(all, next).length > 0, wait, "the next transfer")
          assert.deepStrictEqual(ofEvent(after, next).map((o) => o._tag), ["Committed"])
          assert.strictEqual(ofEvent(after, id).length, 3)
          assert.deepStrictEqual(worker.runsOf(id).map((r) => r.attempt), [1, 2, 3])
          assertSettledOnServer(yield* stream.info, seq2)

          // Never counted as success: no effect, no Committed count for it; the dead letter is kept.
          assert.strictEqual(yield* transferCount(id), 0)
          assert.deepStrictEqual(yield* outcomeCounts(name), { Released: 2, DeadLettered: 1, Committed: 1 })
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.deepStrictEqual(
            dead.map((d) => [d.sourceSequence, d.eventId, d.outcome, d.reason, d.deliveries]),
            [[seq, id, "DeadLettered", "AttemptsExhausted", 3]]
          )
        })
    )

    it.effect(
      "BE-JOB-003: attempts limit: a handler that throws (a defect) is retried like a transient error and dead-lettered once the attempts are spent",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 5 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("defect")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const worker = yield* startWorker(stream, log, { attempts: 2, inProcessRetries: 1, die: (eventId) => eventId === id })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 5_00), id)
          const outcomes = yield* log.waitUntil((all) => all.some((o) => o._tag === "DeadLettered"), wait)
          assert.deepStrictEqual(
            outcomes.map((o) => [o._tag, o.message.deliveryCount, "reason" in o ? o.reason : undefined]),
            [["Released", 1, "Retrying"], ["DeadLettered", 2, "AttemptsExhausted"]]
          )
          const last = outcomes[1]!
          assert.isTrue(last._tag === "DeadLettered" && last.error.kind === "Defect" && last.error.tag === "RangeError")
          // Defects are not retried in process (only typed transient errors are): one run per delivery.
          assert.deepStrictEqual(worker.runsOf(id).map((r) => r.attempt), [1, 2])
          assert.strictEqual(yield* transferCount(id), 0)
          assertSettledOnServer(yield* stream.info, seq)
        })
    )

    it.effect(
      "BE-JOB-003: attempts limit: a message already delivered more times than the attempts (crash loop) is dead-lettered without running the handler",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 6 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("crashloop")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 5_00), id)

          // Earlier "processes" took it and never settled it (nak stands in for a crash: the same
          // redelivery, without waiting out the ack wait): delivered 3 times = the attempts.
          const { jetstream } = yield* NatsConnection.NatsConnection
          const raw = yield* Effect.promise(() => jetstream.consumers.get(stream.stream, stream.consumer))
          for (let delivery = 1; delivery <= 3; delivery++) {
            const msg = yield* Effect.promise(() => raw.next({ expires: 5_000 }))
            assert.isNotNull(msg, `delivery ${delivery} arrived`)
            assert.strictEqual(msg!.seq, seq)
            assert.strictEqual(msg!.info.deliveryCount, delivery)
            msg!.nak()
          }

          const worker = yield* startWorker(stream, log, { attempts: 3 })
          const outcomes = yield* log.waitUntil((all) => all.length > 0, wait, "an outcome")
          assert.strictEqual(outcomes.length, 1)
          const o = outcomes[0]!
          assert.strictEqual(o._tag, "DeadLettered")
          if (o._tag === "DeadLettered") {
            assert.strictEqual(o.reason, "AttemptsExhausted")
            assert.strictEqual(o.message.deliveryCount, 4)
            assert.strictEqual(o.message.eventId, id)
            assert.strictEqual(o.error.tag, "AttemptsExhausted")
            assert.isTrue(o.confirmed)
          }
          assert.strictEqual(worker.runsOf(id).length, 0, "the handler never ran")
          assert.strictEqual(yield* transferCount(id), 0)
          assertSettledOnServer(yield* stream.info, seq)
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.deepStrictEqual(dead.map((d) => [d.sourceSequence, d.reason, d.deliveries]), [[seq, "AttemptsExhausted", 4]])
        })
    )

    it.effect(
      "BE-JOB-003: attempts limit: a consumer whose max_deliver does not exceed the attempts fails at start with ContractMismatch",
      () =>
        Effect.gen(function*() {
          const log = yield* OutcomeLog.make
          const tooFew = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 3 })
          const failing = Consumer.make({
            name: tooFew.consumer,
            source: JetStreamSource.make({ stream: tooFew.stream, consumer: tooFew.consumer }),
            schema: TransferEvent,
            metadata,
            handle: () => Effect.void,
            classify: {},
            retry: Retry.exponential({ attempts: 3, base: "50 millis" }),
            onOutcome: log.record
          })
          const error: Source.SourceError | Consumer.InvalidOptions = yield* Consumer.run(failing).pipe(
            Effect.timeout("10 seconds"),
            Effect.flip,
            Effect.flatMap((e) => e._tag === "TimeoutError" ? Effect.die(e) : Effect.succeed(e))
          )
          assert.strictEqual(error._tag, "SourceError")
          if (error._tag === "SourceError") {
            assert.strictEqual(error.reason, "ContractMismatch")
            assert.include(error.message, "max_deliver 3")
            // And what to do about it.
            assert.include(error.message, "raise it to at least 4")
          }
          // Nothing was delivered or dead-lettered.
          const info = yield* tooFew.info
          assert.strictEqual(info.delivered.stream_seq, 0)

          // One more than the attempts is enough: it starts and works.
          const enough = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 4 })
          const p = uniquePrefix("contract")
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          yield* startWorker(enough, log, { attempts: 3 })
          yield* enough.publish("eur", transfer(`${p}.t1`, `${p}.a`, `${p}.b`, 1_00), `${p}.t1`)
          const outcomes = yield* log.waitUntil((all) => all.length > 0, wait)
          assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Committed"])
        })
    )

    it.effect(
      "BE-JOB-003: dead-letter write: the dead letter keeps the original bytes, subject and headers, with delivery count, outcome, reason and the cause as JSON, stored before the original is terminated",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const { connection, manager } = yield* NatsConnection.NatsConnection
          const p = uniquePrefix("dlwrite")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 10_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          // Watch the server's "terminated" advisories for this consumer.
          const advisories = connection.subscribe(
            `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.${stream.stream}.${stream.consumer}`,
            { max: 1 }
          )
          yield* Effect.addFinalizer(() => Effect.sync(() => advisories.unsubscribe()))
          yield* Effect.promise(() => connection.flush())
          yield* startWorker(stream, log, { attempts: 5 })

          // Not the canonical JSON: extra field, non-ASCII text, indentation and a trailing newline.
          const event = JSON.parse(transfer(id, `${p}.a`, `${p}.b`, 50_00)) as Record<string, unknown>
          const bytes = encoder.encode(JSON.stringify({ ...event, note: "naïve — ✓ 💶" }, null, 2) + "\n")
          const subject = stream.subject("eur.priority")
          const ack = yield* Publisher.publish(subject, bytes, {
            msgId: id,
            stream: stream.stream,
            headers: [["X-Trace", "trace-123"], ["X-Multi", "one"], ["X-Multi", "two"]]
          })
          const outcomes = yield* log.waitUntil((all) => all.length > 0, wait)
          const o = outcomes[0]!
          assert.strictEqual(o._tag, "DeadLettered")
          assert.isTrue(o.confirmed)

          // The advisory that the original was terminated, and the dead letter stored before it.
          const terminated = yield* Effect.promise(async () => {
            for await (const msg of advisories) return msg.json<{ stream_seq: number; timestamp: string }>()
            return undefined
          }).pipe(Effect.timeout(wait))
          assert.strictEqual(terminated?.stream_seq, ack.seq)
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.strictEqual(dead.length, 1)
          const stored = yield* Effect.promise(() =>
            manager.streams.getMessage(stream.deadLetterStream, { seq: dead[0]!.sequence })
          )
          assert.isNotNull(stored)
          assert.isAtMost(stored!.time.getTime(), Date.parse(terminated!.timestamp), "stored before the term")

          // Byte for byte, on the dead-letter subject, with every header the operator needs.
          assert.deepStrictEqual(Array.from(stored!.data), Array.from(bytes))
          assert.strictEqual(stored!.subject, `jetworker.dlq.${stream.stream}.${stream.consumer}`)
          const h = stored!.header
          assert.strictEqual(h.get(DeadLetter.Header.subject), subject)
          assert.strictEqual(h.get(DeadLetter.Header.stream), stream.stream)
          assert.strictEqual(h.get(DeadLetter.Header.consumer), stream.consumer)
          assert.strictEqual(h.get(DeadLetter.Header.sequence), String(ack.seq))
          assert.strictEqual(h.get(DeadLetter.Header.deliveries), "1")
          assert.strictEqual(h.get(DeadLetter.Header.outcome), "DeadLettered")
          assert.strictEqual(h.get(DeadLetter.Header.reason), "PermanentError")
          assert.strictEqual(h.get(DeadLetter.Header.eventId), id)
          assert.isFalse(Number.isNaN(Date.parse(h.get(DeadLetter.Header.failedAt))))
          assert.strictEqual(h.get("X-Trace"), "trace-123")
          assert.deepStrictEqual(h.values("X-Multi"), ["one", "two"])
          // The original id is kept, renamed, so it cannot deduplicate in the dead-letter stream.
          assert.strictEqual(h.get("Jetworker-Original-Nats_Msg-Id"), id)
          assert.isFalse([...h.keys()].some((k) => k !== "Nats-Msg-Id" && k.includes("Nats-Msg-Id")), "no second Nats-Msg-Id to confuse the server")
          assert.notStrictEqual(h.get("Nats-Msg-Id"), id)
          assert.deepStrictEqual(JSON.parse(h.get(DeadLetter.Header.error)), {
            kind: "Failure",
            tag: "InsufficientFunds",
            message: `account ${p}.a has 1000, needs 5000`,
            fields: { account: `${p}.a`, balance: "1000", amount: 5000 }
          })

          // DeadLetter.read gives the same, with the original headers restored to their names.
          const read = yield* DeadLetter.read(stream.deadLetterStream, dead[0]!.sequence)
          assert.deepStrictEqual(Array.from(read.payload), Array.from(bytes))
          assert.strictEqual(read.subject, subject)
          assert.strictEqual(read.sourceStream, stream.stream)
          assert.strictEqual(read.sourceSequence, ack.seq)
          assert.strictEqual(read.deliveries, 1)
          assert.strictEqual(read.eventId, id)
          assert.deepStrictEqual(read.error, JSON.parse(h.get(DeadLetter.Header.error)))
          // Exactly the headers the original was stored with (the publisher's own `Nats-*` included).
          const original = yield* Effect.promise(() => manager.streams.getMessage(stream.stream, { seq: ack.seq }))
          const originalHeaders = [...original!.header.keys()].flatMap((key) =>
            original!.header.values(key).map((value) => [key, value] as const)
          )
          assert.includeDeepMembers(originalHeaders, [["Nats-Msg-Id", id], ["X-Trace", "trace-123"], ["X-Multi", "one"]])
          assert.sameDeepMembers([...read.originalHeaders], originalHeaders)
          assertSettledOnServer(yield* stream.info, ack.seq)
          assert.strictEqual(yield* transferCount(id), 0)
        })
    )

    it.effect(
      "BE-JOB-003: dead-letter write: a refused dead-letter publish (stream full) leaves the original unterminated, Released as DeadLetterFailed, and it is dead-lettered on redelivery",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const { manager } = yield* NatsConnection.NatsConnection
          const p = uniquePrefix("dlfull")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          // A dead-letter stream that refuses everything (1 byte, discard new).
          yield* startWorker(stream, log, { attempts: 5, base: "200 millis", deadLetter: { maxBytes: 1 } })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.nobody`, 1_00), id)
          const first = yield* log.waitUntil((all) => all.length > 0, wait)
          const o = first[0]!
          assert.strictEqual(o._tag, "Released")
          if (o._tag === "Released") {
            assert.strictEqual(o.reason, "DeadLetterFailed")
            assert.strictEqual(o.message.deliveryCount, 1)
            assert.isAbove(millis(o.retryIn), 0)
            assert.isTrue(o.confirmed, "the nak for a later redelivery was confirmed")
          }
          // Not terminated: still pending on the server, ack floor before it, no dead letter.
          const info = yield* stream.info
          assert.isBelow(info.ack_floor.stream_seq, seq)
          assert.strictEqual(info.num_ack_pending, 1)
          assert.strictEqual((yield* Effect.promise(() => manager.streams.info(stream.deadLetterStream))).state.messages, 0)

          // Make room; the redelivery is dead-lettered and only then terminated.
          yield* Effect.promise(() => manager.streams.update(stream.deadLetterStream, { max_bytes: -1 }))
          const outcomes = yield* log.waitUntil(
            (all) => all.some((x) => x._tag === "DeadLettered"),
            wait,
            "the redelivery to be dead-lettered"
          )
          const trail = ofSequence(outcomes, seq)
          const last = trail[trail.length - 1]!
          assert.strictEqual(last._tag, "DeadLettered")
          assert.isAtLeast(last.message.deliveryCount, 2, "dead-lettered on a redelivery")
          assert.isTrue(last.confirmed)
          for (const x of trail.slice(0, -1)) {
            assert.isTrue(x._tag === "Released" && x.reason === "DeadLetterFailed")
          }
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.deepStrictEqual(dead.map((d) => [d.sourceSequence, d.reason]), [[seq, "PermanentError"]])
          assertSettledOnServer(yield* stream.info, seq)
        })
    )

    it.effect(
      "BE-JOB-003: dead-letter write: a dead letter that cannot be written by the broker's last delivery (MaxDeliver) ends in an observable terminal outcome and metric, and the message is recoverable once the dead-letter stream has room",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 3 })
          const log = yield* OutcomeLog.make
          const { manager } = yield* NatsConnection.NatsConnection
          const p = uniquePrefix("strand")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          const strandedBefore = yield* strandedCount(stream.consumer)
          // A dead-letter stream that refuses everything for the whole life of the message.
          yield* startWorker(stream, log, { attempts: 2, base: "50 millis", deadLetter: { maxBytes: 1 } })
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.nobody`, 1_00), id)
          const outcomes = yield* log.waitUntil(
            (all) => all.some((x) => x._tag === "DeadLettered"),
            wait,
            "the terminal outcome on the last delivery"
          )
          const trail = ofSequence(outcomes, seq)
          const last = trail[trail.length - 1]!
          assert.strictEqual(last._tag, "DeadLettered")
          assert.strictEqual(last.message.deliveryCount, 3, "on the broker's last delivery")
          assert.isFalse(last.confirmed, "the dead letter was not stored")
          for (const x of trail.slice(0, -1)) assert.isTrue(x._tag === "Released" && x.reason === "DeadLetterFailed")
          assert.strictEqual((yield* strandedCount(stream.consumer)) - strandedBefore, 1, "counted in jetworker.stranded")
          // The broker will not deliver it again; it is still in the stream.
          const stored = yield* Effect.promise(() => manager.streams.getMessage(stream.stream, { seq }))
          assert.strictEqual(stored?.seq, seq)
          // Room again: recovered into the dead-letter stream by its sequence, once however often.
          yield* Effect.promise(() => manager.streams.update(stream.deadLetterStream, { max_bytes: -1 }))
          const first = yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence: seq })
          const again = yield* DeadLetter.recover({ stream: stream.stream, consumer: stream.consumer, sequence: seq })
          assert.isFalse(first.duplicate)
          assert.deepStrictEqual([again.seq, again.duplicate], [first.seq, true], "the second is a duplicate of the first")
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.deepStrictEqual(dead.map((d) => [d.sourceSequence, d.reason, d.eventId]), [[seq, "DeliveriesExhausted", undefined]])
        })
    )

    it.effect(
      "BE-JOB-003: dead-letter write: a missing dead-letter stream (create: false) leaves the original unterminated until the stream is back",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const { manager } = yield* NatsConnection.NatsConnection
          const p = uniquePrefix("dlgone")
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const destination = DeadLetter.destination(stream.stream, stream.consumer)
          yield* DeadLetter.ensure(destination)
          yield* startWorker(stream, log, { attempts: 5, base: "200 millis", deadLetter: { create: false } })
          // The worker is up (a first transfer commits); then the dead-letter stream disappears.
          yield* stream.publish("eur", transfer(`${p}.ok`, `${p}.a`, `${p}.b`, 1_00), `${p}.ok`)
          yield* log.waitUntil((all) => all.length > 0, wait)
          yield* Effect.promise(() => manager.streams.delete(stream.deadLetterStream))

          const id = `${p}.t1`
          const seq = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.nobody`, 1_00), id)
          const first = yield* log.waitUntil((all) => ofEvent(all, id).length > 0, wait)
          const o = ofEvent(first, id)[0]!
          assert.isTrue(o._tag === "Released" && o.reason === "DeadLetterFailed" && o.message.deliveryCount === 1)
          const info = yield* stream.info
          assert.isBelow(info.ack_floor.stream_seq, seq, "not terminated")
          assert.strictEqual(info.num_ack_pending, 1)

          yield* DeadLetter.ensure(destination)
          const outcomes = yield* log.waitUntil((all) => ofEvent(all, id).some((x) => x._tag === "DeadLettered"), wait)
          const last = ofEvent(outcomes, id).at(-1)!
          assert.strictEqual(last._tag, "DeadLettered")
          assert.isAtLeast(last.message.deliveryCount, 2)
          const dead = yield* DeadLetter.list(stream.deadLetterStream)
          assert.deepStrictEqual(dead.map((d) => [d.sourceSequence, d.eventId]), [[seq, id]])
          assertSettledOnServer(yield* stream.info, seq)
        })
    )

    it.effect(
      "BE-JOB-003: dead-letter write: bad input never blocks the stream: malformed and schema-invalid messages are rejected with a readable reason and the next message commits",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const p = uniquePrefix("badinput")
          const id = `${p}.good`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          yield* openAccount(`${p}.b`, "EUR", 0)
          const worker = yield* startWorker(stream, log, { attempts: 5, concurrency: 1 })
          const notJson = encoder.encode(`{"id": "${p}.x", "amount": 1`)
          const notUtf8 = new Uint8Array([0x7b, 0xff, 0xfe, 0x7d])
          const seq1 = yield* stream.publish("eur", notJson, `${p}.bad1`)
          const seq2 = yield* stream.publish("eur", notUtf8, `${p}.bad2`)
          const seq3 = yield* stream.publish("eur", transfer(`${p}.neg`, `${p}.a`, `${p}.b`, -5), `${p}.bad3`)
          const seq4 = yield* stream.publish("eur", transfer(id, `${p}.a`, `${p}.b`, 2_00), id)
          const outcomes = yield* log.waitUntil((all) => all.length >= 4, wait, "four outcomes")

          assert.deepStrictEqual(
            outcomes.map((o) => [o.message.sequence, o._tag, "reason" in o ? o.reason : undefined]),
            [
              [seq1, "Rejected", "MalformedPayload"],
              [seq2, "Rejected", "MalformedPayload"],
              [seq3, "Rejected", "SchemaInvalid"],
              [seq4, "Committed", undefined]
            ]
          )
          for (const o of outcomes.slice(0, 3)) {
            assert.isTrue(o._tag === "Rejected" && o.confirmed && o.message.deliveryCount === 1)
          }
          // The event id where the payload states a valid one: not for a payload that is no JSON.
          assert.deepStrictEqual(outcomes.slice(0, 3).map((o) => o.message.eventId), [undefined, undefined, `${p}.neg`])
          const [r1, , r3] = outcomes as ReadonlyArray<Outcome.Outcome>
          assert.isTrue(r1?._tag === "Rejected" && /not UTF-8 JSON/.test(r1.error.message), "says what is wrong")
          assert.isTrue(
            r3?._tag === "Rejected" && r3.error.tag === "SchemaInvalid" && r3.error.message.includes("amount"),
            `names the invalid field: ${r3?._tag === "Rejected" ? r3.error.message : ""}`
          )
          assert.strictEqual(worker.runsOf(`${p}.neg`).length, 0)
          assert.strictEqual(yield* transferCount(id), 1)
          // By source sequence: they are handled at once, and any may be dead-lettered first.
          const dead = [...(yield* DeadLetter.list(stream.deadLetterStream))].sort((x, y) => x.sourceSequence - y.sourceSequence)
          assert.deepStrictEqual(dead.map((d) => [d.sourceSequence, d.outcome, d.reason]), [
            [seq1, "Rejected", "MalformedPayload"],
            [seq2, "Rejected", "MalformedPayload"],
            [seq3, "Rejected", "SchemaInvalid"]
          ])
          assert.deepStrictEqual(Array.from(dead[1]!.payload), Array.from(notUtf8), "kept byte for byte")
          assertSettledOnServer(yield* stream.info, seq4)
        })
    )

    it.effect(
      "BE-JOB-003: controlled replay: after the cause is fixed, replay commits the dead letter exactly once and removes it; a second replay fails cleanly",
      () =>
        Effect.gen(function*() {
          const stream = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 7 })
          const log = yield* OutcomeLog.make
          const { manager } = yield* NatsConnection.NatsConnection
          const p = uniquePrefix("replay")
          const id = `${p}.t1`
          yield* openAccount(`${p}.a`, "EUR", 100_00)
          const worker = yield* startWorker(stream, log, { attempts: 5 })
          // The producer publishes with its own headers and an optimistic-concurrency expectation
          // (first message on its subject): a condition of that publish, not of a later replay.
          const { jetstream } = yield* NatsConnection.NatsConnection
          const h = headers()
          h.set("X-Trace", "trace-r")
          const seq = (yield* Effect.promise(() =>
            jetstream.publish(stream.subject("eur"), transfer(id, `${p}.a`, `${p}.late`, 25_00), {
              msgID: id,
              headers: h,
              expect: { streamName: stream.stream, lastSubjectSequence: 0 }
            })
          )).seq
          yield* log.waitUntil((all) => all.length > 0, wait)
          const [dead] = yield* DeadLetter.list(stream.deadLetterStream)
          assert.isTrue(dead !== undefined && dead.sourceSequence === seq && dead.reason === "PermanentError")

          // Fix the cause, then replay.
          yield* openAccount(`${p}.late`, "EUR", 0)
          const ack = yield* DeadLetter.replay(stream.deadLetterStream, dead!.sequence)
          assert.strictEqual(ack.stream, stream.stream)
          assert.isFalse(ack.duplicate)
          const outcomes = yield* log.waitUntil((all) => all.some((o) => o._tag === "Committed"), wait)
          const committed = outcomes.find((o) => o._tag === "Committed")!
          assert.strictEqual(committed.message.sequence, ack.seq)
          assert.strictEqual(committed.message.eventId, id)
          assert.strictEqual(committed.message.subject, stream.subject("eur"), "replayed to the original subject")
          assert.deepStrictEqual(ofEvent(outcomes, id).map((o) => o._tag), ["DeadLettered", "Committed"])
          assert.strictEqual(yield* transferCount(id), 1)
          assert.strictEqual(yield* totalBalance([`${p}.late`]), 25_00n)
          // The replayed copy: the original's own headers, a replay id and where it came from.
          const replayed = (yield* Effect.promise(() => manager.streams.getMessage(stream.stream, { seq: ack.seq })))!
          assert.strictEqual(replayed.header.get("X-Trace"), "trace-r")
          assert.strictEqual(replayed.header.get(DeadLetter.Header.replayOf), `${stream.deadLetterStream}:${dead!.sequence}`)
          assert.strictEqual(replayed.header.get("Nats-Msg-Id"), DeadLetter.replayId(dead!))
          assert.isFalse(replayed.header.has("Nats-Expected-Last-Subject-Sequence"), "the original's expectation is not replayed")
          assert.deepStrictEqual(yield* DeadLetter.list(stream.deadLetterStream), [], "gone from the dead-letter stream")

          // Replaying it again: a clean typed failure, nothing republished, no second effect.
          const again = yield* Effect.flip(DeadLetter.replay(stream.deadLetterStream, dead!.sequence))
          assert.instanceOf(again, NatsError.NatsError)
          assert.strictEqual(again.code, 10037)
          const state = (yield* Effect.promise(() => manager.streams.info(stream.stream))).state
          assert.strictEqual(state.last_seq, ack.seq, "no second republish")
          assert.strictEqual(state.messages, 2)
          assert.strictEqual(yield* transferCount(id), 1)
          assert.deepStrictEqual(worker.runsOf(id).map((r) => r.attempt), [1, 1])
          assertSettledOnServer(yield* stream.info, ack.seq)
        })
    )
  })
})

/**
 * Deterministic simulation of the engine: `Consumer.run` over the in-memory broker and store,
 * under `TestClock`, with random workloads and faults drawn from a seeded generator — lost and
 * unconfirmed commands, failed extensions and dead-letter writes, spurious redeliveries, consumer
 * restarts, slow handlers (past their lease), transient and permanent failures, expiring events
 * and republished duplicates. After every run it checks the engine's invariants:
 *
 * - at most one commit per event id;
 * - no ack before its commit (a `Committed` delivery's ack comes after the commit, in one global order);
 * - at most one outcome per delivery, and only for deliveries the broker made;
 * - handlers running at once never above the concurrency;
 * - with per-key ordering: two handlers of one key never run at once, a key's deliveries start
 *   in the order the consumer took them, and the deliveries held (taken, not yet settled) and
 *   those waiting per key never exceed the limits;
 * - no commit of an event whose handler started after it expired;
 * - liveness: once faults stop, every message is settled and its last outcome is final.
 *
 * A failure names its seed; `JW_SIM_SEED=<seed>` replays that one run, `JW_SIM_RUNS=<n>` sets the
 * number of runs (default 100).
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, CurrentDelivery, IdempotencyStore, type Outcome, Retry, type Source } from "@jetworker/core"
import { InMemoryBroker, InMemoryIdempotencyStore } from "@jetworker/testing"
import { Clock, Data, DateTime, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"
import { generator } from "./support/random.ts"

class Transient extends Data.TaggedError("Transient")<{ readonly message: string }> {}
class Permanent extends Data.TaggedError("Permanent")<{ readonly message: string }> {}

const Event = Schema.Struct({ id: Schema.String, key: Schema.String, expiresAt: Schema.optional(Schema.Number) })
const decoder = new TextDecoder()
/** The key of a simulated payload, or undefined for one that is not JSON. */
const keyOf = (payload: Uint8Array): string | undefined => {
  try {
    return (JSON.parse(decoder.decode(payload)) as { readonly key?: string }).key
  } catch {
    return undefined
  }
}


interface Plan {
  readonly id: string
  /** The ordering key (a handful per run, so keys collide). */
  readonly key: string
  /** Transient failures before it succeeds (Infinity: never). */
  readonly failures: number
  readonly permanent: boolean
  /** Handler time on each run, in milliseconds. */
  readonly work: number
  /** Epoch millis after which the event must have no effect, if any. */
  readonly expiresAt: number | undefined
}

const FINAL: ReadonlyArray<Outcome.Tag> = ["Committed", "Duplicate", "Expired", "Rejected", "DeadLettered"]
const LEASE = 1_000
const STEP = 100
/** Steps (of simulated time) with faults; after them the run must settle everything. */
const FAULT_STEPS = 300

/** One simulated run; returns a description of the first broken invariant, or undefined. */
const simulate = (seed: number) =>
  Effect.gen(function*() {
    const random = generator(seed)
    const pick = <A>(values: ReadonlyArray<A>): A => values[Math.floor(random() * values.length)]!
    const model = pick(["unordered", "perKey", "perKey", "sequential", "batch", "batch"] as const)
    const concurrency = model === "sequential" ? 1 : pick([1, 2, 4, 6])
    const batchSize = pick([2, 3, 5])
    // A batch commits each element on its own (`commitBatch`) or all as one set (`commitAll`).
    const batchCommit = pick(["each", "all"] as const)
    const limits = { maxQueued: pick([0, 1, 3, 8]), maxQueuedPerKey: pick([0, 1, 2]), maxKeys: pick([1, 2, 8]) }
    const keys = pick([1, 2, 5])
    const attempts = pick([2, 3, 4])
    const restarts = pick([0, 0.005, 0.02])
    const faults = {
      commandLost: pick([0, 0.05, 0.15]),
      replyLost: pick([0, 0.05, 0.15]),
      extendFails: pick([0, 0.1, 0.5]),
      deadLetterFails: pick([0, 0.2]),
      duplicate: pick([0, 0.05])
    }
    const order = (() => {
      let n = 0
      return { next: () => ++n }
    })()
    const broker = InMemoryBroker.make({
      lease: LEASE,
      maxDeliver: pick([undefined, 2 * attempts + 3]),
      faults,
      random,
      clock: order
    })
    const store = InMemoryIdempotencyStore.make({ clock: order, failCommit: () => random() < faults.replyLost / 2 })
    const start = yield* Clock.currentTimeMillis

    // The workload: events, some failing, some slow, some expiring, some published twice.
    const plans = new Map<string, Plan>()
    const count = 3 + Math.floor(random() * 15)
    for (let i = 0; i < count; i++) {
      const id = `e${i}`
      const kind = random()
      plans.set(id, {
        id,
        key: `k${Math.floor(random() * keys)}`,
        failures: kind < 0.15 ? 1 + Math.floor(random() * (attempts + 1)) : kind < 0.2 ? Number.POSITIVE_INFINITY : 0,
        permanent: kind >= 0.2 && kind < 0.27,
        work: pick([0, 0, 10, 200, 2 * LEASE]),
        expiresAt: random() < 0.15 ? start + Math.floor(random() * 3 * LEASE) : undefined
      })
    }
    for (const plan of plans.values()) {
      const body = JSON.stringify({ id: plan.id, key: plan.key, ...(plan.expiresAt === undefined ? {} : { expiresAt: plan.expiresAt }) })
      yield* broker.publish(body)
      if (random() < 0.1) yield* broker.publish(body) // a republish past the stream's dedup window
    }
    if (random() < 0.2) yield* broker.publish("{ not json")

    // The source, observed: what each incarnation of the consumer took, in order, and what it holds.
    let incarnation = 0
    let tick = 0 // orders takes and handler starts
    const taken: Array<{ readonly incarnation: number; readonly delivery: string; readonly key: string | undefined; readonly at: number }> = []
    const limitProblems: Array<string> = []
    const held = new Set<string>() // deliveries taken and without an outcome yet
    const maxHeld = model === "perKey"
      ? concurrency + limits.maxQueued
      : model === "batch"
      ? concurrency * batchSize
      : concurrency
    const source: Source.Source = {
      name: broker.source.name,
      open: (options) =>
        Effect.map(broker.source.open(options), (intake) => ({
          ...intake,
          take: Effect.map(intake.take, (delivery) => {
            const id = `${delivery.sequence}:${delivery.deliveryCount}`
            const key = keyOf(delivery.payload)
            taken.push({ incarnation, delivery: id, key, at: ++tick })
            held.add(id)
            if (held.size > maxHeld) limitProblems.push(`${held.size} deliveries held; the limit is ${maxHeld}`)
            return delivery
          })
        }))
    }

    // The handler, observed.
    let running = 0
    let maxRunning = 0
    const runningByKey = new Map<string, number>()
    const overlaps: Array<string> = []
    const firstStart = new Map<string, number>() // delivery -> `tick` of its first handler start
    const runs = new Map<string, number>()
    const startedAt = new Map<string, Array<number>>()
    const work = (event: typeof Event.Type, run: number) =>
      Effect.gen(function*() {
        const plan = plans.get(event.id)!
        if (plan.work > 0) yield* Effect.sleep(plan.work) // the workload, in simulated time
        if (plan.permanent) return yield* new Permanent({ message: "permanent" })
        if (run <= plan.failures) return yield* new Transient({ message: `failure ${run}` })
      })
    // Bookkeeping when a handler starts on an event; returns the run number of its event.
    const begin = (event: typeof Event.Type, delivery: string, now: number) => {
      const run = (runs.get(event.id) ?? 0) + 1
      runs.set(event.id, run)
      startedAt.set(event.id, [...(startedAt.get(event.id) ?? []), now])
      if (!firstStart.has(delivery)) firstStart.set(delivery, ++tick)
      const sameKey = (runningByKey.get(event.key) ?? 0) + 1
      runningByKey.set(event.key, sameKey)
      if (sameKey > 1 && model !== "unordered" && model !== "batch") overlaps.push(`${sameKey} handlers of ${event.key} at once`)
      return run
    }
    const end = (event: typeof Event.Type) => runningByKey.set(event.key, runningByKey.get(event.key)! - 1)
    const counted = <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) =>
      Effect.suspend(() => {
        running++
        maxRunning = Math.max(maxRunning, running)
        return effect.pipe(Effect.ensuring(Effect.sync(() => running--)))
      })
    const handle = (event: typeof Event.Type) =>
      counted(Effect.gen(function*() {
        const current = yield* CurrentDelivery.CurrentDelivery
        const run = begin(event, `${current.sequence}:${current.deliveryCount}`, yield* Clock.currentTimeMillis)
        return yield* IdempotencyStore.commit(event.id, work(event, run)).pipe(Effect.ensuring(Effect.sync(() => end(event))))
      }))
    const handleBatch = (events: ReadonlyArray<typeof Event.Type>) =>
      counted(Effect.gen(function*() {
        const batch = yield* CurrentDelivery.CurrentBatch
        const now = yield* Clock.currentTimeMillis
        const items = events.map((event, i) => {
          const element = batch.elements[i]!
          return { id: event.id, effect: work(event, begin(event, `${element.sequence}:${element.deliveryCount}`, now)) }
        })
        // Now and then the whole run fails (the engine then runs each element alone).
        if (random() < 0.1) return yield* new Transient({ message: "the whole batch failed" })
        if (batchCommit === "all") {
          return yield* IdempotencyStore.commitAll(
            items.map((item) => item.id),
            (fresh) => Effect.forEach(fresh, (i) => items[i]!.effect, { discard: true })
          )
        }
        return yield* IdempotencyStore.commitBatch(items)
      }).pipe(Effect.ensuring(Effect.sync(() => events.forEach(end)))))

    const outcomes: Array<Outcome.Outcome> = []
    const common = {
      name: "sim",
      source,
      schema: Event,
      metadata: (event: typeof Event.Type) => ({
        id: event.id,
        time: DateTime.makeUnsafe(start),
        ...(event.expiresAt === undefined ? {} : { expiresAt: DateTime.makeUnsafe(event.expiresAt) })
      }),
      classify: { Transient: "transient", Permanent: "permanent", IdempotencyError: "isRetryable" } as const,
      retry: Retry.exponential({ attempts, base: "100 millis", cap: "1 second", inProcessRetries: pick([0, 1]) }),
      handlerTimeout: "10 seconds" as const,
      drainTimeout: pick(["0 millis", "300 millis", "5 seconds"] as const),
      onOutcome: (outcome: Outcome.Outcome) =>
        Effect.sync(() => {
          outcomes.push(outcome)
          held.delete(`${outcome.message.sequence}:${outcome.message.deliveryCount}`)
        })
    }
    const consumer = model === "batch"
      ? Consumer.makeBatch({
        ...common,
        batch: { maxSize: batchSize, maxWait: pick(["0 millis", "50 millis", "300 millis"] as const) },
        handleBatch,
        concurrency
      })
      : Consumer.make({
        ...common,
        ordering: model === "perKey" ? { perKey: (event) => event.key, ...limits } : model,
        handle,
        ...(model === "sequential" ? {} : { concurrency })
      })
    const runConsumer = Effect.suspend(() => {
      incarnation++
      return Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(store.layer)))
    })

    // Stopping waits for the drain, which runs on the test clock: keep moving time meanwhile.
    const stop = (running: Fiber.Fiber<unknown, unknown>) =>
      Effect.gen(function*() {
        const stopping = yield* Effect.forkChild(Fiber.interrupt(running))
        for (let i = 0; i < 1_000 && stopping.pollUnsafe() === undefined; i++) yield* TestClock.adjust(STEP)
        yield* Fiber.join(stopping)
      })

    // Drive time; restart the consumer now and then; stop the faults after a while.
    let fiber = yield* runConsumer
    for (let step = 0; step < 1_500; step++) {
      if (step === FAULT_STEPS) {
        faults.commandLost = 0
        faults.replyLost = 0
        faults.extendFails = 0
        faults.deadLetterFails = 0
        faults.duplicate = 0
      }
      if (step < FAULT_STEPS && random() < restarts) {
        yield* stop(fiber)
        fiber = yield* runConsumer
      }
      yield* TestClock.adjust(STEP)
      // Done once everything is settled and nothing runs (faults and restarts change nothing then).
      if (broker.quiescent() && running === 0) break
    }
    yield* stop(fiber)

    // The invariants.
    const problems: Array<string> = []
    const commitsById = new Map<string, number>()
    for (const c of store.commits()) commitsById.set(c.id, (commitsById.get(c.id) ?? 0) + 1)
    for (const [id, n] of commitsById) if (n > 1) problems.push(`event ${id} committed ${n} times`)

    const delivered = new Set(broker.events().filter((e) => e._tag === "Delivered").map((e) => `${e.sequence}:${e.deliveryCount}`))
    const outcomeOf = new Map<string, number>()
    for (const o of outcomes) {
      const key = `${o.message.sequence}:${o.message.deliveryCount}`
      outcomeOf.set(key, (outcomeOf.get(key) ?? 0) + 1)
      if (!delivered.has(key)) problems.push(`outcome ${o._tag} for delivery ${key} the broker never made`)
    }
    for (const [key, n] of outcomeOf) if (n > 1) problems.push(`delivery ${key} has ${n} outcomes`)

    const commitIndex = new Map(store.commits().map((c) => [c.id, c.index]))
    for (const o of outcomes) {
      if (o._tag !== "Committed" || o.ackWithheld !== undefined) continue
      const ack = broker.events().find((e) =>
        e._tag === "Acked" && e.sequence === o.message.sequence && e.deliveryCount === o.message.deliveryCount
      )
      const committedAt = commitIndex.get(o.message.eventId ?? "")
      if (committedAt === undefined) problems.push(`Committed outcome for ${o.message.eventId} without a commit`)
      else if (ack !== undefined && ack.index < committedAt) problems.push(`ack of ${o.message.eventId} before its commit`)
    }

    if (maxRunning > concurrency) problems.push(`${maxRunning} handlers ran at once; the concurrency is ${concurrency}`)
    problems.push(...overlaps.slice(0, 1), ...limitProblems.slice(0, 1))
    if (model === "perKey") {
      // Deliveries waiting (taken, handler not started yet; those that never ran are left out,
      // as they may be settling outside any lane): per key and in keys, within the limits.
      // Several messages in one problem line are one event seen at several marks.
      const marks = taken.flatMap((t) => {
        const start = firstStart.get(t.delivery)
        return start === undefined || t.key === undefined ? [] : [{ at: t.at, add: 1, key: t.key }, { at: start, add: -1, key: t.key }]
      }).sort((x, y) => x.at - y.at)
      const waiting = new Map<string, number>()
      for (const mark of marks) {
        const n = (waiting.get(mark.key) ?? 0) + mark.add
        if (n === 0) waiting.delete(mark.key)
        else waiting.set(mark.key, n)
        // A lane holds its running delivery and `maxQueuedPerKey` more; one more may wait at the
        // door of a full lane (or of a full set of keys): its key is known only once it is taken.
        if (n > 2 + limits.maxQueuedPerKey) problems.push(`${n} deliveries of ${mark.key} waited; the limit is ${2 + limits.maxQueuedPerKey}`)
        if (waiting.size > limits.maxKeys + 1) problems.push(`${waiting.size} keys waited; the limit is ${limits.maxKeys + 1}`)
      }
    }
    if (model !== "unordered") {
      // Per key and incarnation, deliveries whose handler ran started in the order they were taken.
      const lastStart = new Map<string, { readonly delivery: string; readonly start: number }>()
      for (const t of taken) {
        const start = firstStart.get(t.delivery)
        if (start === undefined || t.key === undefined) continue
        const laneId = `${t.incarnation}/${t.key}`
        const previous = lastStart.get(laneId)
        if (previous !== undefined && previous.start > start) {
          problems.push(`${t.delivery} (key ${t.key}) started before ${previous.delivery}, which was taken first`)
        }
        lastStart.set(laneId, { delivery: t.delivery, start })
      }
    }

    for (const c of store.commits()) {
      const plan = plans.get(c.id)
      if (plan?.expiresAt === undefined) continue
      const starts = startedAt.get(c.id) ?? []
      // Expired means strictly past `expiresAt` (Envelope.isExpired).
      if (!starts.some((t) => t <= plan.expiresAt!)) problems.push(`expired event ${c.id} committed by a handler started after expiry`)
    }

    if (!broker.quiescent()) {
      problems.push(`not settled: ${broker.messages().filter((m) => m.status === "pending" || m.status === "inflight").map((m) => m.sequence).join(",")}`)
    }
    for (const message of broker.messages()) {
      const tags = outcomes.filter((o) => o.message.sequence === message.sequence).map((o) => o._tag)
      if (message.status === "done" && !tags.some((tag) => FINAL.includes(tag))) {
        problems.push(`message ${message.sequence} settled without a final outcome (${tags.join(",")})`)
      }
    }
    return problems.length === 0 ? undefined : `seed ${seed}: ${problems.slice(0, 5).join("; ")}`
  })

const runs = Number(process.env.JW_SIM_RUNS ?? 100)
const only = process.env.JW_SIM_SEED === undefined ? undefined : Number(process.env.JW_SIM_SEED)

describe("engine simulation", () => {
  it.effect(`every invariant holds under random faults (${only === undefined ? `${runs} seeded runs` : `seed ${only}`})`, () =>
    Effect.gen(function*() {
      const seeds = only !== undefined ? [only] : Array.from({ length: runs }, (_, i) => 1_000 + i)
      const failures: Array<string> = []
      for (const seed of seeds) {
        // A fresh test clock per run: a clock that has seen thousands of runs' sleeps slows down.
        const problem = yield* simulate(seed).pipe(Effect.provide(TestClock.layer()))
        if (problem !== undefined) failures.push(problem)
        if (failures.length >= 3) break
      }
      assert.deepStrictEqual(
        failures,
        [],
        `${failures.join("\n")}\nreplay one with: JW_SIM_SEED=<seed> pnpm exec vitest run test/simulation.test.ts`
      )
    }), Math.max(120_000, runs * 500))
})

/**
 * BE-JOB-004, the finite limits: a load test of the prefetch and local queue bounds against the
 * real NATS server. One stream holds a backlog of 100 000 messages (filled once per file, many
 * confirmed publishes in flight), far more than any case reserves or works through; each case
 * reads all of it through its own durable, whose `max_ack_pending` (20 000) is far above the
 * limits under test, so the only thing bounding what the server hands out is the source: at most
 * `prefetch` deliveries reserved (buffered locally or on their way) ahead of the `concurrency`
 * running handlers.
 *
 * While a case runs, the server's consumer info is sampled every 50 ms: `num_ack_pending` (what
 * the server counts as handed out and not yet acked) must never exceed `concurrency + prefetch`,
 * yet come close to it (the handlers are the bottleneck, so the local queue is full: the bound is
 * reached, not merely unchallenged). The handler counts how many run at once (never more than
 * `concurrency`), and the process's resident memory is sampled too (bounded growth).
 *
 * One case orders per key over four keys: its key lanes fill to their limits (`maxQueuedPerKey`,
 * within `maxQueued`) and the engine stops pulling, so the bound is `concurrency + maxQueued +
 * prefetch`, and no two handlers of a key ever run at once.
 *
 * The slow case is slow handlers with a short pull expiry: the local queue stays full longer
 * than two idle heartbeats. nats.js's `consume()` then re-pulls a full batch at every heartbeat
 * interval on top of what it buffers (this case against the former `consume()`-based source:
 * `num_ack_pending` 141 against a bound of 22 within its 13 s), which is why `JetStreamSource`
 * pulls with `fetch` requests sized to the free room.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope } from "@jetworker/core"
import { JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Clock, Context, Duration, Effect, Fiber, Layer, Schedule, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))

/** Messages in the backlog. */
const BACKLOG = 100_000
/** Confirmed publishes in flight at once while filling. */
const PUBLISH_BATCH = 1_000
/** Bound on resident memory growth while one case runs. */
const RSS_GROWTH_LIMIT = 150 * 1024 * 1024

const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MB`

/** The filled stream the cases read, each through its own durable. */
class Backlog extends Context.Service<Backlog, {
  readonly stream: TestStream.TestStream
  readonly fillMillis: number
}>()("test/limits/Backlog") {}

/**
 * Publishes `count` small jobs to `subject`, `PUBLISH_BATCH` confirmed publishes in flight at a
 * time (each batch awaited as a whole); returns how long it took in milliseconds.
 */
const fill = (subject: string, count: number) =>
  Effect.gen(function*() {
    const connection = yield* NatsConnection.NatsConnection
    const encoder = new TextEncoder()
    const time = new Date().toISOString()
    const started = yield* Clock.currentTimeMillis
    yield* Effect.tryPromise({
      try: async () => {
        for (let from = 0; from < count; from += PUBLISH_BATCH) {
          const batch: Array<Promise<unknown>> = []
          for (let n = from; n < Math.min(count, from + PUBLISH_BATCH); n++) {
            const payload = encoder.encode(JSON.stringify({ id: `j${n}`, type: "test.job", time, data: { n } }))
            batch.push(connection.jetstream.publish(subject, payload))
          }
          await Promise.all(batch)
        }
      },
      catch: (error) => new Error(`filling ${subject}: ${String(error)}`)
    }).pipe(Effect.timeout("40 seconds"))
    return (yield* Clock.currentTimeMillis) - started
  })

const BacklogLive = Layer.effect(
  Backlog,
  Effect.gen(function*() {
    const stream = yield* TestStream.make({ maxAckPending: 20_000, ackWait: "30 seconds" })
    const fillMillis = yield* fill(stream.subject("load"), BACKLOG)
    const info = yield* stream.info
    assert.strictEqual(info.num_pending, BACKLOG, "the whole backlog is in the stream")
    console.log(
      `BE-JOB-004 load: filled ${BACKLOG} messages in ${fillMillis} ms ` +
        `(${Math.round(BACKLOG / (fillMillis / 1000))}/s, ${PUBLISH_BATCH} confirmed publishes in flight)`
    )
    return { stream, fillMillis }
  })
).pipe(Layer.provideMerge(NatsLive))

interface Case {
  readonly concurrency: number
  readonly prefetch: number
  /** The handler's own duration. */
  readonly work: Duration.Input
  /** How long the consumer runs while the server is sampled. */
  readonly period: Duration.Input
  /** Outcomes the run must at least reach. */
  readonly minOutcomes: number
  readonly pullExpires?: Duration.Input | undefined
  /** Per-key ordering over `keys` keys (job n has key n mod keys), with its queue limits. */
  readonly perKey?: { readonly keys: number; readonly maxQueued: number; readonly maxQueuedPerKey: number } | undefined
}

/** What the server may have handed out at most: running, waiting in key lanes, reserved ahead. */
const boundOf = (limits: Case) => limits.concurrency + (limits.perKey?.maxQueued ?? 0) + limits.prefetch

/** What one case measured. */
interface Measured {
  readonly runMillis: number
  readonly outcomes: number
  readonly committed: number
  /** Released `Interrupted` once the consumer was stopping: per key, what waited for its key's turn. */
  readonly releasedAtStop: number
  readonly maxRunning: number
  readonly maxRunningPerKey: number
  readonly maxAckPending: number
  readonly samples: number
  readonly rssBefore: number
  readonly rssMax: number
}

const runCase = (limits: Case) =>
  Effect.gen(function*() {
    const { stream } = yield* Backlog
    const durable = `load_c${limits.concurrency}_p${limits.prefetch}${limits.perKey === undefined ? "" : `_k${limits.perKey.keys}`}`
    yield* Topology.ensureConsumer({ stream: stream.stream, name: durable, ackWait: "30 seconds", maxAckPending: 20_000 })
    const info = Effect.flatMap(NatsConnection.NatsConnection, (connection) =>
      Effect.tryPromise(() => connection.manager.consumers.info(stream.stream, durable)))

    // Plain counters: the handler and onOutcome run on the one JS thread.
    const counts = { running: 0, maxRunning: 0, maxRunningPerKey: 0, outcomes: 0, committed: 0, releasedAtStop: 0 }
    let stopping = false
    const runningByKey = new Map<string, number>()
    const keyOf = (event: typeof Event.Type) => `k${event.data.n % (limits.perKey?.keys ?? 1)}`
    const consumer = Consumer.make({
      name: durable,
      source: JetStreamSource.make({ stream: stream.stream, consumer: durable, pullExpires: limits.pullExpires }),
      schema: Event,
      handle: (event) =>
        Effect.sync(() => {
          counts.running++
          counts.maxRunning = Math.max(counts.maxRunning, counts.running)
          const sameKey = (runningByKey.get(keyOf(event)) ?? 0) + 1
          runningByKey.set(keyOf(event), sameKey)
          counts.maxRunningPerKey = Math.max(counts.maxRunningPerKey, sameKey)
        }).pipe(
          Effect.andThen(Effect.sleep(limits.work)), // wait: the handler's own work
          Effect.ensuring(Effect.sync(() => {
            counts.running--
            runningByKey.set(keyOf(event), runningByKey.get(keyOf(event))! - 1)
          }))
        ),
      ordering: limits.perKey === undefined
        ? "unordered"
        : { perKey: keyOf, maxQueued: limits.perKey.maxQueued, maxQueuedPerKey: limits.perKey.maxQueuedPerKey },
      classify: {},
      concurrency: limits.concurrency,
      prefetch: limits.prefetch,
      drainTimeout: "5 seconds",
      onOutcome: (outcome) =>
        Effect.sync(() => {
          counts.outcomes++
          if (outcome._tag === "Committed") counts.committed++
          else if (stopping && outcome._tag === "Released" && outcome.reason === "Interrupted") counts.releasedAtStop++
        })
    })

    const rssBefore = process.memoryUsage().rss
    let rssMax = rssBefore
    let maxAckPending = 0
    let samples = 0
    const sample = Effect.flatMap(info, (consumerInfo) =>
      Effect.andThen(
        Effect.sync(() => {
          samples++
          maxAckPending = Math.max(maxAckPending, consumerInfo.num_ack_pending)
          rssMax = Math.max(rssMax, process.memoryUsage().rss)
        }),
        Clock.currentTimeMillis
      ))

    const started = yield* Clock.currentTimeMillis
    const ends = started + Duration.toMillis(Duration.fromInputUnsafe(limits.period))
    const fiber = yield* Effect.forkChild(Consumer.run(consumer))
    // The load runs for the case's period (a workload duration, not a wait for a result); each
    // sample is one consumer info request, bounded by the API timeout.
    yield* sample.pipe(Effect.repeat({ schedule: Schedule.spaced("50 millis"), until: (now) => now >= ends }))
    const runMillis = (yield* Clock.currentTimeMillis) - started
    const ended = fiber.pollUnsafe()
    assert.isUndefined(ended, `the consumer ran the whole period (it ended: ${String(ended)})`)
    stopping = true
    yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
    const measured: Measured = {
      runMillis,
      outcomes: counts.outcomes,
      committed: counts.committed,
      releasedAtStop: counts.releasedAtStop,
      maxRunning: counts.maxRunning,
      maxRunningPerKey: counts.maxRunningPerKey,
      maxAckPending,
      samples,
      rssBefore,
      rssMax
    }
    console.log(
      `BE-JOB-004 load (concurrency ${limits.concurrency}, prefetch ${limits.prefetch}, handler ` +
        `${Duration.format(Duration.fromInputUnsafe(limits.work))}): ${measured.outcomes} outcomes in ${runMillis} ms ` +
        `(${Math.round(measured.outcomes / (runMillis / 1000))}/s); max num_ack_pending ${maxAckPending} over ${samples} ` +
        `samples (bound ${boundOf(limits)}); max running handlers ${measured.maxRunning}; ` +
        `rss ${mb(rssBefore)} -> max ${mb(rssMax)} (+${mb(rssMax - rssBefore)})`
    )
    return measured
  })

const check = (limits: Case, measured: Measured) => {
  const bound = boundOf(limits)
  assert.isAtLeast(measured.outcomes, limits.minOutcomes, "messages flowed")
  // Per key, what waited for its key's turn when the consumer stopped is released, not run
  // (BE-SHUT-002); at most what the lanes hold. Everything else is Committed.
  assert.strictEqual(measured.committed + measured.releasedAtStop, measured.outcomes, "every outcome is Committed, or released at the stop")
  assert.isAtMost(
    measured.releasedAtStop,
    limits.perKey === undefined ? 0 : limits.concurrency + limits.perKey.maxQueued,
    "released at the stop: at most what the engine held beside the intake's buffer"
  )
  assert.isAtLeast(measured.samples, 20, "the server was sampled throughout the run")
  if (limits.perKey === undefined) {
    assert.strictEqual(measured.maxRunning, limits.concurrency, "the handlers ran at the concurrency, never above it")
  } else {
    // One handler per key: with fewer keys than slots, the keys bound the parallelism.
    assert.strictEqual(measured.maxRunning, Math.min(limits.concurrency, limits.perKey.keys), "one handler per key, in parallel across keys")
    assert.strictEqual(measured.maxRunningPerKey, 1, "never two handlers of one key")
  }
  assert.isAtMost(measured.maxAckPending, bound, `the server never had more than concurrency + maxQueued + prefetch (${bound}) handed out`)
  // The lanes (or, unordered, the slots) full and the source's buffer half full at least.
  const held = limits.perKey === undefined
    ? limits.concurrency
    : Math.min(limits.perKey.keys * (1 + limits.perKey.maxQueuedPerKey), limits.concurrency + limits.perKey.maxQueued)
  assert.isAtLeast(
    measured.maxAckPending,
    held + Math.ceil(limits.prefetch / 2),
    "the local queues filled: the bound was reached, not just unchallenged"
  )
  assert.isBelow(measured.rssMax - measured.rssBefore, RSS_GROWTH_LIMIT, "resident memory stays bounded")
}

const cases = {
  wide: { concurrency: 16, prefetch: 16, work: "40 millis", period: "8 seconds", minOutcomes: 1_000 },
  deep: { concurrency: 4, prefetch: 50, work: "20 millis", period: "8 seconds", minOutcomes: 500 },
  slow: { concurrency: 2, prefetch: 20, work: "1 second", period: "13 seconds", minOutcomes: 20, pullExpires: "1 second" },
  keyed: {
    concurrency: 8,
    prefetch: 8,
    work: "40 millis",
    period: "8 seconds",
    minOutcomes: 300,
    perKey: { keys: 4, maxQueued: 12, maxQueuedPerKey: 3 }
  }
} satisfies Record<string, Case>

describe("limits (BE-JOB-004)", () => {
  layer(BacklogLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect(
      "BE-JOB-004: load test of the prefetch limit: concurrency 16, prefetch 16 over a 100 000 message backlog: the server never has more than 32 messages handed out, at most 16 handlers run, memory stays bounded",
      () => Effect.map(runCase(cases.wide), (measured) => check(cases.wide, measured)),
      30_000
    )
    it.effect(
      "BE-JOB-004: load test of the prefetch limit: concurrency 4, prefetch 50 over a 100 000 message backlog: the server never has more than 54 messages handed out, at most 4 handlers run, memory stays bounded",
      () => Effect.map(runCase(cases.deep), (measured) => check(cases.deep, measured)),
      30_000
    )
    it.effect(
      "BE-JOB-004: load test of the prefetch limit: slow handlers keep the local queue full past two idle heartbeats, and the source still never has more than concurrency + prefetch handed out",
      () => Effect.map(runCase(cases.slow), (measured) => check(cases.slow, measured)),
      30_000
    )
    it.effect(
      "BE-JOB-004: load test of the queue limits: per-key ordering over 4 keys (concurrency 8, maxQueued 12, 3 per key, prefetch 8): the key lanes fill to their limits and the engine stops pulling; the server never has more than 28 handed out, never two handlers of one key",
      () => Effect.map(runCase(cases.keyed), (measured) => check(cases.keyed, measured)),
      30_000
    )
  })
})

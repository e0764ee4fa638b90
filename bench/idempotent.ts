/**
 * The idempotent commit path: messages per second from JetStream into PostgreSQL with exactly one
 * effect row per event, against hand-written nats.js + `pg` loops doing the same work, on the same
 * servers in the same run. Every side consumes a fresh stream of the same shape (`messages` JSON
 * envelopes with distinct ids) through a durable pull consumer with the same settings, writes into
 * a fresh schema with the same tables (jetworker's dedup table, from `Migrations.statements`, and an
 * effect table `bench_effects` with no key, so a repeated effect would show as an extra row), and
 * acks with a request the server confirms. The clock runs from opening the consumer (pools warmed
 * beforehand; for jetworker this includes its source's start-up checks and dead-letter stream) to
 * the last confirmed ack.
 *
 * - baseline per message: `consume({ max_messages: prefetch })`, `concurrency` workers, a `pg` pool
 *   of `concurrency` connections; per message JSON decode, BEGIN, dedup INSERT ... ON CONFLICT DO
 *   NOTHING, effect INSERT (new ids only), COMMIT, confirmed ack.
 * - baseline batched: the same pull loop (pulling `max(prefetch, batchSize)` at a time) feeding
 *   `max(2, concurrency / 4)` batch workers, each with its own pool connection; each takes up to
 *   `batchSize` messages (or what arrived within 5 ms), and runs one transaction per batch: one
 *   multi-row dedup INSERT (rows in id order, so concurrent batches lock in the same order)
 *   RETURNING the new ids, one multi-row effect INSERT for them, COMMIT, then a confirmed ack per
 *   message.
 * - jetworker per message: `Consumer.run` over a `JetStreamSource`, a handler
 *   `IdempotencyStore.commit(event.id, <effect INSERT through the SqlClient>)` on `PgIdempotencyStore`
 *   (with `PgAttemptStore`, as a production worker is assembled; it is not read on a first
 *   delivery), on a `PgPipelinedClient` of `concurrency` connections (its transactions send their
 *   BEGIN with the dedup row: three round trips a message). It also decodes the envelope with its
 *   Schema, which the baselines skip.
 * - jetworker per message, on PgClient: the same on `@effect/sql-pg`'s `PgClient` (four round trips
 *   a message, as the baseline).
 * - jetworker per message, effect sent: the same on `PgPipelinedClient`, the effect insert sent
 *   without waiting (`PgPipelinedClient.send`), so that it leaves with the COMMIT: two round trips
 *   a message.
 * - jetworker per message, one statement: the same, but the handler is
 *   `PgIdempotencyStore.commitStatement`, which sends the dedup row and the effect insert as one
 *   statement (`WITH ... INSERT ... ON CONFLICT DO NOTHING RETURNING 1 ... INSERT ... WHERE EXISTS`):
 *   one round trip to PostgreSQL instead of four. Not being a transaction, it can share a
 *   connection: its pool has `concurrency / 4` connections with `multiplex` on, each pipelining
 *   up to 4 statements in flight into one write.
 *
 * Each side first runs an uncounted warm-up round (1000 messages at most), then the sides alternate
 * round by round (the order rotates). Each side's effect rows, dedup rows, the consumer's pending
 * counts and (jetworker) the outcomes are checked after every round, warm-up included, and any
 * mismatch fails the run. Prints median/min/max msg/s per side with this process's CPU time per
 * message and event-loop utilization (the servers share the machine: a saturated loop means the
 * rate is bounded by the consumer's own CPU), the ratios, and writes the table to
 * `bench/results/idempotent.md` and a chart of the rates to `bench/results/idempotent.svg`.
 *
 *   node bench/idempotent.ts [messages=5000] [concurrency=16] [prefetch=concurrency] [batchSize=64] [rounds=3] [batchedMessages=10×messages]
 *
 * The batched sides count `batchedMessages` per round, so that their rounds last about as long as
 * the per-message sides' (rates and ratios are per message either way).
 *
 * NATS_URL (default nats://127.0.0.1:4222) and DATABASE_URL (default
 * postgres://postgres@127.0.0.1:5432/test) select the servers. BENCH_SIDES=baseline,jetworker
 * (keys: baseline, baseline-batched, jetworker, jetworker-pgclient, jetworker-sent, jetworker-statement, jetworker-batched) runs only those sides, and then leaves the
 * results file alone. BENCH_CPU_PROFILE=dir writes a CPU profile of each side's rounds (the
 * consumer's run only, not the stream's fill) to `dir/<side>-<round>.cpuprofile`.
 */
import { PgClient } from "@effect/sql-pg"
import { Consumer, Envelope, IdempotencyStore, type Outcome } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { Migrations, PgAttemptStore, PgIdempotencyStore, PgPipelinedClient } from "@jetworker/sql-pg"
import { jetstream, jetstreamManager, type JsMsg } from "@nats-io/jetstream"
import { connect, type NatsConnection as NatsClient } from "@nats-io/transport-node"
import { Deferred, Duration, Effect, Layer, Logger, Redacted, References, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import pg from "pg"
import { barChart } from "./chart.ts"
import { profiled } from "./cpuProfile.ts"
import { commitByHand, effectDdl, transaction } from "./pgBaseline.ts"
import { publishAll } from "./rawLoop.ts"
import * as SocketWrites from "./socketWrites.ts"
import * as Stopwatch from "./stopwatch.ts"

const total = Number(process.argv[2] ?? 5000)
const concurrency = Number(process.argv[3] ?? 16)
const prefetch = Number(process.argv[4] ?? concurrency)
const batchSize = Number(process.argv[5] ?? 64)
const rounds = Number(process.argv[6] ?? 3)
/**
 * Messages per round of the batched sides: ten times more by default, so that a round of a side
 * running ten times faster lasts about as long (5 000 messages were a third of a second, too short
 * for a median to mean much).
 */
const batchedTotal = Number(process.argv[7] ?? 10 * total)
for (const [name, value] of Object.entries({ total, concurrency, prefetch, batchSize, rounds, batchedTotal })) {
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`${name} must be a positive integer, got ${value}`)
}
/** Batched baseline: a batch waits at most this long for more messages once it has one. */
const maxWaitMillis = 5
/** Batched baseline: transactions in flight at once (each its own pool connection). */
const batchWorkers = Math.max(2, Math.floor(concurrency / 4))
/** Batched baseline: the pull size, at least one full batch. */
const batchPrefetch = Math.max(prefetch, batchSize)
/** Batched baseline: messages held at once (queued or in a transaction). */
const batchCap = batchWorkers * batchSize
/**
 * One statement: pooled connections, each pipelining `concurrency / connections` statements. (One
 * connection for all would serialize every commit's WAL flush on one backend; several let
 * PostgreSQL flush them together.)
 */
const statementConnections = Math.max(1, Math.floor(concurrency / 4))
/** Messages of the uncounted warm-up round each side runs first. */
const warmup = Math.min(1000, total)

const servers = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const databaseUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const CONSUMER = "bench" // also the dedup scope on every side
const ACK_TIMEOUT = 5000
const ROUND_TIMEOUT = 120_000
const Event = Envelope.schema("bench.event", Schema.Struct({ n: Schema.Number }))
const encoder = new TextEncoder()
const utf8 = new TextDecoder()
const ack = encoder.encode("+ACK")

// The batched baseline's SQL (the per-message SQL and its transaction are in pgBaseline.ts).
const insertDedupBatch = `INSERT INTO jetworker_dedup (scope, id)
SELECT $1, id FROM unnest($2::text[]) AS t(id) ORDER BY id
ON CONFLICT (scope, id) DO NOTHING RETURNING id`
const insertEffectBatch = `INSERT INTO bench_effects (event_id, n) SELECT * FROM unnest($1::text[], $2::integer[])`

/** What a baseline decodes from the wire. */
interface Wire {
  readonly id: string
  readonly n: number
}

const decode = (m: JsMsg): Wire => {
  const parsed: unknown = JSON.parse(utf8.decode(m.data))
  const event = parsed as { readonly id?: unknown; readonly data?: { readonly n?: unknown } }
  if (typeof event.id !== "string" || typeof event.data?.n !== "number") throw new Error(`bad payload ${m.seq}`)
  return { id: event.id, n: event.data.n }
}

/** The same confirmed ack the engine sends: a request to the reply subject, answered by the server. */
const ackConfirmed = (nc: NatsClient, m: JsMsg): Promise<unknown> =>
  nc.request((m as unknown as { readonly reply: string }).reply, ack, { timeout: ACK_TIMEOUT })

/** One round of one side: its own stream (of `messages` events) and schema, both already set up. */
interface Round {
  readonly stream: string
  readonly schema: string
  readonly messages: number
}

/**
 * What a side reports, from opening the consumer to the last confirmed ack (`stopwatch.ts`): wall
 * seconds, CPU, event-loop utilization, socket writes to each server, garbage-collector figures.
 */
type Run = Stopwatch.Measured

/** Starts the clock; `stop()` (first call wins) fixes the {@link Run}, `result()` returns it. */
const stopwatch = () => {
  const stopped = Stopwatch.start()
  let run: Run | undefined
  return {
    stop: (): void => {
      if (run === undefined) run = stopped()
    },
    result: (): Run => {
      if (run === undefined) throw new Error("stopwatch read before it was stopped")
      return run
    }
  }
}

/** A one-shot broadcast: `wait()` resolves at the next `notify()` (or after `timeoutMillis`). */
class Signal {
  #waiters: Array<() => void> = []
  wait(timeoutMillis?: number): Promise<void> {
    return new Promise((resolve) => {
      if (timeoutMillis === undefined) {
        this.#waiters.push(resolve)
        return
      }
      const timer = setTimeout(resolve, timeoutMillis)
      this.#waiters.push(() => {
        clearTimeout(timer)
        resolve()
      })
    })
  }
  notify(): void {
    const waiters = this.#waiters
    this.#waiters = []
    for (const wake of waiters) wake()
  }
}

const withDeadline = <A>(promise: Promise<A>, what: string): Promise<A> => {
  let timer: NodeJS.Timeout | undefined
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done after ${ROUND_TIMEOUT} ms`)), ROUND_TIMEOUT)
  })
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer))
}

const pool = (round: Round, max: number): pg.Pool =>
  new pg.Pool({
    connectionString: databaseUrl,
    max,
    application_name: "jetworker-bench-baseline",
    options: `-c search_path=${round.schema}`
  })

/** Opens every connection of a pool before the clock starts. */
const warm = (p: pg.Pool, connections: number) =>
  Promise.all(Array.from({ length: connections }, () => p.query("SELECT pg_sleep(0.005)")))

/** Baseline 1: one transaction per message, `concurrency` at a time. */
const baselinePerMessage = async (round: Round): Promise<Run> => {
  const db = pool(round, concurrency)
  const nc = await connect({ servers, noAsyncTraces: true, name: "jetworker-bench-baseline" })
  try {
    await warm(db, concurrency)
    const handle = async (m: JsMsg) => {
      const event = decode(m)
      await commitByHand(db, CONSUMER, event.id, event.n)
      await ackConfirmed(nc, m)
    }
    const watch = stopwatch()
    const messages = await (await jetstream(nc).consumers.get(round.stream, CONSUMER)).consume({ max_messages: prefetch })
    await withDeadline(
      new Promise<void>((resolve, reject) => {
        let done = 0
        let inFlight = 0
        const slot = new Signal()
        const loop = async () => {
          for await (const m of messages) {
            while (inFlight >= concurrency) await slot.wait()
            inFlight++
            handle(m).then(() => {
              inFlight--
              slot.notify()
              if (++done === round.messages) {
                watch.stop()
                resolve()
              }
            }, reject)
          }
        }
        loop().catch(reject)
      }),
      "baseline per message"
    ).finally(() => messages.stop())
    return watch.result()
  } finally {
    await nc.close()
    await db.end()
  }
}

/** Baseline 2: batches of up to `batchSize` (or `maxWait`), `batchWorkers` transactions at a time. */
const baselineBatched = async (round: Round): Promise<Run> => {
  const db = pool(round, batchWorkers)
  const nc = await connect({ servers, noAsyncTraces: true, name: "jetworker-bench-baseline" })
  try {
    await warm(db, batchWorkers)
    const commitBatch = async (batch: ReadonlyArray<JsMsg>) => {
      const events = batch.map(decode)
      const ids = [...new Set(events.map((event) => event.id))]
      await transaction(db, async (client) => {
        const inserted = await client.query<{ readonly id: string }>(insertDedupBatch, [CONSUMER, ids])
        const fresh = new Set(inserted.rows.map((row) => row.id))
        const effects = events.filter((event) => fresh.delete(event.id)) // first copy of each new id
        if (effects.length > 0) {
          await client.query(insertEffectBatch, [effects.map((event) => event.id), effects.map((event) => event.n)])
        }
      })
      await Promise.all(batch.map((m) => ackConfirmed(nc, m)))
    }
    const watch = stopwatch()
    const messages = await (await jetstream(nc).consumers.get(round.stream, CONSUMER)).consume({
      max_messages: batchPrefetch
    })
    const queue: Array<JsMsg> = []
    let held = 0 // queued or in a transaction
    let done = 0
    let failure: unknown = undefined
    const arrived = new Signal() // a message was queued, or the run ended
    const full = new Signal() // a whole batch is queued, or the run ended
    const freed = new Signal() // a batch settled
    const finished = () => done === round.messages || failure !== undefined
    const stop = (error: unknown) => {
      failure ??= error
      arrived.notify()
      full.notify()
      freed.notify()
    }
    const collector = async () => {
      for await (const m of messages) {
        while (held >= batchCap && !finished()) await freed.wait()
        if (finished()) return
        queue.push(m)
        held++
        arrived.notify()
        if (queue.length >= batchSize) full.notify()
      }
    }
    const worker = async () => {
      while (!finished()) {
        if (queue.length === 0) {
          await arrived.wait()
          continue
        }
        if (queue.length < batchSize) await full.wait(maxWaitMillis)
        const batch = queue.splice(0, batchSize)
        if (batch.length === 0) continue
        await commitBatch(batch)
        held -= batch.length
        done += batch.length
        freed.notify()
        if (done === round.messages) {
          watch.stop()
          stop(undefined)
        }
      }
    }
    collector().catch(stop)
    await withDeadline(
      Promise.all(Array.from({ length: batchWorkers }, () => worker().catch(stop))),
      "baseline batched"
    ).finally(() => messages.stop())
    if (failure !== undefined) throw failure
    return watch.result()
  } finally {
    await nc.close()
    await db.end()
  }
}

type BenchConsumer = Consumer.Consumer<typeof Event.Type, SqlError | IdempotencyStore.IdempotencyError, SqlClient.SqlClient | IdempotencyStore.IdempotencyStore | NatsConnection.NatsConnection>

/**
 * jetworker per message: `Consumer.run` with `IdempotencyStore.commit` around the effect insert,
 * waited for or (`sent`) sent with the COMMIT (`PgPipelinedClient.send`).
 */
const perMessageConsumerWith = (sent: boolean) =>
(round: Round, onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<void>): BenchConsumer =>
  Consumer.make({
    name: CONSUMER,
    source: JetStreamSource.make({ stream: round.stream, consumer: CONSUMER }),
    schema: Event,
    handle: (event) =>
      IdempotencyStore.commit(
        event.id,
        SqlClient.SqlClient.use((sql) => {
          const insert = sql`INSERT INTO bench_effects (event_id, n) VALUES (${event.id}, ${event.data.n})`
          return sent ? PgPipelinedClient.send(insert) : insert
        })
      ),
    classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
    concurrency,
    prefetch,
    onOutcome
  })
const perMessageConsumer = perMessageConsumerWith(false)
const sentEffectConsumer = perMessageConsumerWith(true)

/**
 * jetworker per message in one statement: `PgIdempotencyStore.commitStatement` sends the dedup
 * row and the effect insert as one statement (one round trip instead of four).
 */
const oneStatementConsumer = (
  round: Round,
  onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<void>
): Consumer.Consumer<typeof Event.Type, IdempotencyStore.IdempotencyError, SqlClient.SqlClient | NatsConnection.NatsConnection> =>
  Consumer.make({
    name: CONSUMER,
    source: JetStreamSource.make({ stream: round.stream, consumer: CONSUMER }),
    schema: Event,
    handle: (event) =>
      SqlClient.SqlClient.use((sql) =>
        PgIdempotencyStore.commitStatement(
          { scope: CONSUMER, id: event.id },
          (fresh) => sql`INSERT INTO bench_effects (event_id, n) SELECT ${event.id}, ${event.data.n} WHERE ${fresh}`
        )
      ),
    classify: { IdempotencyError: "isRetryable" },
    concurrency,
    prefetch,
    onOutcome
  })

/**
 * jetworker batch mode, on the batched baseline's shape (batches of `batchSize` or what arrived
 * within `maxWaitMillis`, `batchWorkers` at once): `IdempotencyStore.commitAll` records the batch's
 * dedup rows in one statement and writes the new events' effects with the batched baseline's own
 * statement (`unnest` of two arrays). (A `sql.insert(rows)` of the rows instead is a new text, so
 * a new parse, for each batch size: measured at 0.75 of the batched baseline, against 0.97.)
 */
const batchedConsumer = (round: Round, onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<void>): BenchConsumer =>
  Consumer.makeBatch({
    name: CONSUMER,
    source: JetStreamSource.make({ stream: round.stream, consumer: CONSUMER }),
    schema: Event,
    batch: { maxSize: batchSize, maxWait: Duration.millis(maxWaitMillis) },
    handleBatch: (events) =>
      IdempotencyStore.commitAll(events.map((event) => event.id), (fresh) =>
        // The batched baseline's statement: one text whatever the batch's size (so it is prepared
        // once), the rows as two array parameters.
        SqlClient.SqlClient.use((sql) =>
          sql.unsafe(insertEffectBatch, [fresh.map((i) => events[i]!.id), fresh.map((i) => events[i]!.data.n)])
        )),
    classify: { SqlError: "isRetryable", IdempotencyError: "isRetryable" },
    concurrency: batchWorkers,
    prefetch: batchPrefetch,
    onOutcome
  })

/** A jetworker side: the consumer `make` builds, run until every message has its outcome. */
const jetworkerSide = <E extends { readonly _tag: string }>(
  label: string,
  make: (round: Round, onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<void>) => Consumer.Consumer<
    typeof Event.Type,
    E,
    SqlClient.SqlClient | IdempotencyStore.IdempotencyStore | NatsConnection.NatsConnection
  >,
  connections: number,
  pool: { readonly multiplex?: boolean; readonly multiplexConcurrency?: number; readonly pipelined?: boolean } = {}
) => (round: Round): Promise<Run> => {
  const program = Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* Effect.forEach(Array.from({ length: connections }), () => sql`SELECT pg_sleep(0.005)`, {
      concurrency: "unbounded",
      discard: true
    })
    const allDone = yield* Deferred.make<void>()
    const unexpected: Array<string> = []
    let done = 0
    const consumer = make(round, (outcome: Outcome.Outcome) =>
      Effect.suspend(() => {
        if (outcome._tag !== "Committed" || !outcome.confirmed || outcome.ackWithheld !== undefined) {
          unexpected.push(`${outcome._tag} seq ${outcome.message.sequence} confirmed ${outcome.confirmed}`)
        }
        if (++done !== round.messages) return Effect.void
        watch.stop()
        return Deferred.succeed(allDone, undefined)
      }))
    const watch = stopwatch()
    // The consumer is interrupted (a graceful drain) once the last outcome is in; a failing run wins the race.
    yield* Effect.raceFirst(Deferred.await(allDone), Consumer.run(consumer)).pipe(
      Effect.timeoutOrElse({
        duration: ROUND_TIMEOUT,
        orElse: () => Effect.fail(new Error(`${label}: ${done} of ${round.messages} outcomes after ${ROUND_TIMEOUT} ms`))
      })
    )
    if (unexpected.length > 0) {
      return yield* Effect.fail(new Error(`${label}: unexpected outcomes: ${unexpected.slice(0, 5).join("; ")}`))
    }
    return watch.result()
  })
  const { pipelined, ...multiplex } = pool
  const clientConfig = {
    url: Redacted.make(databaseUrl),
    maxConnections: connections,
    applicationName: "jetworker-bench",
    startupParameters: { search_path: round.schema }
  }
  const DatabaseLive = pipelined === true
    ? PgPipelinedClient.layer(clientConfig)
    : PgClient.layer({ ...clientConfig, ...multiplex })
  const Live = Layer.mergeAll(
    NatsConnection.layer({ servers, name: "jetworker-bench" }),
    Layer.merge(PgIdempotencyStore.layer(), PgAttemptStore.layer()).pipe(Layer.provideMerge(DatabaseLive))
  )
  return Effect.runPromise(
    program.pipe(
      Effect.provide(Live),
      Effect.provide(Logger.layer([Logger.consolePretty()])),
      Effect.provideService(References.MinimumLogLevel, "Error")
    )
  )
}

interface Side {
  readonly key: string
  readonly label: string
  readonly run: (round: Round) => Promise<Run>
  /** Messages per counted round. */
  readonly messages: number
}

const allSides: ReadonlyArray<Side> = [
  { key: "baseline", label: "baseline per message (nats.js + pg)", run: baselinePerMessage, messages: total },
  { key: "baseline-batched", label: "baseline batched (nats.js + pg)", run: baselineBatched, messages: batchedTotal },
  { key: "jetworker", label: "jetworker per message", run: jetworkerSide("jetworker per message", perMessageConsumer, concurrency, { pipelined: true }), messages: total },
  { key: "jetworker-pgclient", label: "jetworker per message, on PgClient", run: jetworkerSide("jetworker per message, on PgClient", perMessageConsumer, concurrency), messages: total },
  { key: "jetworker-sent", label: "jetworker per message, effect sent", run: jetworkerSide("jetworker per message, effect sent", sentEffectConsumer, concurrency, { pipelined: true }), messages: total },
  { key: "jetworker-statement", label: "jetworker per message, one statement", run: jetworkerSide("jetworker per message, one statement", oneStatementConsumer, statementConnections, { multiplex: true, multiplexConcurrency: Math.ceil(concurrency / statementConnections) }), messages: total },
  { key: "jetworker-batched", label: "jetworker batch mode", run: jetworkerSide("jetworker batch mode", batchedConsumer, batchWorkers), messages: batchedTotal }
]
const only = process.env.BENCH_SIDES?.split(",").map((key) => key.trim()).filter((key) => key !== "")
const sides = only === undefined ? allSides : allSides.filter((side) => only.includes(side.key))
if (sides.length === 0 || (only !== undefined && sides.length !== only.length)) {
  throw new Error(`BENCH_SIDES: expected some of ${allSides.map((side) => side.key).join(",")}, got ${process.env.BENCH_SIDES}`)
}

const countsWrites = SocketWrites.install(databaseUrl, servers)
const admin = new pg.Client({ connectionString: databaseUrl, application_name: "jetworker-bench-admin" })
await admin.connect()
const nc = await connect({ servers, noAsyncTraces: true, name: "jetworker-bench-admin" })
const js = jetstream(nc)
const jsm = await jetstreamManager(nc)

/** A stream of `messages` envelopes with distinct ids and its durable consumer. */
const fill = async (stream: string, messages: number) => {
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`] })
  await jsm.consumers.add(stream, Topology.consumerConfig({ stream, name: CONSUMER, ackWait: "30 seconds" }))
  const time = new Date().toISOString()
  await publishAll(messages, (n) =>
    js.publish(`${stream}.e`, encoder.encode(JSON.stringify({ id: `e${n}`, type: "bench.event", time, data: { n } }))))
}

/** Exactly once: one effect row and one dedup row per message, nothing left pending on the consumer. */
const verify = async (side: Side, round: Round) => {
  const effects = await admin.query<{ readonly rows: number; readonly ids: number }>(
    `SELECT count(*)::integer AS rows, count(DISTINCT event_id)::integer AS ids FROM "${round.schema}".bench_effects`
  )
  const dedup = await admin.query<{ readonly rows: number }>(
    `SELECT count(*)::integer AS rows FROM "${round.schema}".jetworker_dedup`
  )
  const info = await jsm.consumers.info(round.stream, CONSUMER)
  const found = {
    effectRows: effects.rows[0]?.rows,
    distinctEffectIds: effects.rows[0]?.ids,
    dedupRows: dedup.rows[0]?.rows,
    pending: info.num_pending,
    ackPending: info.num_ack_pending,
    redelivered: info.num_redelivered
  }
  const expected = {
    effectRows: round.messages,
    distinctEffectIds: round.messages,
    dedupRows: round.messages,
    pending: 0,
    ackPending: 0,
    redelivered: 0
  }
  if (JSON.stringify(found) !== JSON.stringify(expected)) {
    throw new Error(`${side.label}: exactly-once check failed: found ${JSON.stringify(found)}, expected ${JSON.stringify(expected)}`)
  }
}

const runRound = async (side: Side, name: string, messages: number): Promise<Run> => {
  const tag = `${side.key.replaceAll("-", "_")}_${name}_${randomBytes(4).toString("hex")}`
  const round: Round = { stream: `BENCH_IDEM_${tag}`.toUpperCase(), schema: `jw_bench_${tag}`, messages }
  await admin.query(`CREATE SCHEMA "${round.schema}"`)
  try {
    await admin.query(`SET search_path TO "${round.schema}"`)
    for (const statement of [...Migrations.statements, effectDdl]) await admin.query(statement)
    await admin.query("RESET search_path")
    await fill(round.stream, messages)
    try {
      const run = await profiled(`${side.key}-${name}`, () => side.run(round))
      await verify(side, round)
      return run
    } finally {
      await jsm.streams.delete(round.stream)
      // jetworker's source creates the dead-letter stream; a baseline never does.
      const deadLetters = DeadLetter.destination(round.stream, CONSUMER).stream
      if (await jsm.streams.info(deadLetters).then(() => true, () => false)) await jsm.streams.delete(deadLetters)
    }
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS "${round.schema}" CASCADE`)
  }
}

const stats = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  const median = sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
  return { median, min: sorted[0]!, max: sorted[sorted.length - 1]! }
}

const startedAt = new Date()
const loadBefore = os.loadavg()
const versions = {
  postgres: (await admin.query<{ readonly server_version: string }>("SHOW server_version")).rows[0]?.server_version ?? "?",
  nats: nc.info?.version ?? "?"
}
const parameters = `messages ${total} (batched sides ${batchedTotal}), concurrency ${concurrency}, prefetch ${prefetch}, batch size ${batchSize} ` +
  `(max wait ${maxWaitMillis} ms, ${batchWorkers} batch workers/connections, pull size ${batchPrefetch}, ` +
  `at most ${batchCap} messages held), rounds ${rounds} after a ${warmup}-message warm-up per side, confirmed acks`
console.log(parameters)

const runs = new Map<string, Array<Run>>(sides.map((side) => [side.key, []]))
try {
  // Not counted: brings every side's code paths through the JIT (a worker in production is warm).
  for (const side of sides) {
    const run = await runRound(side, "warmup", warmup)
    console.log(`warm-up: ${side.label.padEnd(36)} ${(warmup / run.seconds).toFixed(0).padStart(7)} msg/s (not counted)`)
  }
  for (let r = 0; r < rounds; r++) {
    // Rotate the order each round, so no side always runs first (cold) or last.
    const order = sides.map((_, i) => sides[(i + r) % sides.length]!)
    for (const side of order) {
      const run = await runRound(side, String(r), side.messages)
      runs.get(side.key)!.push(run)
      console.log(
        `round ${r + 1}: ${side.label.padEnd(36)} ${(side.messages / run.seconds).toFixed(0).padStart(7)} msg/s, ` +
          `node CPU ${(run.cpuSeconds * 1e6 / side.messages).toFixed(0)} µs/msg, event loop ${(run.loopBusy * 100).toFixed(0)}% busy` +
          (countsWrites
            ? `, writes per msg ${(run.writes.postgres / side.messages).toFixed(2)} to PostgreSQL and ${(run.writes.nats / side.messages).toFixed(2)} to NATS, ` +
              `${(run.writes.micros / side.messages).toFixed(0)} µs/msg in them`
            : "") +
          `, allocated ${(run.gc.allocated / side.messages / 1024).toFixed(1)} KB/msg, GC ${(run.gc.pauseMicros / side.messages).toFixed(1)} µs/msg`
      )
    }
  }
} finally {
  await nc.close()
  await admin.end()
}
const loadAfter = os.loadavg()

const messagesOf = (key: string) => sides.find((side) => side.key === key)!.messages
const rateOf = (key: string) => (run: Run) => messagesOf(key) / run.seconds
const summary = sides.map((side) => {
  const sideRuns = runs.get(side.key)!
  return {
    side,
    rates: sideRuns.map(rateOf(side.key)),
    ...stats(sideRuns.map(rateOf(side.key))),
    cpuMicros: stats(sideRuns.map((run) => run.cpuSeconds * 1e6 / side.messages)).median,
    loopBusy: stats(sideRuns.map((run) => run.loopBusy)).median,
    postgresWrites: stats(sideRuns.map((run) => run.writes.postgres / side.messages)).median,
    natsWrites: stats(sideRuns.map((run) => run.writes.nats / side.messages)).median,
    writeMicros: stats(sideRuns.map((run) => run.writes.micros / side.messages)).median,
    allocatedKb: stats(sideRuns.map((run) => run.gc.allocated / side.messages / 1024)).median,
    gcMicros: stats(sideRuns.map((run) => run.gc.pauseMicros / side.messages)).median
  }
})
const median = (key: string) => summary.find((row) => row.side.key === key)!.median
const perRound = (key: string, over: string) => {
  const under = runs.get(over)!
  return stats(runs.get(key)!.map((run, i) => rateOf(key)(run) / rateOf(over)(under[i]!)))
}
const ratios = [
  { label: "jetworker per message / baseline per message", key: "jetworker", over: "baseline" },
  { label: "jetworker per message on PgClient / baseline per message", key: "jetworker-pgclient", over: "baseline" },
  { label: "jetworker per message / the same on PgClient", key: "jetworker", over: "jetworker-pgclient" },
  { label: "jetworker per message, effect sent / baseline per message", key: "jetworker-sent", over: "baseline" },
  { label: "jetworker one statement / baseline per message", key: "jetworker-statement", over: "baseline" },
  { label: "baseline batched / baseline per message", key: "baseline-batched", over: "baseline" },
  { label: "baseline batched / jetworker per message", key: "baseline-batched", over: "jetworker" },
  { label: "jetworker batch mode / baseline batched", key: "jetworker-batched", over: "baseline-batched" },
  { label: "jetworker batch mode / jetworker per message", key: "jetworker-batched", over: "jetworker" }
]
  .filter((ratio) => runs.has(ratio.key) && runs.has(ratio.over))
  .map((ratio) => ({ ...ratio, ofMedians: median(ratio.key) / median(ratio.over), perRound: perRound(ratio.key, ratio.over) }))

const fixed = (value: number, digits = 0) => value.toFixed(digits)
console.log()
console.log(
  `${"side".padEnd(38)} ${"median".padStart(7)} ${"min".padStart(7)} ${"max".padStart(7)} msg/s  ` +
    `${"CPU µs/msg".padStart(10)} ${"loop busy".padStart(9)}` +
    (countsWrites ? `  ${"PG writes/msg".padStart(13)} ${"NATS writes/msg".padStart(15)} ${"in writes µs/msg".padStart(16)}` : "") +
    `  ${"alloc KB/msg".padStart(12)} ${"GC µs/msg".padStart(9)}`
)
for (const row of summary) {
  console.log(
    `${row.side.label.padEnd(38)} ${fixed(row.median).padStart(7)} ${fixed(row.min).padStart(7)} ${fixed(row.max).padStart(7)}        ` +
      `${fixed(row.cpuMicros).padStart(10)} ${`${fixed(row.loopBusy * 100)}%`.padStart(9)}` +
      (countsWrites
        ? `  ${fixed(row.postgresWrites, 2).padStart(13)} ${fixed(row.natsWrites, 2).padStart(15)} ${fixed(row.writeMicros).padStart(16)}`
        : "") +
      `  ${fixed(row.allocatedKb, 1).padStart(12)} ${fixed(row.gcMicros, 1).padStart(9)}`
  )
}
console.log()
for (const ratio of ratios) {
  console.log(
    `${ratio.label.padEnd(46)} ${fixed(ratio.ofMedians, 2)} (per round ${fixed(ratio.perRound.min, 2)}..${fixed(ratio.perRound.max, 2)})`
  )
}
console.log("every side, every round: effect rows = dedup rows = distinct ids = messages, nothing pending or redelivered")

const cpus = os.cpus()
const load = (values: ReadonlyArray<number>) => values.map((value) => fixed(value, 2)).join(" ")
const markdown = `# Idempotent commit path: jetworker vs hand-written baselines

Measured ${startedAt.toISOString()} by \`node bench/idempotent.ts ${total} ${concurrency} ${prefetch} ${batchSize} ${rounds} ${batchedTotal}\`.

- Machine: Node ${process.version}, ${os.availableParallelism()} CPUs (${cpus[0]?.model.trim() ?? "unknown model"}), ${os.platform()} ${os.arch()}, ${Math.round(os.totalmem() / 2 ** 30)} GiB RAM; load average ${load(loadBefore)} before, ${load(loadAfter)} after
- Servers on loopback, on the same machine (sharing its CPUs with the benchmark): nats-server ${versions.nats} (JetStream, file storage), PostgreSQL ${versions.postgres}
- Parameters: ${parameters}
- Per side and round: a fresh stream and schema; the clock runs from opening the consumer (pools warmed) to the last confirmed ack; the order of the sides rotates each round. CPU is this Node process's (all threads) over that span, per message; loop busy is its event loop utilization; writes are its socket writes to each server over that span, per message, and the time spent in them (each one a system call that, on loopback, also runs the receiving side's TCP path; \`bench/socketWrites.ts\`)${countsWrites ? "" : " (not counted on this Node version)"}; allocated is what V8 allocated in its young generation per message, and GC the collector's time on the main thread per message (\`bench/gcStats.ts\`).
- Checked after every round: effect rows = distinct effect ids = dedup rows = messages; consumer has nothing pending, unacked or redelivered; jetworker: every outcome \`Committed\`, ack confirmed.

| side | median msg/s | min | max | rounds | node CPU µs/msg | loop busy | writes/msg to PostgreSQL | to NATS | µs/msg in writes | allocated KB/msg | GC µs/msg |
|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|
${
  summary.map((row) =>
    `| ${row.side.label} | ${fixed(row.median)} | ${fixed(row.min)} | ${fixed(row.max)} | ${row.rates.map((rate) => fixed(rate)).join(", ")} | ${fixed(row.cpuMicros)} | ${fixed(row.loopBusy * 100)}% | ` +
    `${fixed(row.postgresWrites, 2)} | ${fixed(row.natsWrites, 2)} | ${fixed(row.writeMicros)} | ${fixed(row.allocatedKb, 1)} | ${fixed(row.gcMicros, 1)} |`
  ).join("\n")
}

| ratio | of medians | per round (min..max) |
|---|---:|---|
${ratios.map((ratio) => `| ${ratio.label} | ${fixed(ratio.ofMedians, 2)} | ${fixed(ratio.perRound.min, 2)}..${fixed(ratio.perRound.max, 2)} |`).join("\n")}
`
if (only === undefined && process.env.BENCH_SMOKE === undefined) {
  await mkdir(new URL("results/", import.meta.url), { recursive: true })
  await writeFile(new URL("results/idempotent.md", import.meta.url), markdown)
  await writeFile(
    new URL("results/idempotent.svg", import.meta.url),
    barChart(
      `Idempotent commit path, ${total} messages (batched ${batchedTotal}), concurrency ${concurrency} (median of ${rounds}, min..max)`,
      "msg/s",
      summary.map((row) => ({ label: row.side.label, value: row.median, min: row.min, max: row.max }))
    )
  )
  console.log("written bench/results/idempotent.md and bench/results/idempotent.svg")
} else {
  console.log("BENCH_SIDES or BENCH_SMOKE is set: bench/results/idempotent.md and .svg left as they were")
}

/**
 * The idempotent commit over the real PostgreSQL, without NATS: where between the driver, the store
 * and the engine the commit path loses against the hand-written `pg` loop. In the same run,
 * alternating rounds, `concurrency` transactions at once, each side on a pool of `concurrency`
 * connections:
 *
 * - the `pg` loop: `concurrency` async workers, each BEGIN / dedup INSERT ... ON CONFLICT DO
 *   NOTHING / effect INSERT / COMMIT per message (the statements of `bench/idempotent.ts`);
 * - the store alone: `concurrency` fibers in a loop, each `IdempotencyStore.commit` on
 *   `PgIdempotencyStore` with the same effect (what `@effect/sql-pg` and the store cost);
 * - the engine: `Consumer.run` over an in-memory source (no broker), the handler
 *   `IdempotencyStore.commit` with the same effect, `concurrency` handlers (what the engine adds);
 * - the store alone and the engine again, on `PgPipelinedClient` instead of `@effect/sql-pg`'s
 *   `PgClient` (a transaction's BEGIN sent with its dedup row: three round trips a commit);
 * - the store alone and the engine on `PgPipelinedClient` with the effect insert sent without
 *   waiting (`PgPipelinedClient.send`), so that it leaves with the COMMIT: two round trips a commit.
 *
 * Prints each side's rate and this process's CPU per message (medians of the rounds, min and max),
 * its writes to PostgreSQL per message and the time spent inside them (`socketWrites.ts`), the bytes
 * it allocated, had promoted to V8's old generation, allocated straight into its old space, and the collector's time, per message
 * (`gcStats.ts`), and the rate ratios. The machine's cores are shared with PostgreSQL, so a side's
 * CPU per message costs it rate. Every round checks that each key it committed has its dedup row
 * and one effect row (the engine's workers may commit a few more than `messages` before the run
 * ends; its clock stops at the `messages`-th outcome).
 *
 *   node bench/commit-postgres.ts [messages=10000] [concurrency=16] [rounds=5]
 *
 * DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test) selects the database; the run
 * works in a schema of its own, dropped at the end. BENCH_PG_DELAY_MS=n puts every side's
 * connections behind a loopback proxy that holds each chunk n ms each way (`delayProxy.ts`): a
 * database across a network, where the round trips a commit pays set its rate.
 */
import { PgClient } from "@effect/sql-pg"
import { IdempotencyStore } from "@jetworker/core"
import { Migrations, PgIdempotencyStore, PgPipelinedClient } from "@jetworker/sql-pg"
import { Context, Effect, Layer, Logger, Redacted, References } from "effect"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { randomBytes } from "node:crypto"
import pg from "pg"
import { fibersLoop, throughEngine } from "./commitSides.ts"
import { commitByHand, effectDdl } from "./pgBaseline.ts"
import * as DelayProxy from "./delayProxy.ts"
import * as SocketWrites from "./socketWrites.ts"
import * as Stopwatch from "./stopwatch.ts"

const total = Number(process.argv[2] ?? 10000)
const concurrency = Number(process.argv[3] ?? 16)
const rounds = Number(process.argv[4] ?? 5)
for (const value of [total, concurrency, rounds]) {
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`expected positive integers, got ${process.argv.slice(2).join(" ")}`)
}
const databaseUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const delayMillis = Number(process.env.BENCH_PG_DELAY_MS ?? 0)
if (!Number.isFinite(delayMillis) || delayMillis < 0) throw new Error(`BENCH_PG_DELAY_MS: expected a delay in ms, got ${process.env.BENCH_PG_DELAY_MS}`)
const target = new URL(databaseUrl)
const proxy = delayMillis > 0
  ? await DelayProxy.start({ host: target.hostname, port: Number(target.port || 5432) }, delayMillis)
  : undefined
/** Where the sides connect: the database, or the delaying proxy in front of it. */
const sidesUrl = (() => {
  if (proxy === undefined) return databaseUrl
  const url = new URL(databaseUrl)
  url.hostname = "127.0.0.1"
  url.port = String(proxy.port)
  return url.toString()
})()
const schema = `jw_bench_commit_${randomBytes(4).toString("hex")}`
const SCOPE = "bench"

/** Each run's keys start with a prefix of their own, so that every commit inserts its dedup row. */
let runs = 0
const nextPrefix = (side: string) => `${side}${runs++}-`

const baselinePool = new pg.Pool({ connectionString: sidesUrl, max: concurrency, options: `-c search_path=${schema}` })

/** The hand-written loop: `concurrency` async workers, each committing one message after the other. */
const pgLoop = async (prefix: string) => {
  let next = 0
  const worker = async () => {
    while (next < total) {
      const n = next++
      await commitByHand(baselinePool, SCOPE, `${prefix}${n}`, n)
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
}

/** The effect each commit protects: one statement. */
const effectOf = (id: string, n: number) => SqlClient.SqlClient.use((sql) => sql`INSERT INTO bench_effects (event_id, n) VALUES (${id}, ${n})`)

/** The same statement sent without waiting, to leave with the COMMIT. */
const sentEffectOf = (id: string, n: number) =>
  SqlClient.SqlClient.use((sql) => PgPipelinedClient.send(sql`INSERT INTO bench_effects (event_id, n) VALUES (${id}, ${n})`))

type EffectOf = (id: string, n: number) => Effect.Effect<unknown, SqlError, SqlClient.SqlClient>

const storeAloneWith = (effect: EffectOf) => (prefix: string) =>
  fibersLoop(total, concurrency, (n) => IdempotencyStore.commit(`${prefix}${n}`, effect(`${prefix}${n}`, n), { scope: SCOPE }))
const storeAlone = storeAloneWith(effectOf)

const engineWith = (effect: EffectOf) => (prefix: string) =>
  Effect.suspend(() => {
    let started = 0
    return throughEngine({
      name: `bench-${prefix}`,
      total,
      concurrency,
      // The payloads (and so their event ids) repeat: each run of the handler commits a key of its own.
      handle: (event) => {
        const id = `${prefix}${started++}`
        return IdempotencyStore.commit(id, effect(id, event.data.n), { scope: SCOPE })
      }
    })
  })
const engine = engineWith(effectOf)

type Figure = Stopwatch.PerMessage

type Services = IdempotencyStore.IdempotencyStore | SqlClient.SqlClient

/** One round of a side, then a check that each of its `total` keys committed once. */
const measured = (run: (prefix: string) => Effect.Effect<void, unknown, Services>, prefix: string, admin: pg.Client) =>
  Effect.gen(function*() {
    const stopped = Stopwatch.start()
    yield* run(prefix)
    const measuredRound = stopped()
    const { rows } = yield* Effect.promise(() =>
      admin.query<{ dedup: string; effects: string; total: string }>(
        `SELECT (SELECT count(*) FROM jetworker_dedup WHERE scope = $1 AND id LIKE $2) AS dedup,
                (SELECT count(DISTINCT event_id) FROM bench_effects WHERE event_id LIKE $2) AS effects,
                (SELECT count(*) FROM bench_effects WHERE event_id LIKE $2) AS total`,
        [SCOPE, `${prefix}%`]
      )
    )
    const counts = rows[0]!
    // The engine's workers may have started (and committed) a few more than `total` before the end.
    if (Number(counts.dedup) < total || counts.effects !== counts.dedup || counts.total !== counts.dedup) {
      return yield* Effect.die(new Error(`${prefix}: expected ${total} keys or more, each with its dedup row and one effect, found ${JSON.stringify(counts)}`))
    }
    return Stopwatch.perMessage(measuredRound, total)
  })

const clientConfig = {
  url: Redacted.make(sidesUrl),
  maxConnections: concurrency,
  applicationName: "jetworker-bench",
  startupParameters: { search_path: schema }
}

/** The store on `PgPipelinedClient`, built once (its pool opened before the clock starts). */
let pipelined: Context.Context<Services> | undefined
const onPipelined = (run: (prefix: string) => Effect.Effect<void, unknown, Services>) => (prefix: string) =>
  Effect.provideContext(run(prefix), pipelined!)

const sides: ReadonlyArray<{ readonly label: string; readonly key: string; readonly run: (prefix: string) => Effect.Effect<void, unknown, Services> }> = [
  { label: "pg loop (hand-written)", key: "p", run: (prefix) => Effect.promise(() => pgLoop(prefix)) },
  { label: "store alone (loop of fibers)", key: "s", run: storeAlone },
  { label: "engine, handler IdempotencyStore.commit", key: "e", run: engine },
  { label: "store alone, PgPipelinedClient", key: "sp", run: onPipelined(storeAlone) },
  { label: "engine, PgPipelinedClient", key: "ep", run: onPipelined(engine) },
  { label: "store alone, PgPipelinedClient, sent", key: "ss", run: onPipelined(storeAloneWith(sentEffectOf)) },
  { label: "engine, PgPipelinedClient, sent", key: "es", run: onPipelined(engineWith(sentEffectOf)) }
]

const program = (admin: pg.Client) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    pipelined = yield* Layer.build(PgIdempotencyStore.layer().pipe(Layer.provideMerge(PgPipelinedClient.layer(clientConfig))))
    const pipelinedSql = Context.get(pipelined, SqlClient.SqlClient)
    // Every connection of the pools open before the clock starts.
    for (const client of [sql, pipelinedSql]) {
      yield* Effect.forEach(Array.from({ length: concurrency }), () => client`SELECT pg_sleep(0.005)`, { concurrency: "unbounded", discard: true })
    }
    yield* Effect.promise(() => Promise.all(Array.from({ length: concurrency }, () => baselinePool.query("SELECT pg_sleep(0.005)"))))
    for (const side of sides) yield* measured(side.run, nextPrefix(side.key), admin) // warm-up
    const figures: Array<Array<Figure>> = sides.map(() => [])
    for (let round = 0; round < rounds; round++) {
      for (const [i, side] of sides.entries()) figures[i]!.push(yield* measured(side.run, nextPrefix(side.key), admin))
    }
    return figures
  }).pipe(
    Effect.scoped,
    Effect.provide(PgIdempotencyStore.layer().pipe(Layer.provideMerge(PgClient.layer(clientConfig)))),
    Effect.provide(Logger.layer([Logger.consolePretty()])),
    Effect.provideService(References.MinimumLogLevel, "Error")
  )

const countsWrites = SocketWrites.install(sidesUrl, process.env.NATS_URL ?? "nats://127.0.0.1:4222")
const admin = new pg.Client({ connectionString: databaseUrl, application_name: "jetworker-bench-admin" })
await admin.connect()
await admin.query(`CREATE SCHEMA "${schema}"`)
try {
  await admin.query(`SET search_path TO "${schema}"`)
  for (const statement of [...Migrations.statements, effectDdl]) {
    await admin.query(statement)
  }
  const figures = await Effect.runPromise(program(admin))
  const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
  const range = (values: ReadonlyArray<number>) =>
    `${median(values).toFixed(0).padStart(6)} ${Math.min(...values).toFixed(0).padStart(6)} ${Math.max(...values).toFixed(0).padStart(6)}`
  console.log(
    `messages ${total} a round, concurrency ${concurrency}, ${rounds} rounds, PostgreSQL without NATS` +
      (proxy === undefined ? "" : `, through a proxy delaying each chunk ${delayMillis} ms each way`)
  )
  console.log(
    `${"side".padEnd(42)} msg/s: median    min    max  CPU µs/msg: median    min    max` +
      (countsWrites ? "  writes/msg  in writes µs/msg: median" : "") + "  allocated KB/msg  promoted KB/msg  tenured KB/msg  GC µs/msg"
  )
  for (const [i, side] of sides.entries()) {
    const values = figures[i]!
    console.log(
      `${side.label.padEnd(42)} ${range(values.map((f) => f.rate))}              ${range(values.map((f) => f.cpuMicros))}` +
        (countsWrites
          ? `  ${median(values.map((f) => f.writesPostgres)).toFixed(2).padStart(10)}  ${median(values.map((f) => f.inWritesMicros)).toFixed(0).padStart(23)}`
          : "") +
        `  ${(median(values.map((f) => f.allocatedBytes)) / 1024).toFixed(1).padStart(16)}  ${(median(values.map((f) => f.promotedBytes)) / 1024).toFixed(2).padStart(15)}` +
        `  ${(median(values.map((f) => f.tenuredBytes)) / 1024).toFixed(2).padStart(14)}` +
        `  ${median(values.map((f) => f.gcMicros)).toFixed(1).padStart(9)}`
    )
  }
  const rate = (i: number) => median(figures[i]!.map((f) => f.rate))
  console.log(
    `rate ratios: store alone / pg loop ${(rate(1) / rate(0)).toFixed(2)}, engine / pg loop ${(rate(2) / rate(0)).toFixed(2)}, ` +
      `engine / store alone ${(rate(2) / rate(1)).toFixed(2)}`
  )
  console.log(
    `on PgPipelinedClient: store alone / pg loop ${(rate(3) / rate(0)).toFixed(2)}, engine / pg loop ${(rate(4) / rate(0)).toFixed(2)}, ` +
      `store alone / store alone on PgClient ${(rate(3) / rate(1)).toFixed(2)}, engine / engine on PgClient ${(rate(4) / rate(2)).toFixed(2)}`
  )
  console.log(
    `the effect sent with the COMMIT: store alone / pg loop ${(rate(5) / rate(0)).toFixed(2)}, engine / pg loop ${(rate(6) / rate(0)).toFixed(2)}, ` +
      `store alone / store alone waiting for it ${(rate(5) / rate(3)).toFixed(2)}, engine / engine waiting for it ${(rate(6) / rate(4)).toFixed(2)}`
  )
} finally {
  await baselinePool.end()
  await proxy?.close()
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
  await admin.end()
}

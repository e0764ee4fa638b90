/**
 * The CPU of the idempotent commit path without I/O: `PgIdempotencyStore.commit` (the dedup row,
 * one effect statement, `BEGIN` and `COMMIT` through `@effect/sql`) over a SQL connection that
 * answers every statement on the next macrotask, so that no socket write, PostgreSQL or other
 * process shares the figure. In the same run, alternating rounds:
 *
 * - the store alone: `concurrency` fibers in a loop, each committing one event after the other
 *   (the baseline: what `@effect/sql` and the store cost; outside a delivery, so with no report
 *   to register for after the `COMMIT`);
 * - the engine: `Consumer.run` over an in-memory source, the handler `IdempotencyStore.commit`
 *   with the same effect, `concurrency` handlers;
 * - the engine with a handler that does nothing (what the engine costs alone with this source).
 *
 * Prints each side's CPU time per message (user + system, median of the rounds, min and max) and
 * the engine's ratio to the store alone, then the steps of the Effect runtime each side takes
 * per message (`fiberSteps.ts`, one more run of each), which move with the code only. The
 * connection is a stand-in: it checks nothing and stores nothing, so no figure here says anything
 * about correctness (the tests against the real PostgreSQL do).
 *
 *   node bench/commit-in-memory.ts [messages=20000] [concurrency=16] [rounds=5]
 */
import { IdempotencyStore } from "@jetworker/core"
import { PgIdempotencyStore } from "@jetworker/sql-pg"
import { Effect, Layer, Logger, References } from "effect"
import * as Reactivity from "effect/reactivity/Reactivity"
import { SqlClient, Statement } from "effect/sql"
import type { Connection } from "effect/sql/SqlConnection"
import { fibersLoop, throughEngine } from "./commitSides.ts"
import { counted } from "./fiberSteps.ts"

const total = Number(process.argv[2] ?? 20000)
const concurrency = Number(process.argv[3] ?? 16)
const rounds = Number(process.argv[4] ?? 5)
for (const value of [total, concurrency, rounds]) {
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`expected positive integers, got ${process.argv.slice(2).join(" ")}`)
}

/** Answers on the next macrotask, as a socket read would. */
const later = <A>(value: A) =>
  Effect.callback<A>((resume) => {
    setImmediate(() => resume(Effect.succeed(value)))
  })
const inserted: ReadonlyArray<{ readonly inserted: boolean }> = [{ inserted: true }]
const noRows: ReadonlyArray<never> = []
const connection: Connection = {
  // The dedup row's insert reports a new row; every other statement returns none.
  execute: (sql) => later(sql.includes("ON CONFLICT (scope, id) DO NOTHING") ? inserted : noRows),
  executeRaw: () => later({ command: "COMMIT" }),
  executeStream: () => {
    throw new Error("no streams here")
  },
  executeValues: () => later(noRows),
  executeValuesUnprepared: () => later(noRows),
  executeUnprepared: () => later(noRows)
}
const SqlLive = Layer.effect(
  SqlClient.SqlClient,
  SqlClient.make({
    acquirer: Effect.succeed(connection),
    transactionAcquirer: Effect.succeed(connection),
    compiler: Statement.makeCompilerSqlite(),
    driver: "in-memory",
    spanAttributes: [["db.system.name", "postgresql"]],
    prepareTransactionControls: true
  })
).pipe(Layer.provide(Reactivity.layer))

let run = 0

/** The effect each commit protects: one statement. */
const effectOf = (n: number) => SqlClient.SqlClient.use((sql) => Effect.asVoid(sql.unsafe("INSERT INTO bench_effects (n) VALUES ($1)", [n])))

const storeAlone = Effect.suspend(() => {
  const prefix = `r${run++}-`
  return fibersLoop(total, concurrency, (n) => IdempotencyStore.commit(`${prefix}${n}`, effectOf(n), { scope: "bench" }))
})

const engine = (commit: boolean) =>
  Effect.suspend(() => {
    let committed = 0
    return throughEngine({
      name: `bench-${run++}`,
      total,
      concurrency,
      // The payloads (and so their event ids) repeat: each run of the handler commits a key of its own.
      handle: (event) => commit ? IdempotencyStore.commit(`${++committed}`, effectOf(event.data.n)) : Effect.void
    })
  })

/** CPU microseconds per message of one run of `effect`. */
const cpuPerMessage = <E, R>(effect: Effect.Effect<void, E, R>) =>
  Effect.suspend(() => {
    const before = process.cpuUsage()
    return Effect.map(effect, () => {
      const used = process.cpuUsage(before)
      return (used.user + used.system) / total
    })
  })

const sides: ReadonlyArray<{
  readonly label: string
  readonly run: Effect.Effect<void, unknown, IdempotencyStore.IdempotencyStore | SqlClient.SqlClient>
}> = [
  { label: "store alone (loop of fibers)", run: storeAlone },
  { label: "engine, handler IdempotencyStore.commit", run: engine(true) },
  { label: "engine, handler that does nothing", run: engine(false) }
]

const program = Effect.gen(function*() {
  for (const side of sides) yield* side.run // warm-up
  const figures: Array<Array<number>> = sides.map(() => [])
  for (let round = 0; round < rounds; round++) {
    for (const [i, side] of sides.entries()) figures[i]!.push(yield* cpuPerMessage(side.run))
  }
  const steps: Array<number> = []
  for (const side of sides) steps.push((yield* counted(side.run))[1] / total)
  return { figures, steps }
}).pipe(
  Effect.provide(PgIdempotencyStore.layer().pipe(Layer.provideMerge(SqlLive))),
  Effect.provide(Logger.layer([Logger.consolePretty()])),
  Effect.provideService(References.MinimumLogLevel, "Error")
)

const { figures, steps } = await Effect.runPromise(program)
const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
console.log(`messages ${total} a round, concurrency ${concurrency}, ${rounds} rounds, SQL connection answering on the next macrotask`)
console.log(`${"side".padEnd(42)} CPU µs/msg: median    min    max`)
for (const [i, side] of sides.entries()) {
  const values = figures[i]!
  console.log(
    `${side.label.padEnd(42)} ${median(values).toFixed(1).padStart(17)} ${Math.min(...values).toFixed(1).padStart(6)} ${Math.max(...values).toFixed(1).padStart(6)}`
  )
}
console.log(`engine with the commit / store alone: ${(median(figures[1]!) / median(figures[0]!)).toFixed(2)}`)
console.log(`steps of the Effect runtime per message: ${sides.map((side, i) => `${side.label} ${steps[i]!.toFixed(1)}`).join(", ")}`)

/**
 * Shared pieces of the sql-pg tests: a throw-away schema (with the migrations applied and a
 * `ledger` table standing for the business effect), an `Observer` client whose statements never
 * join the store's transaction, and bounded polls on what PostgreSQL reports.
 */
import { Context, Duration, Effect, Layer, Option } from "effect"
import { type Migrator, SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import * as Eventually from "../../testing/src/Eventually.ts"
import * as TestDatabase from "../../testing/src/TestDatabase.ts"
import * as Migrations from "../src/Migrations.ts"
import * as PgPipelinedClient from "../src/PgPipelinedClient.ts"

/** A second client on the test schema: sees only committed data, never joins a transaction of the first. */
export class Observer extends Context.Service<Observer, SqlClient.SqlClient>()("test/sql-pg/Observer") {}

/** The {@link Observer}: its own small pool on the current test schema. */
export const observerLayer: Layer.Layer<Observer, SqlError, TestDatabase.TestSchema> = Layer.effect(
  Observer,
  SqlClient.SqlClient.useSync((sql) => sql)
).pipe(Layer.provide(TestDatabase.client({ maxConnections: 2 })))

const ledgerLayer = Layer.effectDiscard(
  SqlClient.SqlClient.use((sql) => sql`CREATE TABLE ledger (id serial PRIMARY KEY, note text NOT NULL)`)
)

/** The clients the store's tests run on: `@effect/sql-pg`'s and the pipelined one. */
export type ClientKind = "PgClient" | "PgPipelinedClient"

export const clientKinds: ReadonlyArray<ClientKind> = ["PgClient", "PgPipelinedClient"]

/** A {@link PgPipelinedClient} on the current test schema. */
export const pipelinedClient = (
  options?: PgPipelinedClient.Options
): Layer.Layer<SqlClient.SqlClient, SqlError, TestDatabase.TestSchema> =>
  Layer.unwrap(TestDatabase.TestSchema.useSync((test) =>
    PgPipelinedClient.layer({
      applicationName: "jetworker-test",
      ...options,
      url: test.url,
      startupParameters: { ...options?.startupParameters, search_path: test.name }
    })
  ))

/** A migrated throw-away schema with a `ledger` table, its client (of `kind`), and an {@link Observer}. */
export const database = (kind: ClientKind = "PgClient"): Layer.Layer<
  SqlClient.SqlClient | TestDatabase.TestSchema | Observer,
  SqlError | Migrator.MigrationError
> =>
  Layer.mergeAll(Migrations.layer, ledgerLayer, observerLayer).pipe(
    Layer.provideMerge(
      kind === "PgClient"
        ? TestDatabase.layer({ maxConnections: 6 })
        : pipelinedClient({ maxConnections: 6 }).pipe(Layer.provideMerge(TestDatabase.schema()))
    )
  )

/** The business effect of the tests: one ledger row, written through the current transaction. */
export const record = (note: string): Effect.Effect<void, SqlError, SqlClient.SqlClient> =>
  SqlClient.SqlClient.use((sql) => Effect.asVoid(sql`INSERT INTO ledger (note) VALUES (${note})`))

/** Committed ledger rows with `note`, as another connection sees them. */
export const ledgerRows = (note: string): Effect.Effect<number, SqlError, Observer> =>
  Observer.use((sql) =>
    Effect.map(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM ledger WHERE note = ${note}`, (rows) =>
      rows[0]?.n ?? 0)
  )

/** Committed dedup rows for the key, as another connection sees them. */
export const dedupRows = (key: { readonly scope: string; readonly id: string }): Effect.Effect<number, SqlError, Observer> =>
  Observer.use((sql) =>
    Effect.map(
      sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM jetworker_dedup WHERE scope = ${key.scope} AND id = ${key.id}`,
      (rows) => rows[0]?.n ?? 0
    )
  )

/** The backend pid of the connection running the current statement (inside a transaction: its connection). */
export const backendPid: Effect.Effect<number, SqlError, SqlClient.SqlClient> = SqlClient.SqlClient.use((sql) =>
  Effect.map(sql<{ readonly pid: number }>`SELECT pg_backend_pid() AS pid`, (rows) => rows[0]!.pid)
)

/** Repeats `check` every 10 ms until it yields a value; dies when `within` passes first. */
export const pollUntil = <A, E, R>(
  what: string,
  check: Effect.Effect<Option.Option<A>, E, R>,
  within: Duration.Input = "5 seconds"
): Effect.Effect<A, E, R> =>
  Eventually.poll(what, check, Option.isSome, { timeout: within, interval: "10 millis" }).pipe(
    Effect.map((found) => (found as Option.Some<A>).value),
    Effect.catchIf(
      (error): error is Eventually.WaitTimeout => error instanceof Eventually.WaitTimeout,
      (timeout) => Effect.die(new Error(timeout.message))
    )
  )

/** A backend PostgreSQL reports as waiting on a lock held by `blocker`. */
export interface LockWaiter {
  readonly pid: number
  readonly waitEvent: string
  readonly query: string
  /** `active` once the status row shows the statement that waits (see {@link awaitLockWaiters}). */
  readonly state: string
}

/** The backends waiting (`wait_event_type = 'Lock'`) on a lock held by backend `blocker`, now. */
export const lockWaiters = (blocker: number): Effect.Effect<ReadonlyArray<LockWaiter>, SqlError, Observer> =>
  Observer.use((sql) =>
    sql<LockWaiter>`SELECT pid, wait_event AS "waitEvent", query, state FROM pg_stat_activity
      WHERE wait_event_type = 'Lock' AND ${blocker}::int = ANY(pg_blocking_pids(pid)) ORDER BY pid`
  )

/** Waits (bounded) until `count` backends wait on a lock held by `blocker`; returns them. */
export const awaitLockWaiters = (
  blocker: number,
  count = 1
): Effect.Effect<ReadonlyArray<LockWaiter>, SqlError, Observer> =>
  pollUntil(
    `${count} backend(s) blocked by ${blocker}`,
    Effect.map(lockWaiters(blocker), (rows) => {
      // PostgreSQL reads a backend's wait event live but its state and query from a copy taken
      // when the observing statement began: a backend that began waiting in between still shows
      // its previous statement (say `ROLLBACK`, idle). Only rows showing the waiting statement count.
      const current = rows.filter((row) => row.state === "active")
      return current.length >= count ? Option.some(current) : Option.none()
    })
  )

/** Waits (bounded) until no backend waits on a lock held by `blocker`. */
export const awaitNoLockWaiters = (blocker: number): Effect.Effect<void, SqlError, Observer> =>
  pollUntil(
    `no backend blocked by ${blocker}`,
    Effect.map(lockWaiters(blocker), (rows) => rows.length === 0 ? Option.some(undefined) : Option.none())
  )

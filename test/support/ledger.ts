/**
 * Helpers for tests of the reference ledger: settings pointing the worker at a throw-away stream,
 * transfer payloads, and the checks every exactly-once test makes.
 */
import { NatsConnection } from "@jetworker/nats"
import { DateTime, Duration, Effect, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import { TestStream } from "@jetworker/testing"
import { openAccount } from "../../examples/ledger/src/Ledger.ts"
import * as LedgerWorker from "../../examples/ledger/src/LedgerWorker.ts"
import { toJson } from "../../examples/ledger/src/TransferEvent.ts"

export { openAccount, totalBalance, transferCount } from "../../examples/ledger/src/Ledger.ts"

/**
 * Where test workers' applied events go: one stream shared by every test (events are told apart
 * by their transfer ids, unique per test), so that no test leaves a stream of its own behind.
 */
export const testApplied = { appliedStream: "LEDGER_APPLIED_TEST", appliedSubjectPrefix: "test.ledger.applied" } as const

/** Worker settings for `stream` (its subjects, its consumer), with a short lease so redelivery is quick. */
export const settingsFor = (
  stream: Pick<TestStream.TestStream, "stream" | "subjectPrefix" | "consumer">,
  overrides: Partial<LedgerWorker.Settings> = {}
): LedgerWorker.Settings => ({
  stream: stream.stream,
  subjectPrefix: stream.subjectPrefix,
  consumer: stream.consumer,
  ackWait: Duration.seconds(5),
  concurrency: 4,
  ordering: "per-account",
  batchSize: 0,
  batchWait: Duration.millis(20),
  attempts: 5,
  retryBase: Duration.millis(50),
  inProcessRetries: 2,
  pauseOnDependencies: true,
  replicas: 1,
  ...testApplied,
  ...overrides
})

/**
 * A throw-away stream with the worker's settings for it (lease 2 seconds unless overridden),
 * declared on the server as the worker declares it.
 */
export const ledgerStream = Effect.fnUntraced(function*(overrides: Partial<LedgerWorker.Settings> = {}) {
  const ackWait = overrides.ackWait ?? Duration.seconds(2)
  const stream = yield* TestStream.make({ ackWait })
  const settings = settingsFor(stream, { ...overrides, ackWait })
  yield* LedgerWorker.setup(settings)
  return { stream, settings }
})

/** Two fresh EUR accounts `<p>.a` (100.00) and `<p>.b` (0), `p` a unique prefix for `label`. */
export const twoAccounts = Effect.fnUntraced(function*(label: string) {
  const p = uniquePrefix(label)
  const [a, b] = [`${p}.a`, `${p}.b`]
  yield* openAccount(a, "EUR", 100_00)
  yield* openAccount(b, "EUR", 0)
  return { p, a, b }
})

/** The environment a child-process ledger worker needs to run against `settings` and `schema`. */
export const workerEnv = (settings: LedgerWorker.Settings, schema: string, databaseUrl: string, natsUrl: string) => ({
  NATS_URL: natsUrl,
  DATABASE_URL: databaseUrl,
  DATABASE_SCHEMA: schema,
  LEDGER_STREAM: settings.stream,
  LEDGER_SUBJECT_PREFIX: settings.subjectPrefix,
  LEDGER_CONSUMER: settings.consumer,
  LEDGER_ACK_WAIT: `${Duration.toMillis(settings.ackWait)} millis`,
  LEDGER_CONCURRENCY: String(settings.concurrency),
  LEDGER_ORDERING: settings.ordering,
  LEDGER_BATCH_SIZE: String(settings.batchSize),
  LEDGER_BATCH_WAIT: `${Duration.toMillis(settings.batchWait)} millis`,
  LEDGER_ATTEMPTS: String(settings.attempts),
  LEDGER_RETRY_BASE: `${Duration.toMillis(settings.retryBase)} millis`,
  LEDGER_IN_PROCESS_RETRIES: String(settings.inProcessRetries),
  LEDGER_PAUSE_ON_DEPENDENCIES: String(settings.pauseOnDependencies),
  LEDGER_APPLIED_STREAM: settings.appliedStream,
  LEDGER_APPLIED_SUBJECT_PREFIX: settings.appliedSubjectPrefix,
  LEDGER_REPLICAS: String(settings.replicas),
  // A free loopback port per child, so parallel tests never collide on the health server.
  HEALTH_PORT: "0",
  HEALTH_HOST: "127.0.0.1"
})

/** A transfer's JSON, created now, in EUR. */
export const transfer = (
  id: string,
  from: string,
  to: string,
  amount: number,
  options: { readonly expiresAt?: DateTime.Utc; readonly currency?: string } = {}
): string =>
  toJson({
    id,
    from,
    to,
    amount,
    currency: options.currency ?? "EUR",
    createdAt: DateTime.makeUnsafe(Date.now()),
    ...(options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt })
  })

/** A unique prefix for account and transfer ids of one test. */
export const uniquePrefix = (label: string): string => `${label}-${crypto.randomUUID().slice(0, 8)}`

/** How many times each transfer id appears in `transfers` (ids absent from the table are omitted). */
export const transferCounts = Effect.fnUntraced(function*(ids: ReadonlyArray<string>) {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ readonly id: string; readonly n: number }>`
    SELECT id, count(*)::int AS n FROM transfers WHERE id IN ${sql.in(ids)} GROUP BY id`
  return new Map(rows.map((row) => [row.id, row.n]))
})

/** Whether the dedup row of (`scope`, `id`) is committed (read from another transaction). */
export const dedupRowExists = Effect.fnUntraced(function*(scope: string, id: string) {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ readonly n: number }>`
    SELECT count(*)::int AS n FROM jetworker_dedup WHERE scope = ${scope} AND id = ${id}`
  return (rows[0]?.n ?? 0) > 0
})

/** The balance of each of `ids` (as bigints), read on the current client. */
export const balances = Effect.fnUntraced(function*(ids: ReadonlyArray<string>) {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ readonly id: string; readonly balance: string }>`
    SELECT id, balance::text AS balance FROM accounts WHERE id IN ${sql.in(ids)}`
  return Object.fromEntries(rows.map((row) => [row.id, BigInt(row.balance)]))
})

/**
 * How many copies of each applied event under transfer-id prefix `p` the applied stream holds,
 * by subject (`<applied prefix>.<p>.<rest of the id>`).
 */
export const appliedCopies = Effect.fnUntraced(function*(settings: LedgerWorker.Settings, p: string) {
  const { manager } = yield* NatsConnection.NatsConnection
  // Retried: on a cluster the API times out while a new leader is elected.
  const info = yield* Effect.tryPromise(() =>
    manager.streams.info(settings.appliedStream, { subjects_filter: `${LedgerWorker.appliedSubject(settings, p)}.>` })
  ).pipe(Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 40 }))
  return new Map(Object.entries(info.state.subjects ?? {}))
})

/** The balance each of `accounts` (all opened with `opening`) has once every one of `transfers` is applied once. */
export const expectedBalances = (
  accounts: ReadonlyArray<string>,
  opening: bigint,
  transfers: ReadonlyArray<{ readonly from: string; readonly to: string; readonly amount: number }>
): Record<string, bigint> => {
  const expected: Record<string, bigint> = Object.fromEntries(accounts.map((account) => [account, opening]))
  for (const t of transfers) {
    expected[t.from] = expected[t.from]! - BigInt(t.amount)
    expected[t.to] = expected[t.to]! + BigInt(t.amount)
  }
  return expected
}

/**
 * `count` transfers between `accounts` drawn from `random` (a seeded generator): each from one
 * account to another, of 1 to 100 minor units, with ids `<prefix>.t<i>`.
 */
export const randomTransfers = (random: () => number, accounts: ReadonlyArray<string>, prefix: string, count: number) =>
  Array.from({ length: count }, (_, i) => {
    const from = accounts[Math.floor(random() * accounts.length)]!
    let to = accounts[Math.floor(random() * accounts.length)]!
    if (to === from) to = accounts[(accounts.indexOf(from) + 1) % accounts.length]!
    return { id: `${prefix}.t${i}`, from, to, amount: 1 + Math.floor(random() * 100) }
  })

/** A worker's shutdown budget for chaos tests: short, so that a stopped worker is gone in a few seconds. */
export const quickShutdown = {
  SHUTDOWN_BUDGET: "5 seconds",
  SHUTDOWN_READINESS_GRACE: "0 millis",
  SHUTDOWN_CLOSE: "1 second",
  SHUTDOWN_TELEMETRY: "500 millis",
  SHUTDOWN_RESERVE: "500 millis"
} as const

/** A chaos test's seed: `JW_CHAOS_SEED` replays a schedule, else one from the clock. */
export const chaosSeed = (): number => Number(process.env.JW_CHAOS_SEED ?? Date.now() % 1_000_000)

/** The ledger one transfer per transaction, and in batch mode (batches of up to 8, two at a time per worker). */
export const chaosModes = [
  { label: "one transfer per transaction", overrides: { concurrency: 4 } },
  { label: "in batch mode", overrides: { concurrency: 2, batchSize: 8, batchWait: Duration.millis(20) } }
] as const

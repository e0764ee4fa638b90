/**
 * The reference worker: consumer `ledger-applier` on stream `LEDGER` (subjects
 * `ledger.transfer.>`) applies each transfer exactly once, in one PostgreSQL transaction with its
 * dedup row. Everything is configured from the environment (see {@link Settings}); the stream,
 * consumer and tables are declared on start (this service owns its consumer).
 */
import { PgClient } from "@effect/sql-pg"
import { Consumer, IdempotencyStore, Lifecycle, type Outcome, Retry } from "@jetworker/core"
import { JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { Migrations, PgAttemptStore, PgIdempotencyStore } from "@jetworker/sql-pg"
import { Config, Duration, Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { applyTransfer, lockAccounts } from "./Ledger.ts"
import * as LedgerMigrations from "./LedgerMigrations.ts"
import * as RiskCheck from "./RiskCheck.ts"
import { metadata, TransferEvent } from "./TransferEvent.ts"

/** The worker's settings. */
export interface Settings {
  /** `LEDGER_STREAM`, default `LEDGER`. */
  readonly stream: string
  /** `LEDGER_SUBJECT_PREFIX`, default `ledger.transfer`; the stream captures `<prefix>.>`. */
  readonly subjectPrefix: string
  /** `LEDGER_CONSUMER`, default `ledger-applier`. */
  readonly consumer: string
  /** `LEDGER_ACK_WAIT`, default `30 seconds`: the lease on each delivery. */
  readonly ackWait: Duration.Duration
  /** `LEDGER_CONCURRENCY`, default 8. */
  readonly concurrency: number
  /**
   * `LEDGER_ORDERING`, default `per-account`: transfers from one account apply one at a time, in
   * the order received, so its overdraft checks see the debits before them (different accounts in
   * parallel); `unordered` applies any transfer at any time.
   */
  readonly ordering: "per-account" | "unordered"
  /**
   * `LEDGER_BATCH_SIZE`, default 0 (off): above 0, the batch mode applies up to this many
   * transfers in one transaction (each with its own outcome and ack; unordered; `LEDGER_CONCURRENCY`
   * then counts batches running at once).
   */
  readonly batchSize: number
  /** `LEDGER_BATCH_WAIT`, default `20 millis`: how long a batch waits to fill after its first transfer. */
  readonly batchWait: Duration.Duration
  /** `LEDGER_ATTEMPTS`, default 5: deliveries before a transient failure is dead-lettered. */
  readonly attempts: number
  /** `LEDGER_RETRY_BASE`, default `200 millis`: first retry delay (doubling, jittered, capped at 30 s). */
  readonly retryBase: Duration.Duration
  /** `LEDGER_IN_PROCESS_RETRIES`, default 2: quick retries inside one attempt before a nak. */
  readonly inProcessRetries: number
}

/** Reads {@link Settings} from the environment. */
export const settings = Config.all({
  stream: Config.String("LEDGER_STREAM").pipe(Config.withDefault("LEDGER")),
  subjectPrefix: Config.String("LEDGER_SUBJECT_PREFIX").pipe(Config.withDefault("ledger.transfer")),
  consumer: Config.String("LEDGER_CONSUMER").pipe(Config.withDefault("ledger-applier")),
  ackWait: Config.Duration("LEDGER_ACK_WAIT").pipe(Config.withDefault(Duration.seconds(30))),
  concurrency: Config.Int("LEDGER_CONCURRENCY").pipe(Config.withDefault(8)),
  ordering: Config.Literals(["per-account", "unordered"], "LEDGER_ORDERING").pipe(Config.withDefault("per-account" as const)),
  batchSize: Config.Int("LEDGER_BATCH_SIZE").pipe(Config.withDefault(0)),
  batchWait: Config.Duration("LEDGER_BATCH_WAIT").pipe(Config.withDefault(Duration.millis(20))),
  attempts: Config.Int("LEDGER_ATTEMPTS").pipe(Config.withDefault(5)),
  retryBase: Config.Duration("LEDGER_RETRY_BASE").pipe(Config.withDefault(Duration.millis(200))),
  inProcessRetries: Config.Int("LEDGER_IN_PROCESS_RETRIES").pipe(Config.withDefault(2))
})

/** How the handler's typed errors are treated; the compiler checks that none is missing. */
const classify = {
  UnknownAccount: "permanent",
  InsufficientFunds: "permanent",
  CurrencyMismatch: "permanent",
  TransferRefused: "permanent",
  RiskCheckUnavailable: "transient",
  SqlError: "isRetryable",
  IdempotencyError: "isRetryable"
} as const

/** Attempts and backoff: exponential from `LEDGER_RETRY_BASE`, jittered, capped at 30 s. */
const retry = (settings: Settings) =>
  Retry.exponential({
    attempts: settings.attempts,
    base: settings.retryBase,
    cap: "30 seconds",
    inProcessRetries: settings.inProcessRetries
  })

/** The transfer's effect: the risk check (an HTTP call, when configured), then the transfer. */
const apply = (event: TransferEvent) => Effect.andThen(RiskCheck.check(event), applyTransfer(event))

/** The consumer definition: one transfer per transaction, or batches when `LEDGER_BATCH_SIZE` > 0. */
export const consumer = (
  settings: Settings,
  onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>
) => {
  if (settings.batchSize > 0) return batchConsumer(settings, onOutcome)
  return Consumer.make({
    name: settings.consumer, // "ledger-applier": also the deduplication scope
    source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
    schema: TransferEvent, // effect Schema; undecodable or invalid => Rejected (dead-lettered)
    metadata, // event -> { id, time, expiresAt? }
    // one SQL transaction: the dedup row and the transfer's effect
    handle: (event) => IdempotencyStore.commit(event.id, apply(event)),
    classify,
    retry: retry(settings),
    concurrency: settings.concurrency,
    ordering: settings.ordering === "per-account" ? { perKey: (event) => event.from } : "unordered",
    // No drainTimeout: under Worker.runMain the shutdown budget (SHUTDOWN_BUDGET) bounds the drain.
    onOutcome
  })
}

/**
 * The batch mode: up to `LEDGER_BATCH_SIZE` transfers in one transaction (their accounts locked
 * first, every dedup row in one statement in key order, each transfer in its own savepoint), each
 * with its own outcome and ack.
 */
export const batchConsumer = (
  settings: Settings,
  onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>
) =>
  Consumer.makeBatch({
    name: settings.consumer,
    source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
    schema: TransferEvent,
    metadata,
    batch: { maxSize: settings.batchSize, maxWait: settings.batchWait },
    // every account locked first, in id order, so that concurrent batches cannot deadlock
    handleBatch: (events) =>
      SqlClient.SqlClient.use((sql) =>
        sql.withTransaction(Effect.andThen(
          lockAccounts(events),
          IdempotencyStore.commitBatch(events.map((event) => ({ id: event.id, effect: apply(event) })))
        ))
      ),
    classify,
    retry: retry(settings),
    concurrency: settings.concurrency,
    onOutcome
  })

/** Declares the stream and consumer (MaxDeliver above the crash-loop guard) and runs both sets of migrations. */
export const setup = (settings: Settings) =>
  Effect.gen(function*() {
    yield* Topology.ensureStream({
      name: settings.stream,
      subjects: [`${settings.subjectPrefix}.>`],
      duplicateWindow: "2 minutes",
      maxAge: "7 days"
    })
    yield* Topology.ensureConsumer({
      stream: settings.stream,
      name: settings.consumer,
      ackWait: settings.ackWait,
      // Above the engine's crash-loop guard (twice the attempts): attempts are failed handler
      // runs (the attempt store), and releases at shutdown must not run a message out of deliveries.
      maxDeliver: 2 * settings.attempts + 1,
      maxAckPending: 1000
    })
    // Under a starting worker, waits (bounded by STARTUP_TIMEOUT) for a database that is not up yet.
    yield* Lifecycle.waitFor("postgres", Effect.andThen(Migrations.run, LedgerMigrations.run), {
      while: (error) => error._tag === "SqlError" && error.reason.isRetryable
    })
  })

/** Sets up, then runs the worker with `settings` until interrupted (graceful drain) or its source fails. */
export const runWith = (settings: Settings, onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>) =>
  Effect.andThen(setup(settings), Consumer.run(consumer(settings, onOutcome)))

/** Like {@link runWith}, with the settings read from the environment. */
export const run = (onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>) =>
  Effect.flatMap(settings, (s) => runWith(s, onOutcome))

/** PostgreSQL from `DATABASE_URL` (a secret), optionally on schema `DATABASE_SCHEMA`. */
export const DatabaseLive = Layer.unwrap(Effect.gen(function*() {
  const url = yield* Config.Redacted("DATABASE_URL").pipe(
    Config.withDefault(Redacted.make("postgres://postgres@127.0.0.1:5432/test"))
  )
  const schema = yield* Config.String("DATABASE_SCHEMA").pipe(Config.option)
  return PgClient.layer({
    url,
    maxConnections: 10,
    applicationName: "ledger-applier",
    ...(schema._tag === "Some" ? { startupParameters: { search_path: schema.value } } : {})
  })
}))

/**
 * Everything the worker needs: NATS (`NATS_URL`), PostgreSQL with the idempotency and attempt stores, and the
 * risk check (`LEDGER_RISK_URL`, with its HTTP client when set). Each is a `Lifecycle.resource`: the worker's shutdown closes it as one stage within the close share, and
 * readiness reflects PostgreSQL through a `SELECT 1` every 5 seconds (NATS through its connection
 * status).
 */
export const WorkerLive = Layer.mergeAll(
  Lifecycle.resource("nats", NatsConnection.layerConfig({ name: "ledger-applier" })),
  RiskCheck.layerConfig,
  Layer.merge(PgIdempotencyStore.layer(), PgAttemptStore.layer()).pipe(
    Layer.provideMerge(
      Lifecycle.resource("postgres", DatabaseLive, { check: SqlClient.SqlClient.use((sql) => sql`SELECT 1`) })
    )
  )
)

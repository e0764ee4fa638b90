/**
 * The reference worker: consumer `ledger-applier` on stream `LEDGER` (subjects
 * `ledger.transfer.>`) applies each transfer exactly once, in one PostgreSQL transaction with its
 * dedup row. Everything is configured from the environment (see {@link Settings}); the stream,
 * consumer and tables are declared on start (this service owns its consumer).
 */
import { PgClient } from "@effect/sql-pg"
import { Consumer, IdempotencyStore, type Outcome, Retry } from "@jetworker/core"
import { JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { Migrations, PgIdempotencyStore } from "@jetworker/sql-pg"
import { Config, Duration, Effect, Layer, Redacted } from "effect"
import { applyTransfer } from "./Ledger.ts"
import * as LedgerMigrations from "./LedgerMigrations.ts"
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
  /** `LEDGER_ATTEMPTS`, default 5: deliveries before a transient failure is dead-lettered. */
  readonly attempts: number
  /** `LEDGER_RETRY_BASE`, default `200 millis`: first retry delay (doubling, jittered, capped at 30 s). */
  readonly retryBase: Duration.Duration
  /** `LEDGER_DRAIN_TIMEOUT`, default `10 seconds`: how long running handlers may finish on shutdown. */
  readonly drainTimeout: Duration.Duration
}

/** Reads {@link Settings} from the environment. */
export const settings = Config.all({
  stream: Config.String("LEDGER_STREAM").pipe(Config.withDefault("LEDGER")),
  subjectPrefix: Config.String("LEDGER_SUBJECT_PREFIX").pipe(Config.withDefault("ledger.transfer")),
  consumer: Config.String("LEDGER_CONSUMER").pipe(Config.withDefault("ledger-applier")),
  ackWait: Config.Duration("LEDGER_ACK_WAIT").pipe(Config.withDefault(Duration.seconds(30))),
  concurrency: Config.Int("LEDGER_CONCURRENCY").pipe(Config.withDefault(8)),
  attempts: Config.Int("LEDGER_ATTEMPTS").pipe(Config.withDefault(5)),
  retryBase: Config.Duration("LEDGER_RETRY_BASE").pipe(Config.withDefault(Duration.millis(200))),
  drainTimeout: Config.Duration("LEDGER_DRAIN_TIMEOUT").pipe(Config.withDefault(Duration.seconds(10)))
})

/** The consumer definition. */
export const consumer = (
  settings: Settings,
  onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>
) =>
  Consumer.make({
    name: settings.consumer, // "ledger-applier": also the deduplication scope
    source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
    schema: TransferEvent, // effect Schema; undecodable or invalid => Rejected (dead-lettered)
    metadata, // event -> { id, time, expiresAt? }
    handle: (event) => IdempotencyStore.commit(event.id, applyTransfer(event)), // one SQL transaction
    classify: {
      UnknownAccount: "permanent",
      InsufficientFunds: "permanent",
      CurrencyMismatch: "permanent",
      SqlError: "isRetryable",
      IdempotencyError: "isRetryable"
    },
    retry: Retry.exponential({ attempts: settings.attempts, base: settings.retryBase, cap: "30 seconds" }),
    concurrency: settings.concurrency,
    drainTimeout: settings.drainTimeout,
    onOutcome
  })

/** Declares the stream and consumer (MaxDeliver above the attempts) and runs both sets of migrations. */
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
      maxDeliver: settings.attempts + 2,
      maxAckPending: 1000
    })
    yield* Migrations.run
    yield* LedgerMigrations.run
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

/** Everything the worker needs: NATS (`NATS_URL`), PostgreSQL and the idempotency store. */
export const WorkerLive = Layer.mergeAll(
  NatsConnection.layerConfig({ name: "ledger-applier" }),
  PgIdempotencyStore.layer().pipe(Layer.provideMerge(DatabaseLive))
)

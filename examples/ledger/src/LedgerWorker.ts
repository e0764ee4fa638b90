/**
 * The reference worker: consumer `ledger-applier` on stream `LEDGER` (subjects
 * `ledger.transfer.>`) applies each transfer exactly once, in one PostgreSQL transaction with its
 * dedup row and a `ledger.applied.<transfer id>` event recorded in the outbox, which the outbox
 * relay publishes to stream `LEDGER_APPLIED` (subjects `ledger.applied.>`; never to `LEDGER`,
 * whose consumer must not receive them). Everything is configured from the environment (see
 * {@link Settings}); the streams, consumer and tables are declared on start (this service owns
 * them).
 */
import { Consumer, Envelope, IdempotencyStore, Lifecycle, type Outcome, Outbox, Retry } from "@jetworker/core"
import { Contract, JetStreamSource, NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Migrations, PgAttemptStore, PgIdempotencyStore, PgOutbox, PgPipelinedClient, PgTransaction } from "@jetworker/sql-pg"
import { Config, ConfigProvider, Duration, Effect, Layer, Redacted } from "effect"
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
  /** `LEDGER_RETRY_BASE`, default `1 second`: first retry delay (doubling, jittered, capped at 30 s). */
  readonly retryBase: Duration.Duration
  /** `LEDGER_IN_PROCESS_RETRIES`, default 2: quick retries inside one attempt before a nak. */
  readonly inProcessRetries: number
  /**
   * `LEDGER_PAUSE_ON_DEPENDENCIES`, default true: while PostgreSQL (or NATS) is down, take no new
   * transfer and hold the ones that failed, without counting their failures, until it is back
   * (see `Consumer.make`'s `dependencies`); false spends the attempts as any failure does.
   */
  readonly pauseOnDependencies: boolean
  /** `LEDGER_APPLIED_STREAM`, default `LEDGER_APPLIED`: where the applied events are stored. */
  readonly appliedStream: string
  /**
   * `LEDGER_APPLIED_SUBJECT_PREFIX`, default `ledger.applied`: applied events go to
   * `<prefix>.<transfer id>`; the applied stream captures `<prefix>.>`.
   */
  readonly appliedSubjectPrefix: string
  /** `LEDGER_REPLICAS`, default 1: replicas of both streams (3 on a three-node JetStream cluster). */
  readonly replicas: number
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
  retryBase: Config.Duration("LEDGER_RETRY_BASE").pipe(Config.withDefault(Duration.seconds(1))),
  inProcessRetries: Config.Int("LEDGER_IN_PROCESS_RETRIES").pipe(Config.withDefault(2)),
  pauseOnDependencies: Config.Boolean("LEDGER_PAUSE_ON_DEPENDENCIES").pipe(Config.withDefault(true)),
  appliedStream: Config.String("LEDGER_APPLIED_STREAM").pipe(Config.withDefault("LEDGER_APPLIED")),
  appliedSubjectPrefix: Config.String("LEDGER_APPLIED_SUBJECT_PREFIX").pipe(Config.withDefault("ledger.applied")),
  replicas: Config.Int("LEDGER_REPLICAS").pipe(Config.withDefault(1))
})

/** How the handler's typed errors are treated; the compiler checks that none is missing. */
const classify = {
  UnknownAccount: "permanent",
  InsufficientFunds: "permanent",
  CurrencyMismatch: "permanent",
  TransferRefused: "permanent",
  RiskCheckUnavailable: "transient",
  SqlError: "isRetryable",
  IdempotencyError: "isRetryable",
  OutboxError: "transient"
} as const

/**
 * Attempts and backoff: exponential from `LEDGER_RETRY_BASE`, jittered, capped at 30 s. With the
 * defaults (5 attempts from 1 second) the delays between attempts add up to about 15 seconds, so a
 * transfer rides out a database outage (a failover, a restart) of some 10 seconds without being
 * dead-lettered even when nothing pauses it; with `LEDGER_PAUSE_ON_DEPENDENCIES` (the default) a
 * failure while the database's check fails is held instead of counted, for up to 5 minutes.
 */
export const retryPolicy = (settings: Settings) =>
  Retry.exponential({
    attempts: settings.attempts,
    base: settings.retryBase,
    cap: "30 seconds",
    inProcessRetries: settings.inProcessRetries
  })

/**
 * The subject of a transfer's applied event: `<prefix>.<transfer id>`, each dot-separated part of
 * the id a subject token (other characters than letters, digits, `_` and `-` become `_`, an empty
 * part `_`; the event's id itself stays exact).
 */
export const appliedSubject = (settings: Settings, transferId: string): string =>
  `${settings.appliedSubjectPrefix}.${transferId.split(".").map((token) => token.replace(/[^A-Za-z0-9_-]/g, "_") || "_").join(".")}`

/** The event recorded for an applied transfer: an envelope of type `ledger.applied` with the transfer's id. */
const recordApplied = (settings: Settings, event: TransferEvent) =>
  Effect.flatMap(
    Envelope.make({
      type: "ledger.applied",
      id: event.id,
      data: { transferId: event.id, from: event.from, to: event.to, amount: event.amount, currency: event.currency }
    }),
    (applied) => Outbox.recordEnvelope(appliedSubject(settings, event.id), applied)
  )

/**
 * The transfer's effect: the risk check (an HTTP call, when configured), the transfer, and its
 * applied event in the outbox, all in the caller's transaction.
 */
const applyWith = (settings: Settings) => (event: TransferEvent) =>
  RiskCheck.check(event).pipe(Effect.andThen(applyTransfer(event)), Effect.andThen(recordApplied(settings, event)))

/** The consumer definition: one transfer per transaction, or batches when `LEDGER_BATCH_SIZE` > 0. */
export const consumer = (
  settings: Settings,
  onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>
) => {
  if (settings.batchSize > 0) return batchConsumer(settings, onOutcome)
  const apply = applyWith(settings)
  return Consumer.make({
    name: settings.consumer, // "ledger-applier": also the deduplication scope
    source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
    schema: TransferEvent, // effect Schema; undecodable or invalid => Rejected (dead-lettered)
    metadata, // event -> { id, time, expiresAt? }
    // one SQL transaction: the dedup row and the transfer's effect
    handle: (event) => IdempotencyStore.commit(event.id, apply(event)),
    classify,
    retry: retryPolicy(settings),
    concurrency: settings.concurrency,
    dependencies: { pauseOn: settings.pauseOnDependencies ? "all" : "none" },
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
) => {
  const apply = applyWith(settings)
  return Consumer.makeBatch({
    name: settings.consumer,
    source: JetStreamSource.make({ stream: settings.stream, consumer: settings.consumer }),
    schema: TransferEvent,
    metadata,
    batch: { maxSize: settings.batchSize, maxWait: settings.batchWait },
    // every account locked first, in id order, so that concurrent batches cannot deadlock; a lost
    // connection ends the transaction with the batch's typed failure, not a failed rollback's defect
    handleBatch: (events) =>
      PgTransaction.withTransaction(Effect.andThen(
        lockAccounts(events),
        IdempotencyStore.commitBatch(events.map((event) => ({ id: event.id, effect: apply(event) })))
      )),
    classify,
    retry: retryPolicy(settings),
    concurrency: settings.concurrency,
    dependencies: { pauseOn: settings.pauseOnDependencies ? "all" : "none" },
    onOutcome
  })
}

/** Instances of the worker reading the consumer at once: the deployment's `replicas`. */
export const instances = 3

/**
 * The ledger's contract with its stream (INT-NATS-002) for `settings`: the closed list of
 * subjects, the stream, the consumer (MaxDeliver above the crash-loop guard) and what the worker
 * expects of it. Its file form for the default settings, `examples/ledger/contract.json`, is the
 * reviewed copy (a test keeps the two equal) that CI checks against the live server with
 * `jetworker contract check`.
 */
export const contract = (settings: Settings): Contract.Contract => ({
  version: "1",
  ownership: "service",
  stream: {
    name: settings.stream,
    subjects: [`${settings.subjectPrefix}.>`],
    duplicateWindow: "2 minutes",
    maxAge: "7 days",
    replicas: settings.replicas
  },
  consumers: [{
    name: settings.consumer,
    ackWait: settings.ackWait,
    // Above the engine's crash-loop guard (twice the attempts): attempts are failed handler
    // runs (the attempt store), and releases at shutdown must not run a message out of deliveries.
    maxDeliver: 2 * settings.attempts + 1,
    maxAckPending: 1000,
    expect: {
      attempts: settings.attempts,
      // In batch mode the engine holds up to a batch per running handler.
      concurrency: settings.batchSize > 0 ? settings.concurrency * settings.batchSize : settings.concurrency,
      prefetch: settings.batchSize > 0 ? settings.concurrency * settings.batchSize : settings.concurrency,
      instances,
      ordering: settings.batchSize > 0 || settings.ordering === "unordered" ? "Unordered" : "PerKey",
      maxProcessingTime: "30 seconds", // the default handlerTimeout
      idempotent: true // IdempotencyStore.commit
    }
  }],
  // Covers the demo's publisher with its default retries (Publisher.republishHorizon(): about 27 s).
  publishHorizon: "30 seconds"
})

/**
 * Applies the contract (this service owns its stream and consumer) and declares the applied
 * events' stream (its duplicate window covers the relay's republishes). The tables are created
 * before, as {@link WorkerLive} is built.
 */
export const setup = (settings: Settings) =>
  Effect.gen(function*() {
    yield* Contract.apply(contract(settings))
    yield* Topology.ensureStream({
      name: settings.appliedStream,
      subjects: [`${settings.appliedSubjectPrefix}.>`],
      duplicateWindow: "2 minutes",
      maxAge: "7 days",
      replicas: settings.replicas
    })
  })

/** Sets up, then runs the worker with `settings` until interrupted (graceful drain) or its source fails. */
export const runWith = (settings: Settings, onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>) =>
  Effect.andThen(setup(settings), Consumer.run(consumer(settings, onOutcome)))

/** Like {@link runWith}, with the settings read from the environment. */
export const run = (onOutcome?: (outcome: Outcome.Outcome) => Effect.Effect<void>) =>
  Effect.flatMap(settings, (s) => runWith(s, onOutcome))

const urlForm = "postgres://user:password@host:5432/database"

/**
 * What makes `url` unusable as `DATABASE_URL`, in words that name the variable and never quote
 * it (it holds the password), or `undefined` when it is a connection URL `@effect/sql-pg` reads:
 * `postgres://` or `postgresql://`, a port from 1 to 65535 (in the authority or a `port`
 * parameter), valid percent-encoding, a user (in the URL, a `user` parameter, or the `USER`
 * variable as libpq takes it), and the `sslmode` and `connect_timeout` parameters it knows.
 * The driver reports such a URL as a connection error, which start-up would retry for the whole
 * `STARTUP_TIMEOUT` as if the server were down.
 */
export const databaseUrlProblem = (url: string): string | undefined => {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(url)?.[1]?.toLowerCase()
  if (scheme !== "postgres" && scheme !== "postgresql") {
    return `DATABASE_URL is not a PostgreSQL URL (it must start with postgres:// or postgresql://): write it as ${urlForm}`
  }
  if (!/^[A-Za-z]+:\/\//.test(url)) return `DATABASE_URL lacks the // after ${scheme}: write it as ${urlForm}`
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    // The authority's last `:` (past the user and password, outside an IPv6 address) starts the
    // port; an `@` past the authority is a password with a `/`, `?` or `#` left unencoded.
    const [authority = "", ...rest] = url.slice(url.indexOf("//") + 2).split(/[/?#]/)
    const hostPort = authority.slice(authority.lastIndexOf("@") + 1)
    const port = /^(?:\[[^\]]*\]|[^:]*):(.*)$/.exec(hostPort)?.[1]
    if (port !== undefined && port !== "" && !/^\d+$/.test(port) && !rest.join("/").includes("@")) {
      return `DATABASE_URL has a port that is not a number: write it as ${urlForm}, the port from 1 to 65535`
    }
    return `DATABASE_URL is not a valid URL: write it as ${urlForm}, with a reserved character of the user or ` +
      `password percent-encoded (@ as %40, : as %3A, / as %2F, # as %23, % as %25)`
  }
  const decodes = (part: string) => {
    try {
      decodeURIComponent(part)
      return true
    } catch {
      return false
    }
  }
  for (const [what, part] of [["user", parsed.username], ["password", parsed.password], ["host", parsed.hostname], ["database", parsed.pathname]]) {
    if (!decodes(part!)) return `DATABASE_URL has an invalid percent-encoding in its ${what} (a % must start %XX; write % as %25)`
  }
  const isPort = (value: string) => /^\d+$/.test(value) && Number(value) >= 1 && Number(value) <= 65535
  if (parsed.port !== "" && !isPort(parsed.port)) return "DATABASE_URL has a port out of range: the port is from 1 to 65535"
  const port = parsed.searchParams.get("port")
  if (port !== null && !isPort(port)) return "DATABASE_URL has a port parameter that is not a port from 1 to 65535"
  const timeout = parsed.searchParams.get("connect_timeout")
  if (timeout !== null && !/^\d+$/.test(timeout)) {
    return "DATABASE_URL has a connect_timeout parameter that is not a whole number of seconds (0: no bound)"
  }
  const sslmode = parsed.searchParams.get("sslmode")
  if (sslmode !== null && !["disable", "allow", "prefer", "require", "verify-ca", "verify-full"].includes(sslmode)) {
    return "DATABASE_URL has an sslmode parameter that is not one of disable, allow, prefer, require, verify-ca, verify-full"
  }
  if (parsed.username === "" && parsed.searchParams.get("user") === null && !process.env.USER && !process.env.USERNAME) {
    return `DATABASE_URL names no user (and USER is not set): write it as ${urlForm}`
  }
  return undefined
}

/**
 * PostgreSQL from `DATABASE_URL` (a secret), optionally on schema `DATABASE_SCHEMA`. A
 * `DATABASE_URL` that cannot work (see {@link databaseUrlProblem}) fails the layer at once with a
 * `ConfigError` that names the variable and what is wrong, before any connection is tried.
 */
export const DatabaseLive = Layer.unwrap(Effect.gen(function*() {
  const url = yield* Config.Redacted("DATABASE_URL").pipe(
    Config.withDefault(Redacted.make("postgres://postgres@127.0.0.1:5432/test")),
    Config.mapEffect((url) => {
      const problem = databaseUrlProblem(Redacted.value(url))
      return problem === undefined
        ? Effect.succeed(url)
        : Effect.fail(new Config.ConfigError(new ConfigProvider.SourceError({ message: problem })))
    })
  )
  const schema = yield* Config.String("DATABASE_SCHEMA").pipe(Config.option)
  // Its transactions send their BEGIN with the commit's dedup row: one round trip less per message.
  return PgPipelinedClient.layer({
    url,
    maxConnections: 10,
    applicationName: "ledger-applier",
    ...(schema._tag === "Some" ? { startupParameters: { search_path: schema.value } } : {})
  })
}))

const NatsLive = Lifecycle.resource("nats", NatsConnection.layerConfig({ name: "ledger-applier" }))

const PostgresLive = Lifecycle.resource("postgres", DatabaseLive, { check: SqlClient.SqlClient.use((sql) => sql`SELECT 1`) })

/**
 * The tables: jetworker's migrations (`Migrations.layer`, which waits, bounded by
 * `STARTUP_TIMEOUT`, for a database that is not up yet), then the ledger's.
 */
const MigrationsLive = Layer.effectDiscard(LedgerMigrations.run).pipe(Layer.provide(Migrations.layer))

/**
 * Everything the worker needs: NATS (`NATS_URL`), PostgreSQL with the idempotency and attempt
 * stores and the outbox, the outbox relay (publishing through NATS), and the risk check
 * (`LEDGER_RISK_URL`, with its HTTP client when set). Both sets of migrations run first, beneath
 * the stores (whose layers refuse to build without their tables) and the relay. NATS and
 * PostgreSQL are `Lifecycle.resource`s, and so is the relay: the worker's shutdown closes each as
 * one stage within the close share (the relay first, which depends on both), and readiness
 * reflects PostgreSQL through a `SELECT 1` every 5 seconds (NATS through its connection status).
 */
export const WorkerLive = Layer.mergeAll(
  RiskCheck.layerConfig,
  Layer.mergeAll(
    PgIdempotencyStore.layer(),
    PgAttemptStore.layer(),
    PgOutbox.layer(),
    // The applied events' stream named: every event has a subject of its own, so finding the stream
    // by subject would ask the server once per event.
    // A resource of its own: stopping it rolls back a round in progress, which waits on the
    // database; if that hangs, its close is cut and named, and PostgreSQL and NATS still close.
    Lifecycle.resource(
      "outbox-relay",
      Layer.unwrap(Effect.map(settings, (s) => PgOutbox.layerRelay().pipe(Layer.provide(Publisher.outboxPublisher({ stream: s.appliedStream })))))
    )
  ).pipe(Layer.provide(MigrationsLive))
).pipe(Layer.provideMerge(PostgresLive), Layer.provideMerge(NatsLive))

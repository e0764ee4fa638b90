/**
 * The transactional outbox on PostgreSQL (INT-NATS-007): `Outbox.record` (core) inserts a row in
 * the current transaction, so a recorded event exists exactly when the transaction's effects and
 * dedup row do; the relay publishes pending rows afterwards, in the order they were recorded,
 * through core's `OutboxPublisher` (the application wires `@jetworker/nats`'s; this package never
 * imports NATS), and marks them sent.
 *
 * One relay runs at a time per outbox table: each round is one transaction that first takes a
 * transaction-scoped advisory lock on the table (`pg_try_advisory_xact_lock`, keyed by the table's
 * oid, so each schema's outbox has its own; a relay that does not get it
 * waits for the next round), reads a bounded batch of pending rows in order, publishes them one
 * after the other (each confirmed before the next, so the stream stores them in that order), marks
 * the published ones sent and commits. A relay killed between a publish and the commit leaves the
 * rows pending, and the next round publishes them again with the same id (`Nats-Msg-Id`), which
 * the stream's duplicate window turns into a duplicate. An interrupted relay (a worker shutting
 * down) stops publishing and commits the marks of the rows the stream confirmed. A failed publish
 * ends the round (the rows before it are marked) and the relay retries after a jittered, capped
 * backoff. Rows keep the trace context (`traceparent`) of the transaction that wrote them, so the
 * publish span continues that trace; the relay's own statements are not traced (an idle relay
 * polls every `pollInterval`). Sent rows are deleted after `retention` by a bounded clean-up.
 *
 * Ids are unique per event: the stream keeps one message per `Nats-Msg-Id` within its duplicate
 * window, so a second event under an id would be marked sent and dropped as a duplicate. The
 * table's unique index on `id` (migration 4) makes `record` of an id still in the table fail its
 * transaction with `OutboxError` naming the id instead. A row the clean-up deleted frees its id:
 * keep `retention` longer than the stream's duplicate window, so that the index refuses any reuse
 * the stream would drop.
 *
 * A message that could never be published (`Outbox.problems`: its id, subject or headers, or its
 * size, payload and headers, above `maxMessageBytes`, 1 MiB by default) is refused when it is
 * recorded, and so is a record outside a transaction: a row that can never be published would
 * hold back every row after it. A publish that fails for good all the same (no stream captures
 * the subject) is logged as `outbox.relay_blocked` (ERROR) on every try, since
 * nothing may be skipped. A round publishes for at most `roundBudget` (a publish under way is cut
 * there, but for its first), so a relay killed in it republishes only rows the stream's duplicate
 * window still remembers.
 *
 * Order caveat: rows are published in the order of their sequence numbers, which is the order the
 * transactions inserted them, not always the order they committed: of two transactions that
 * overlap (one inserts, the other inserts and commits, then the first commits), the later row
 * may be published first. No row is skipped. A transaction that commits before another starts
 * is always published before it.
 *
 * @since 0.1.0
 */
import { DurationInput, ErrorSummary, Outbox, Telemetry } from "@jetworker/core"
import { Cause, Clock, Deferred, Duration, Effect, Exit, Fiber, Layer, Predicate, Result, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import { isSqlError, type SqlError } from "effect/sql/SqlError"
import { connectionLost, isConnectionLoss, sqlState } from "./internal/errors.ts"
import * as Table from "./internal/table.ts"
import { type MissingTable, requireTable } from "./internal/tableCheck.ts"

/** Where the outbox lives. */
export interface Options {
  /**
   * The outbox table, a lowercase identifier optionally qualified by a schema. It must have the
   * shape the migrations create, the unique index on `id` included, named `<table>_id_key` as
   * `UNIQUE (id)` names it (a reused id is then reported as such). Default: `"jetworker_outbox"`.
   */
  readonly table?: string | undefined
  /**
   * The largest event `record` accepts, in bytes: its payload plus its headers as the relay's
   * publisher sends them (`Outbox.messageBytes`), a positive integer. A larger one fails `record`
   * with `OutboxError` naming its size and this limit: the NATS server refuses, for good, a message
   * larger than its `max_payload`, and such a row would block every row recorded after it. Keep it
   * at most the server's `max_payload`, and give the relay ({@link layerRelay}) the same value: it
   * warns at start when the server takes less. Default: 1 MiB (1 048 576), NATS's default
   * `max_payload`.
   */
  readonly maxMessageBytes?: number | undefined
}

const quoted = (name: string): Effect.Effect<string, Outbox.OutboxError> => {
  const table = Table.quote(name)
  return table === undefined
    ? Effect.fail(new Outbox.OutboxError({ message: Table.invalidMessage(name, "outbox") }))
    : Effect.succeed(table)
}

const maxMessageBytesOf = (options: Options): Effect.Effect<number, Outbox.OutboxError> => {
  const bytes = options.maxMessageBytes ?? Outbox.defaultMaxMessageBytes
  return Number.isSafeInteger(bytes) && bytes > 0
    ? Effect.succeed(bytes)
    : Effect.fail(new Outbox.OutboxError({ message: `maxMessageBytes must be a positive integer (bytes), got ${bytes}` }))
}

/**
 * The `Outbox` port on the current `SqlClient`: `record` inserts a row in the current transaction.
 * An id already in the table (a committed row not yet cleaned up, or one recorded earlier in the
 * same transaction) fails with `OutboxError` naming it; one recorded by a transaction still open
 * waits for it, and fails if it commits. A failed insert aborts the transaction in PostgreSQL, so
 * the transaction cannot commit (the handler fails, and is retried or dead-lettered as usual). An
 * event larger than `maxMessageBytes` (payload and headers) fails with `OutboxError` naming its
 * size and the limit, before anything is written. A bad `table` or `maxMessageBytes` fails `make`
 * with `OutboxError` naming it.
 */
export const make = (options: Options = {}): Effect.Effect<Outbox.Outbox["Service"], Outbox.OutboxError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    const maxMessageBytes = yield* maxMessageBytesOf(options)
    return {
      record: (message) =>
        Effect.gen(function*() {
          const invalid = Outbox.problems(message, { maxMessageBytes })
          if (invalid.length > 0) {
            return yield* new Outbox.OutboxError({ message: `cannot record ${JSON.stringify(message.id)} in the outbox: ${invalid.join("; ")}` })
          }
          // Outside a transaction the row would commit on its own, whatever happens to the effects.
          if ((yield* Effect.serviceOption(sql.transactionService))._tag === "None") {
            return yield* new Outbox.OutboxError({
              message: `Outbox.record(${JSON.stringify(message.id)}) runs outside a transaction of the outbox's SqlClient: ` +
                `record inside IdempotencyStore.commit's effect or sql.withTransaction, and provide PgOutbox.layer() on the ` +
                `same SqlClient as the idempotency store, so the event commits with the effects`
            })
          }
          const span = yield* Effect.option(Effect.currentSpan)
          const traceparent = span._tag === "Some" ? Telemetry.formatTraceparent(span.value) : null
          const headers = message.headers === undefined || message.headers.length === 0 ? null : JSON.stringify(message.headers)
          yield* sql.unsafe(
            `INSERT INTO ${table} (id, subject, payload, headers, traceparent) VALUES ($1, $2, $3, $4::jsonb, $5)`,
            [message.id, message.subject, message.payload, headers, traceparent]
          )
        }).pipe(
          Effect.catchTag("SqlError", (cause) =>
            Effect.fail(new Outbox.OutboxError({
              message: violatesIdIndex(cause, table)
                ? `Outbox.record(${JSON.stringify(message.id)}): the outbox table ${table} already holds a row with this id ` +
                  `(recorded by an earlier transaction or earlier in this one, and not yet deleted by the relay's clean-up): ` +
                  `ids must be unique per event, since the stream would drop a second message with the same Nats-Msg-Id as a ` +
                  `duplicate; give each event an id of its own (the event's id, not one that several events share, such as ` +
                  `their aggregate's). This transaction cannot commit`
                : `could not record ${message.id} in the outbox: ${cause.message}`,
              cause
            })))
        )
    }
  })

/**
 * Whether `error` is the unique index on the outbox's `id` refusing a row: SQLSTATE 23505 on
 * `<table>_id_key` of `table` (validated and quoted, maybe schema-qualified), the name the
 * migrations give it and `UNIQUE (id)` would. Another unique violation (a trigger's, say) keeps
 * PostgreSQL's own words.
 */
const violatesIdIndex = (error: SqlError, table: string): boolean => {
  const reported: unknown = error.reason.cause
  if (sqlState(error) !== "23505" || !Predicate.hasProperty(reported, "constraint") || !Predicate.hasProperty(reported, "table")) {
    return false
  }
  const name = table.replaceAll("\"", "").split(".").at(-1)
  return reported.table === name && reported.constraint === `${name}_id_key`
}

/**
 * Provides `Outbox` on the application's `SqlClient`. Building it fails with `OutboxError` when the
 * table name or `maxMessageBytes` is invalid, and with `Migrations.MissingTable` when the table
 * does not exist (the migrations have not run on this database and schema), as
 * `PgIdempotencyStore.layer` does; a
 * database that cannot be reached fails the check with its `SqlError`, never as a missing table.
 * {@link make} checks nothing, and neither does the relay ({@link layerRelay}), which waits for
 * its table.
 */
export const layer = (options: Options = {}): Layer.Layer<Outbox.Outbox, Outbox.OutboxError | MissingTable | SqlError, SqlClient.SqlClient> =>
  Layer.effect(Outbox.Outbox, Effect.tap(make(options), () => requireTable(options.table ?? Table.defaultOutboxTable, "outbox")))

/** How the relay runs. */
export interface RelayOptions extends Options {
  /** Rows published per round (one transaction), 1 to 10 000. Default: 100. */
  readonly batchSize?: number | undefined
  /** How long the relay waits after a round that found nothing (or not the lock), more than zero. Default: 200 millis. */
  readonly pollInterval?: Duration.Input | undefined
  /** The first delay after a failed round, more than zero; it doubles (jittered) up to `maxBackoff`. Default: 200 millis. */
  readonly backoff?: Duration.Input | undefined
  /** The longest delay between failed rounds, at least `backoff`. Default: 10 seconds. */
  readonly maxBackoff?: Duration.Input | undefined
  /**
   * How long sent rows are kept before the clean-up deletes them, at least zero (`Duration.infinity`:
   * for ever); a negative or NaN one is refused. Default: 1 hour. A deleted row frees its id for a
   * new record: keep this longer than the stream's duplicate window (2 minutes by default), or an
   * event recorded under the id of a deleted row still inside that window is dropped by the stream
   * as a duplicate.
   */
  readonly retention?: Duration.Input | undefined
  /**
   * Rows the clean-up deletes at most per run. It runs once a minute, and again after each round
   * while it still finds a full batch, so it keeps up with any rate. Default: 1000.
   */
  readonly cleanupBatch?: number | undefined
  /**
   * The longest a round goes on publishing before it marks what it published and commits, more
   * than zero; a publish still under way then is cut (and published again by the next round), but
   * for the round's first, which its own attempts and timeout bound (`Publisher.republishHorizon`).
   * A relay killed in a round republishes the round's rows, which the stream deduplicates only
   * within its duplicate window: keep this and the publisher's horizon well under the window.
   * Default: 30 seconds.
   */
  readonly roundBudget?: Duration.Input | undefined
}

/** What one round did. */
export interface Round {
  /** Whether this relay held the outbox's lock (otherwise another relay is running). */
  readonly locked: boolean
  /** Rows published and marked sent, in order. */
  readonly published: number
  /** Whether the batch came full and all of it was published (more rows may be pending). */
  readonly full: boolean
}

interface Row {
  readonly position: string
  readonly id: string
  readonly subject: string
  readonly payload: Uint8Array
  readonly headers: unknown
  readonly traceparent: string | null
}


/**
 * A row's headers as the publisher takes them (an array of `[name, value]` string pairs, as
 * `Outbox.record` writes them), or why not: the column is jsonb, and a row written by other
 * means (SQL, a trigger) may hold any JSON there.
 */
const rowHeaders = (headers: unknown): ReadonlyArray<readonly [string, string]> | undefined | string => {
  if (headers === null || headers === undefined) return undefined
  if (Array.isArray(headers) && headers.every((pair) => Array.isArray(pair) && pair.length === 2 && typeof pair[0] === "string" && typeof pair[1] === "string")) {
    return headers as ReadonlyArray<readonly [string, string]>
  }
  return `its headers column holds ${JSON.stringify(headers).slice(0, 120)}, not a JSON array of [name, value] string pairs`
}

/**
 * A duration option, refused with its name when it does not parse (a cast config string may not)
 * or holds a NaN (which effect would read as zero).
 */
const duration = (name: string, value: Duration.Input | undefined, fallback: Duration.Input): Effect.Effect<Duration.Duration, Outbox.OutboxError> => {
  const parsed = DurationInput.parse(value ?? fallback)
  return parsed !== undefined
    ? Effect.succeed(parsed)
    : Effect.fail(new Outbox.OutboxError({ message: `${name} must be a duration such as "30 seconds", got ${DurationInput.show(value)}` }))
}

/**
 * The retention, checked: a negative one would delete every sent row at once, the newest
 * included. An infinite one is accepted (rows are kept for ever).
 */
const retentionOf = (options: RelayOptions): Effect.Effect<Duration.Duration, Outbox.OutboxError> =>
  Effect.flatMap(duration("retention", options.retention, "1 hour"), (retention) =>
    Duration.isNegative(retention)
      ? Effect.fail(new Outbox.OutboxError({
        message: `retention must be a duration of at least zero (Duration.infinity keeps sent rows for ever), got ${DurationInput.show(options.retention)}`
      }))
      : Effect.succeed(retention))

const checkCount = (name: string, value: number | undefined, fallback: number): Effect.Effect<number, Outbox.OutboxError> => {
  const count = value ?? fallback
  return Number.isInteger(count) && count >= 1 && count <= 10_000
    ? Effect.succeed(count)
    : Effect.fail(new Outbox.OutboxError({ message: `${name} must be an integer from 1 to 10000, got ${count}` }))
}

/**
 * One round of the relay: under the outbox's lock, publish up to `batchSize` pending rows in order
 * and mark them sent, in one transaction. A failed publish ends the round after marking the rows
 * published before it, and fails with it. An interruption (a worker shutting down) stops the
 * publishing only: the rows the stream has confirmed are marked sent and committed (waited for up
 * to 5 seconds; past that the round is given up and rolls back, with a warning), and the
 * interruption goes on; the publish it cut leaves its row pending.
 */
export const relayRound = (
  options: RelayOptions = {}
): Effect.Effect<Round, Outbox.OutboxError | Outbox.PublishFailed, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const publisher = yield* Outbox.OutboxPublisher
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    const batchSize = yield* checkCount("batchSize", options.batchSize, 100)
    const budget = yield* positive("roundBudget", options.roundBudget, "30 seconds")
    const budgetMillis = Duration.toMillis(budget)
    const clock = yield* Clock.Clock
    // Done when this round is interrupted: publishing stops, what the stream confirmed is marked.
    const stop = yield* Deferred.make<void>()
    const round = Effect.gen(function*() {
      // One 64-bit lock key per outbox table, held until the transaction ends. Advisory locks are
      // per database, so the key is the table's oid (tables of one name in two schemas are two
      // outboxes).
      const [lock] = yield* sql.unsafe<{ readonly locked: boolean }>(
        `SELECT pg_try_advisory_xact_lock(hashtextextended('jetworker_outbox:' || $1::regclass::oid::text, 0)) AS locked`,
        [table]
      )
      if (lock?.locked !== true) return { round: { locked: false, published: 0, full: false }, failure: undefined }
      const rows = yield* sql.unsafe<Row>(
        // `position` is the sequence as text (a bigint may exceed a JS number); order by the number.
        `SELECT seq::text AS position, id, subject, payload, headers, traceparent FROM ${table} WHERE sent_at IS NULL ORDER BY seq LIMIT ${batchSize}`
      )
      const sent: Array<string> = []
      let failure: Outbox.PublishFailed | undefined
      // The budget on the monotonic clock (a step of the wall clock must not stretch it).
      const elapsedMillis = () => Number(clock.monotonicTimeNanosUnsafe()) / 1e6
      const started = elapsedMillis()
      let outOfTime = false
      const publishing = Effect.gen(function*() {
        for (const row of rows) {
          // Past the budget, what was published is marked now: a relay killed later in a long round
          // would republish rows the stream no longer remembers. A publish under way is cut at the
          // budget too (its retries could go on for its whole horizon); cut, it may have been stored,
          // and the next round publishes it again with the same id, inside the duplicate window.
          // A round's first publish is not cut (it is bounded by its own attempts and timeout), so
          // that every round gets one row further, whatever the budget.
          const left = budgetMillis - (elapsedMillis() - started)
          if (sent.length > 0 && left <= 0) {
            outOfTime = true
            return
          }
          const headers = rowHeaders(row.headers)
          // A defect (a publisher that throws on what the row holds) fails this row alone: escaping
          // the round, it would roll back the marks of the rows the stream has already confirmed,
          // and every later round would publish them again.
          const result = typeof headers === "string"
            ? Result.fail(new Outbox.PublishFailed({ message: headers, retryable: false }))
            : yield* Effect.result(cutAt(
              publisher.publish({ subject: row.subject, id: row.id, payload: row.payload, headers }, row.traceparent ?? undefined).pipe(
                Effect.catchDefect((defect) =>
                  Effect.fail(new Outbox.PublishFailed({ message: `unexpected defect: ${ErrorSummary.fromError(defect, "Defect").message}`, retryable: true }))
                ),
                // The publish is traced (in the trace of the transaction that wrote the row), not the round.
                Effect.withTracerEnabled(true)
              ),
              sent.length === 0 ? undefined : left,
              () => {
                outOfTime = true
              }
            ))
          // Cut at the budget: the rows confirmed before it are marked, and the round ends in time.
          if (outOfTime) return
          if (result._tag === "Failure") {
            failure = new Outbox.PublishFailed({
              message: `row ${row.position} (id ${row.id}, subject ${row.subject}): ${result.failure.message}`,
              retryable: result.failure.retryable
            })
            return
          }
          sent.push(row.position)
        }
      })
      // Interrupted, the round stops publishing (the publish under way is cut, its row stays
      // pending) and still marks and commits the rows the stream confirmed: rolled back, they would
      // be published again by the next relay, maybe after the stream's duplicate window.
      if (!(yield* Deferred.isDone(stop))) yield* Effect.raceFirst(publishing, Deferred.await(stop))
      if (sent.length > 0) {
        yield* sql.unsafe(`UPDATE ${table} SET sent_at = now() WHERE seq = ANY(string_to_array($1, ',')::bigint[])`, [sent.join(",")])
      }
      return { round: { locked: true, published: sent.length, full: (outOfTime || rows.length === batchSize) && failure === undefined }, failure }
    })
    // The round's own statements are bookkeeping, run every `pollInterval` even when idle: traced,
    // an idle worker would export a trace per poll (some 15 spans a second). Only publishes are.
    const transaction = sql.withTransaction(round).pipe(
      Effect.catchCause((cause) => {
        const lost = lostConnection(cause)
        return lost === undefined ? Effect.failCause(cause) : Effect.fail(lost)
      }),
      Effect.mapError(sqlFailure("relay")),
      Effect.withTracerEnabled(false)
    )
    // The transaction runs in a fiber that an interruption of this one does not reach: interrupted,
    // this one stops its publishing and waits, bounded, for its marks and commit.
    const { round: done, failure } = yield* Effect.uninterruptibleMask((restore) =>
      Effect.flatMap(Effect.forkDetach(transaction), (fiber) =>
        restore(Fiber.join(fiber)).pipe(Effect.onInterrupt(() => finishInterrupted(fiber, stop))))
    )
    if (failure !== undefined) return yield* failure
    return done
  })

/**
 * How long an interrupted round may take to mark the rows the stream confirmed and commit: a
 * database that does not answer must not hold a worker's shutdown.
 */
const interruptedRoundMillis = 5_000

/**
 * An interrupted round: stops its publishing and waits up to {@link interruptedRoundMillis} for it
 * to mark what was confirmed and commit. Past that, the round is interrupted (its statements are
 * cancelled by the driver and it rolls back, unless its commit is already under way) without being
 * waited for; then, or when it failed, the rows it published stay pending and are published again
 * by the next relay (the stream drops the copies its duplicate window still remembers): said as a
 * warning.
 */
const finishInterrupted = <A>(fiber: Fiber.Fiber<A, Outbox.OutboxError>, stop: Deferred.Deferred<void>) =>
  Effect.gen(function*() {
    yield* Deferred.succeed(stop, undefined)
    const ended = yield* Effect.timeoutOption(Fiber.await(fiber), Duration.millis(interruptedRoundMillis))
    let why: string
    if (ended._tag === "None") {
      // Interrupted now (rolled back, unless its commit is under way), but not waited for.
      yield* Effect.forkDetach(Fiber.interrupt(fiber), { startImmediately: true })
      why = `it did not commit within ${interruptedRoundMillis} ms`
    } else if (Exit.isFailure(ended.value)) {
      why = `it failed: ${ErrorSummary.fromCause(ended.value.cause).message}`
    } else return
    yield* Effect.logWarning(
      `outbox relay interrupted in a round that could not mark the rows it published (${why}); the next relay publishes ` +
        `them again, and the stream drops the copies its duplicate window still remembers`
    ).pipe(Effect.annotateLogs({ event: "outbox.relay_interrupted" }))
  })

/** `publish`, cut after `millis` (then `onCut`, and it succeeds: the round ends there); uncut without `millis`. */
const cutAt = <E>(publish: Effect.Effect<void, E>, millis: number | undefined, onCut: () => void): Effect.Effect<void, E> =>
  millis === undefined ? publish : Effect.flatMap(Effect.timeoutOption(publish, Duration.millis(Math.max(1, millis))), (confirmed) =>
    Effect.sync(() => {
      if (confirmed._tag === "None") onCut()
    }))

/** Whether the relay failed because its table does not exist (SQLSTATE 42P01, undefined_table). */
const isMissingTable = (error: Outbox.OutboxError | Outbox.PublishFailed): boolean =>
  error._tag === "OutboxError" && Predicate.hasProperty(error.cause, "_tag") && error.cause._tag === "SqlError" && sqlState(error.cause as SqlError) === "42P01"

const sqlFailure = (what: string) => (cause: SqlError) =>
  new Outbox.OutboxError({ message: `outbox ${what}: ${connectionLost(cause) ?? cause.message}`, cause })

/**
 * The first `SqlError` of a round that ended with the connection lost, or `undefined` for any
 * other end. effect/sql rolls a failed transaction back under `orDie`, so on a dead connection the
 * round's own failure comes with (or as) `SqlError` defects; a dead connection commits nothing, so
 * nothing was marked sent, and the round failed as any lost statement would.
 */
const lostConnection = (cause: Cause.Cause<SqlError>): SqlError | undefined => {
  let first: SqlError | undefined
  let lost = false
  for (const reason of cause.reasons) {
    if (Cause.isFailReason(reason)) first ??= reason.error
    else if (Cause.isDieReason(reason) && isSqlError(reason.defect)) {
      first ??= reason.defect
      lost ||= isConnectionLoss(reason.defect)
    } else return undefined
  }
  return lost ? first : undefined
}

/**
 * Deletes up to `cleanupBatch` rows sent longer than `retention` ago; returns how many. Fails with
 * `OutboxError` naming the option for a bad `table`, `cleanupBatch` or `retention` (negative, NaN).
 */
export const cleanup = (options: RelayOptions = {}): Effect.Effect<number, Outbox.OutboxError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    const limit = yield* checkCount("cleanupBatch", options.cleanupBatch, 1000)
    const retention = Duration.toMillis(yield* retentionOf(options))
    // Kept for ever: nothing to delete (PostgreSQL has no infinite interval to compare with).
    if (!Number.isFinite(retention)) return 0
    const deleted = yield* sql.unsafe<{ readonly n: number }>(
      `WITH old AS (SELECT seq FROM ${table} WHERE sent_at IS NOT NULL AND sent_at < now() - make_interval(secs => $1) ORDER BY sent_at LIMIT ${limit})
       , gone AS (DELETE FROM ${table} WHERE seq IN (SELECT seq FROM old) RETURNING 1)
       SELECT count(*)::int AS n FROM gone`,
      [retention / 1000]
    ).pipe(Effect.mapError(sqlFailure("clean-up")))
    return deleted[0]?.n ?? 0
  })

/**
 * The relay, until interrupted: rounds back to back while batches come full, a `pollInterval`
 * pause when idle, a jittered backoff (reset by a successful round) after a failed one, and the
 * clean-up at most once a minute. Failures are logged (`outbox.relay_failed`, with the innermost
 * cause) and retried, never returned. An interruption in the middle of a round (the worker
 * shutting down) stops its publishing, marks the rows the stream has confirmed sent and commits
 * them, waiting up to 5 seconds for the database, then ends the relay; only the row whose publish
 * it cut (and, past those 5 seconds, the round's rows: `outbox.relay_interrupted`, WARN) is
 * published again by the next relay. A relay that starts before its table exists (its migrations
 * run later in the start-up, or as a separate job) says so once (`outbox.relay_waiting`, INFO) and
 * keeps trying on the same backoff. A bad setting (a zero pause, a negative or NaN `retention`, a
 * `maxMessageBytes` that is not a positive integer...) fails with `OutboxError` naming it, before
 * the first round.
 *
 * At start, when the publisher has a `checkRelay` (`Publisher.outboxPublisher` does), the relay
 * gives it `maxMessageBytes` (pass the one `layer` has) and `roundBudget`, once, alongside the
 * first rounds: it logs a warning when the NATS server's `max_payload` is below `maxMessageBytes`,
 * or when the stream it publishes to deduplicates for less than the relay's republish period.
 */
export const relay = (
  options: RelayOptions = {}
): Effect.Effect<never, Outbox.OutboxError, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Effect.gen(function*() {
    // Reject bad settings before the first round.
    const settings = yield* relaySettings(options)
    const publisher = yield* Outbox.OutboxPublisher
    if (publisher.checkRelay !== undefined) {
      // Advisory, and not in the way of the first rounds; a defect in it is no reason to stop.
      yield* Effect.forkChild(
        publisher.checkRelay({ maxMessageBytes: settings.maxMessageBytes, roundBudget: settings.roundBudget }).pipe(
          Effect.timeoutOption("30 seconds"),
          Effect.catchDefect((defect) => Effect.logDebug(`outbox relay: the publisher's start check died: ${ErrorSummary.fromError(defect, "Defect").message}`))
        )
      )
    }
    const backoff = Schedule.exponential(settings.backoff, 2).pipe(
      Schedule.jittered,
      Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, settings.maxBackoff)))
    )
    let lastCleanup = 0
    // A full clean-up batch means more is due: the next round cleans up again.
    let cleanupBehind = false
    let waitingSaid = false
    const once = Effect.gen(function*() {
      const round = yield* Effect.result(relayRound(options))
      // The clean-up runs after a failed round too: a blocked row must not let sent rows pile up.
      const now = yield* Clock.currentTimeMillis
      if (cleanupBehind || now - lastCleanup >= 60_000) {
        lastCleanup = now
        // Bookkeeping, like a round's statements: not traced.
        const deleted = yield* cleanup(options).pipe(Effect.withTracerEnabled(false))
        cleanupBehind = deleted >= settings.cleanupBatch
        if (deleted > 0) yield* Effect.logDebug(`outbox clean-up deleted ${deleted} sent rows`)
      }
      if (round._tag === "Failure") return yield* Effect.fail(round.failure)
      waitingSaid = false
      if (!round.success.full) yield* Effect.sleep(settings.pollInterval)
    }).pipe(
      // A defect would end the relay without a word while rows pile up: it is a failed round too.
      Effect.catchDefect((defect) =>
        Effect.fail(new Outbox.OutboxError({ message: `outbox relay: unexpected defect: ${ErrorSummary.fromError(defect, "Defect").message}`, cause: defect }))
      ),
      Effect.tapError((error) => {
        if (isMissingTable(error)) {
          if (waitingSaid) return Effect.logDebug("outbox relay: still waiting for its table")
          waitingSaid = true
          return Effect.logInfo(
            `outbox relay: table ${options.table ?? Table.defaultOutboxTable} does not exist yet; waiting for the migrations ` +
              `(Migrations.run at start-up, or jetworker migrate)`
          ).pipe(Effect.annotateLogs({ event: "outbox.relay_waiting" }))
        }
        const summary = ErrorSummary.describe(ErrorSummary.fromError(error))
        if (error._tag === "PublishFailed" && !error.retryable) {
          // Retrying cannot help, and nothing may be skipped: the rows behind it wait for a person.
          return Effect.logError(
            `outbox relay blocked: ${error.message}; the rows recorded after it wait until it is fixed or deleted`
          ).pipe(Effect.annotateLogs({ event: "outbox.relay_blocked", error: summary }))
        }
        return Effect.logWarning(`outbox relay round failed; retrying with backoff: ${error.message}`).pipe(
          Effect.annotateLogs({ event: "outbox.relay_failed", error: summary })
        )
      })
    )
    // The backoff never ends, so no failure gets past it (`orDie` only narrows the type).
    return yield* once.pipe(Effect.retry(backoff), Effect.orDie, Effect.forever)
  })

/** A duration option that must be positive: a zero pause would make the relay spin. */
const positive = (name: string, value: Duration.Input | undefined, fallback: Duration.Input): Effect.Effect<Duration.Duration, Outbox.OutboxError> =>
  Effect.flatMap(duration(name, value, fallback), (parsed) =>
    Duration.isGreaterThan(parsed, Duration.zero)
      ? Effect.succeed(parsed)
      : Effect.fail(new Outbox.OutboxError({ message: `${name} must be longer than zero, got ${Duration.format(parsed)}` })))

/**
 * The relay's settings, checked: a bad one fails with `OutboxError` naming it. The pauses must be
 * positive and `maxBackoff` at least `backoff`: otherwise a relay blocked on a row (or idle) would
 * loop without a pause, a transaction and an ERROR line each time.
 */
const relaySettings = (options: RelayOptions) =>
  Effect.gen(function*() {
    yield* checkCount("batchSize", options.batchSize, 100)
    yield* quoted(options.table ?? Table.defaultOutboxTable)
    yield* retentionOf(options)
    const roundBudget = yield* positive("roundBudget", options.roundBudget, "30 seconds")
    const maxMessageBytes = yield* maxMessageBytesOf(options)
    const backoff = yield* positive("backoff", options.backoff, "200 millis")
    const maxBackoff = yield* positive("maxBackoff", options.maxBackoff, "10 seconds")
    if (Duration.isLessThan(maxBackoff, backoff)) {
      return yield* new Outbox.OutboxError({
        message: `maxBackoff must be at least backoff, got maxBackoff ${Duration.format(maxBackoff)} and backoff ${Duration.format(backoff)}`
      })
    }
    return {
      cleanupBatch: yield* checkCount("cleanupBatch", options.cleanupBatch, 1000),
      pollInterval: yield* positive("pollInterval", options.pollInterval, "200 millis"),
      backoff,
      maxBackoff,
      roundBudget,
      maxMessageBytes
    }
  })

/**
 * Runs the relay as a scoped fiber for as long as the layer lives (its scope's end interrupts it).
 * Building it fails with `OutboxError` naming a bad setting, as {@link relay} does.
 */
export const layerRelay = (
  options: RelayOptions = {}
): Layer.Layer<never, Outbox.OutboxError, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Layer.effectDiscard(Effect.gen(function*() {
    yield* relaySettings(options)
    yield* Effect.forkScoped(Effect.ignore(relay(options)))
  }))

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
 * the stream's duplicate window turns into a duplicate. A failed publish ends the round (the rows
 * before it are marked) and the relay retries after a jittered, capped backoff. Rows keep the
 * trace context (`traceparent`) of the transaction that wrote them, so the publish span continues
 * that trace. Sent rows are deleted after `retention` by a bounded clean-up.
 *
 * Order caveat: rows are published in the order of their sequence numbers, which is the order the
 * transactions inserted them, not always the order they committed; events of two transactions
 * committing at the same moment may be published in either order.
 *
 * @since 0.4.0
 */
import { Outbox, Telemetry } from "@jetworker/core"
import { Clock, Duration, Effect, Layer, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import * as Table from "./internal/table.ts"

/** Where the outbox lives. */
export interface Options {
  /**
   * The outbox table, a lowercase identifier optionally qualified by a schema. It must have the
   * shape the migrations create. Default: `"jetworker_outbox"`.
   */
  readonly table?: string | undefined
}

const quoted = (name: string): Effect.Effect<string, Outbox.OutboxError> => {
  const table = Table.quote(name)
  return table === undefined
    ? Effect.fail(new Outbox.OutboxError({ message: Table.invalidMessage(name).replace("idempotency", "outbox") }))
    : Effect.succeed(table)
}

/** The `Outbox` port on the current `SqlClient`: `record` inserts a row in the current transaction. */
export const make = (options: Options = {}): Effect.Effect<Outbox.Outbox["Service"], Outbox.OutboxError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    return {
      record: (message) =>
        Effect.gen(function*() {
          const span = yield* Effect.option(Effect.currentSpan)
          const traceparent = span._tag === "Some" ? Telemetry.formatTraceparent(span.value) : null
          const headers = message.headers === undefined || message.headers.length === 0 ? null : JSON.stringify(message.headers)
          yield* sql.unsafe(
            `INSERT INTO ${table} (id, subject, payload, headers, traceparent) VALUES ($1, $2, $3, $4::jsonb, $5)`,
            [message.id, message.subject, message.payload, headers, traceparent]
          )
        }).pipe(
          Effect.mapError((cause) => new Outbox.OutboxError({ message: `could not record ${message.id} in the outbox: ${cause.message}`, cause }))
        )
    }
  })

/** Provides `Outbox` on the application's `SqlClient`. */
export const layer = (options: Options = {}): Layer.Layer<Outbox.Outbox, Outbox.OutboxError, SqlClient.SqlClient> =>
  Layer.effect(Outbox.Outbox, make(options))

/** How the relay runs. */
export interface RelayOptions extends Options {
  /** Rows published per round (one transaction), 1 to 10 000. Default: 100. */
  readonly batchSize?: number | undefined
  /** How long the relay waits after a round that found nothing (or not the lock). Default: 200 millis. */
  readonly pollInterval?: Duration.Input | undefined
  /** The first delay after a failed round; it doubles (jittered) up to `maxBackoff`. Default: 200 millis. */
  readonly backoff?: Duration.Input | undefined
  /** The longest delay between failed rounds. Default: 10 seconds. */
  readonly maxBackoff?: Duration.Input | undefined
  /** How long sent rows are kept before the clean-up deletes them. Default: 1 hour. */
  readonly retention?: Duration.Input | undefined
  /** Rows the clean-up deletes at most per run (it runs at most once a minute). Default: 1000. */
  readonly cleanupBatch?: number | undefined
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
  readonly headers: ReadonlyArray<readonly [string, string]> | null
  readonly traceparent: string | null
}


const checkCount = (name: string, value: number | undefined, fallback: number): Effect.Effect<number, Outbox.OutboxError> => {
  const count = value ?? fallback
  return Number.isInteger(count) && count >= 1 && count <= 10_000
    ? Effect.succeed(count)
    : Effect.fail(new Outbox.OutboxError({ message: `${name} must be an integer from 1 to 10000, got ${count}` }))
}

/**
 * One round of the relay: under the outbox's lock, publish up to `batchSize` pending rows in order
 * and mark them sent, in one transaction. A failed publish ends the round after marking the rows
 * published before it, and fails with it.
 */
export const relayRound = (
  options: RelayOptions = {}
): Effect.Effect<Round, Outbox.OutboxError | Outbox.PublishFailed, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const publisher = yield* Outbox.OutboxPublisher
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    const batchSize = yield* checkCount("batchSize", options.batchSize, 100)
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
      for (const row of rows) {
        const result = yield* Effect.result(publisher.publish(
          { subject: row.subject, id: row.id, payload: row.payload, headers: row.headers ?? undefined },
          row.traceparent ?? undefined
        ))
        if (result._tag === "Failure") {
          failure = result.failure
          break
        }
        sent.push(row.position)
      }
      if (sent.length > 0) {
        yield* sql.unsafe(`UPDATE ${table} SET sent_at = now() WHERE seq = ANY(string_to_array($1, ',')::bigint[])`, [sent.join(",")])
      }
      return { round: { locked: true, published: sent.length, full: rows.length === batchSize && failure === undefined }, failure }
    })
    const { round: done, failure } = yield* sql.withTransaction(round).pipe(Effect.mapError(sqlFailure("relay")))
    if (failure !== undefined) return yield* failure
    return done
  })

const sqlFailure = (what: string) => (cause: SqlError) =>
  new Outbox.OutboxError({ message: `outbox ${what}: ${cause.message}`, cause })

/** Deletes up to `cleanupBatch` rows sent longer than `retention` ago; returns how many. */
export const cleanup = (options: RelayOptions = {}): Effect.Effect<number, Outbox.OutboxError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const table = yield* quoted(options.table ?? Table.defaultOutboxTable)
    const limit = yield* checkCount("cleanupBatch", options.cleanupBatch, 1000)
    const retention = Duration.toMillis(Duration.fromInputUnsafe(options.retention ?? "1 hour"))
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
 * clean-up at most once a minute. Failures are logged (`outbox.relay_failed`) and retried, never
 * returned; an interruption in the middle of a round rolls it back (its rows are published again).
 */
export const relay = (
  options: RelayOptions = {}
): Effect.Effect<never, Outbox.OutboxError, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Effect.gen(function*() {
    // Reject bad settings before the first round.
    yield* checkCount("batchSize", options.batchSize, 100)
    yield* checkCount("cleanupBatch", options.cleanupBatch, 1000)
    yield* quoted(options.table ?? Table.defaultOutboxTable)
    const poll = Duration.fromInputUnsafe(options.pollInterval ?? "200 millis")
    const maxBackoff = Duration.fromInputUnsafe(options.maxBackoff ?? "10 seconds")
    const backoff = Schedule.exponential(Duration.fromInputUnsafe(options.backoff ?? "200 millis"), 2).pipe(
      Schedule.jittered,
      Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, maxBackoff)))
    )
    let lastCleanup = 0
    const once = Effect.gen(function*() {
      const round = yield* relayRound(options)
      const now = yield* Clock.currentTimeMillis
      if (now - lastCleanup >= 60_000) {
        lastCleanup = now
        const deleted = yield* cleanup(options)
        if (deleted > 0) yield* Effect.logDebug(`outbox clean-up deleted ${deleted} sent rows`)
      }
      if (!round.full) yield* Effect.sleep(poll)
    }).pipe(
      Effect.tapError((error) =>
        Effect.logWarning(`outbox relay round failed; retrying with backoff: ${error.message}`).pipe(
          Effect.annotateLogs({ event: "outbox.relay_failed" })
        )
      )
    )
    // The backoff never ends, so no failure gets past it (`orDie` only narrows the type).
    return yield* once.pipe(Effect.retry(backoff), Effect.orDie, Effect.forever)
  })

/** Runs the relay as a scoped fiber for as long as the layer lives (its scope's end interrupts it). */
export const layerRelay = (
  options: RelayOptions = {}
): Layer.Layer<never, Outbox.OutboxError, SqlClient.SqlClient | Outbox.OutboxPublisher> =>
  Layer.effectDiscard(Effect.gen(function*() {
    yield* checkCount("batchSize", options.batchSize, 100)
    yield* checkCount("cleanupBatch", options.cleanupBatch, 1000)
    yield* quoted(options.table ?? Table.defaultOutboxTable)
    yield* Effect.forkScoped(Effect.ignore(relay(options)))
  }))

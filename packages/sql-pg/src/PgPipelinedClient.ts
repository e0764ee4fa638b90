/**
 * A PostgreSQL client (`PgClient` and `SqlClient`, as `@effect/sql-pg`'s `PgClient.layer` provides)
 * whose transactions can send their `BEGIN` together with their first statement, so that
 * `PgIdempotencyStore.commit` pays three round trips to PostgreSQL instead of four: `BEGIN`, the
 * dedup row in one write, then the handler's statements, then `COMMIT`.
 *
 * Use it in place of `PgClient.layer` where handlers commit through the idempotency store, one
 * transaction per message. Everything else behaves as on `@effect/sql-pg`'s client:
 *
 * - Sessions are exclusive: one statement, transaction, stream or listener at a time, from a pool
 *   of `maxConnections` (default 10). `multiplex` is not offered: `commitStatement` and other
 *   statements that can share a session belong on a client of their own.
 * - A transaction's `BEGIN` is held back until its first statement. Only a statement written for
 *   it, the store's dedup row, leaves with it; any other first statement waits for its `BEGIN`
 *   first, as on `@effect/sql-pg`'s client, and a transaction that sends nothing sends no `BEGIN`
 *   and no `COMMIT`. Savepoints, `afterCommit`, `sql.reserve`, streams, `listen` and `notify` work
 *   as there.
 * - The pipelined `BEGIN` cannot let the dedup row commit alone: each pipelined statement is an
 *   extended-query cycle of its own, so that `BEGIN` is `BEGIN DEFERRABLE` (which changes nothing
 *   for a transaction that writes) and the row's statement fails unless its transaction is
 *   deferrable while the session's default is not (`BEGIN did not open a transaction block`): true
 *   only inside the block that `BEGIN` opened. On a session whose `default_transaction_deferrable`
 *   is on, the guard fails inside the block too: that commit starts its transaction again without
 *   it, and the client stops pipelining (four round trips a commit, as on `@effect/sql-pg`).
 * - A transaction's session (and one from `sql.reserve`) is not pinned (the driver pipelines only
 *   unpinned sessions), and the driver cannot cancel an unpinned statement. So a statement of a
 *   transaction (or of a reserved session) interrupted while on the wire (a handler timeout, a
 *   shutdown's deadline) does not wait for its answer: the session is taken out of the pool and
 *   its backend terminated, from a connection of its own (bounded by 5 s), which rolls the
 *   transaction back; the pool opens another session when it needs one. `@effect/sql-pg`'s client cancels the statement and keeps the session instead. A
 *   stream inside a transaction pins its session, and the statements after it are cancelled as
 *   there. Statements outside transactions run on pinned sessions, as there.
 * - Ending a backend needs the right to: the same role, or `pg_signal_backend`.
 * - {@link send} runs a statement of a transaction without waiting for its answer, so that it
 *   leaves with what is sent next: an effect whose writes are sent pays one round trip for all of
 *   them and the `COMMIT`, two per commit in all. A sent statement that fails fails the
 *   transaction with its own error.
 * - Its `withTransaction` and `afterCommit` are its own, with `effect/sql`'s behaviour in fewer
 *   steps of the runtime: the `sql.transaction` span is recorded only when a tracing backend is
 *   installed, and a statement inside a transaction takes no scope of its own. With a tracing
 *   backend the dedup row still leaves with its `BEGIN`, in a span like its other statements'.
 * - A statement or stream of a transaction run from a fiber that outlived it (forked in the
 *   transaction, still running after its commit or rollback) dies, as `afterCommit` does there.
 *   On `@effect/sql-pg`'s client it runs on the session the transaction gave back to the pool:
 *   outside any transaction, or inside the next one on that session, committed or rolled back
 *   with work it has nothing to do with.
 *
 * @since 0.1.0
 */
import { PgClient, PgConnection, PgPool } from "@effect/sql-pg"
import { Config, Context, Duration, Effect, Exit, Layer, Scope } from "effect"
import type * as Reactivity from "effect/reactivity/Reactivity"
import { SqlClient } from "effect/sql"
import type { SqlError } from "effect/sql/SqlError"
import { SqlError as SqlErrorClass, UnknownError } from "effect/sql/SqlError"
import * as Statement from "effect/sql/Statement"
import { type Pipelining, SessionConnection, TransactionConnection } from "./internal/pipelinedSession.ts"
import * as Transactions from "./internal/transactions.ts"

/**
 * The client's settings: `@effect/sql-pg`'s pool settings (`url` or host and port, `database`,
 * `username`, `password`, `maxConnections`, `startupParameters`, `prepare`, ...), without
 * `multiplex` and `multiplexConcurrency`, which the client sets itself; and `sendWindow`, how many
 * statements a transaction may have sent with {@link send} without waiting for their answers
 * (default 256): the next one waits for them first, one round trip, which bounds what a
 * transaction that sends many holds. A positive integer.
 *
 * @since 0.1.0
 */
export type Options = Omit<PgClient.PgPoolConfig, "multiplex" | "multiplexConcurrency"> & {
  readonly sendWindow?: number | undefined
}

const defaultSendWindow = 256

/** Bound on ending the backend of a transaction interrupted in its first round (connecting included). */
const terminateTimeout = Duration.seconds(5)

/** A transaction control statement (prepared: it never changes). */
const control = (conn: TransactionConnection, sql: string): Effect.Effect<void, SqlError> =>
  Effect.asVoid(conn.execute(sql, [], undefined))

/**
 * Builds the client on a pool of its own, closed with the scope.
 *
 * @since 0.1.0
 */
export const make = (config: Options): Effect.Effect<PgClient.PgClient, SqlError, Scope.Scope | Reactivity.Reactivity> =>
  Effect.gen(function*() {
    const { sendWindow = defaultSendWindow, ...poolConfig } = config
    if (!Number.isSafeInteger(sendWindow) || sendWindow < 1) {
      return yield* new SqlErrorClass({
        reason: new UnknownError({
          cause: new Error(`sendWindow ${String(sendWindow)}`),
          message: `PgPipelinedClient: sendWindow must be a positive integer, got ${String(sendWindow)}`
        })
      })
    }
    // Exclusive sessions (one borrower each) that still pipeline what is sent without waiting.
    const pool = yield* PgPool.make({ ...poolConfig, multiplex: true, multiplexConcurrency: 1 })
    const pinned = Effect.map(pool.reserve, (session) => new SessionConnection(session))
    // Ends a session's backend from a connection of its own (the pool's may all be taken), bounded.
    const terminate = (session: PgConnection.PgConnection) =>
      Effect.scoped(Effect.flatMap(
        PgConnection.make(poolConfig),
        (side) => side.query("SELECT pg_terminate_backend($1)", [session.processId], false)
      )).pipe(
        Effect.timeout(terminateTimeout),
        Effect.catchCause((cause) =>
          Effect.logWarning(
            `PgPipelinedClient: could not end backend ${session.processId} of an interrupted transaction; ` +
              "its statement runs on, and its session is not reused",
            cause
          )
        )
      )
    const abandon = (session: PgConnection.PgConnection) => Effect.andThen(pool.invalidate(session), terminate(session))
    const pipelining: Pipelining = { enabled: true }
    const spanAttributes: ReadonlyArray<readonly [string, unknown]> = [
      ...(config.spanAttributes ? Object.entries(config.spanAttributes) : []),
      ["db.system.name", "postgresql"],
      ["db.namespace", config.database ?? config.username ?? "postgres"],
      ["server.address", config.host ?? "localhost"],
      ["server.port", config.port ?? 5432]
    ]
    const transactionAcquirer = Effect.flatMap(Effect.scope, (scope) =>
      Effect.map(pool.get, (session) => new TransactionConnection(session, scope, abandon, pipelining, spanAttributes, sendWindow)))
    const client = yield* SqlClient.make({
      acquirer: pinned,
      // A statement in a transaction runs on its connection without a scope of its own.
      borrower: (f) => Effect.scoped(Effect.flatMap(pinned, f)),
      transactionAcquirer,
      compiler: PgClient.makeCompiler(config.transformQueryNames, config.transformJson),
      driver: "pg",
      // Its transactions are the ones below, so no transaction statements are configured here.
      spanAttributes,
      transformRows: config.transformResultNames
        ? Statement.defaultTransforms(config.transformResultNames, config.transformJson).array
        : undefined
    })
    // Its own `withTransaction` and `afterCommit`: `effect/sql`'s behaviour in fewer steps of the
    // runtime (`internal/transactions.ts`). Control statements are prepared: they never change.
    const transactions = Transactions.make({
      transactionService: client.transactionService,
      spanAttributes,
      acquire: transactionAcquirer,
      begin: (conn, statement) =>
        statement === undefined ? conn.hold : Effect.asVoid(conn.executeUnprepared(statement, [], undefined)),
      commit: (conn) => conn.commit(),
      rollback: (conn, exit) => conn.rollingBack(Exit.hasInterrupts(exit)),
      savepoint: (conn, id) => control(conn, `SAVEPOINT effect_sql_${id}`),
      releaseSavepoint: (conn, id) => conn.ending(`RELEASE SAVEPOINT effect_sql_${id}`),
      rollbackSavepoint: (conn, id) => conn.ending(`ROLLBACK TO SAVEPOINT effect_sql_${id}`)
    })
    const pgClient: PgClient.PgClient = Object.assign(client, transactions, {
      [PgClient.TypeId]: PgClient.TypeId,
      config: poolConfig,
      json: (value: unknown) => Statement.fragment([Statement.custom<PgClient.PgCustom>("PgJson")(value, undefined, undefined)]),
      listen: (channel: string) => Effect.flatMap(pool.reserve, (session) => session.listen(channel)),
      notify: (channel: string, payload: string) =>
        Effect.asVoid(Effect.scoped(Effect.flatMap(pinned, (conn) => conn.executeRaw(`SELECT pg_notify($1, $2)`, [channel, payload]))))
    })
    return pgClient
  })

/**
 * Runs `statement` in the current transaction without waiting for its answer, where that saves a
 * round trip: in a transaction of this client (not a savepoint) whose first statement has
 * answered, the statement is queued on the transaction's session and leaves with what is sent
 * next, the next statement or the `COMMIT`. A handler of `IdempotencyStore.commit` whose effect is
 * writes it does not read the results of then costs two round trips per message, however many
 * writes it makes: `BEGIN` with the dedup row, then the writes with `COMMIT`.
 *
 * ```ts
 * import { IdempotencyStore } from "@jetworker/core"
 * import { PgPipelinedClient } from "@jetworker/sql-pg"
 * import { Effect } from "effect"
 * import { SqlClient } from "effect/sql"
 *
 * const transfer = (id: string, from: string, to: string, amount: number) =>
 *   IdempotencyStore.commit(id, Effect.gen(function*() {
 *     const sql = yield* SqlClient.SqlClient
 *     yield* PgPipelinedClient.send(sql`UPDATE accounts SET balance = balance - ${amount} WHERE id = ${from}`)
 *     yield* PgPipelinedClient.send(sql`UPDATE accounts SET balance = balance + ${amount} WHERE id = ${to}`)
 *   }))
 * ```
 *
 * Its failure fails the transaction, atomically: PostgreSQL rolls back at `COMMIT` a transaction in
 * which a statement failed, and the transaction ends with that statement's `SqlError` (the first
 * one's, when several failed); a statement waited for after it fails with it too. The code after
 * `send` does not see it: it runs as if the statement had succeeded, so send only statements
 * that nothing outside the transaction depends on. Statements run in the order they were sent and
 * run, so a later one reads what an earlier one wrote. When the transaction is interrupted, a
 * sent statement still on the wire ends its session, as one waited for does.
 *
 * Anywhere else (outside a transaction, in a savepoint, on another client, before the
 * transaction's first statement has answered, after a stream pinned its session) it runs the
 * statement and waits for it, as `yield* statement` does. Called from a fiber that outlived its
 * transaction (after the commit or the rollback), it dies, as `afterCommit` does there.
 *
 * @since 0.1.0
 */
export const send = (statement: Statement.Statement<unknown>): Effect.Effect<void, SqlError, SqlClient.SqlClient> =>
  Effect.withFiber((fiber) => {
    const sql = Context.getUnsafe(fiber.context, SqlClient.SqlClient)
    const transaction = Context.getOrUndefined(fiber.context, sql.transactionService)
    const connection = transaction?.[0]
    // Anywhere else the statement runs as any statement; from a fiber that outlived its
    // transaction it dies there.
    if (transaction?.[1] === 0 && connection instanceof TransactionConnection && connection.canSend) return connection.send(statement)
    return Effect.asVoid(statement)
  })

/**
 * The client as a layer providing `PgClient` and `SqlClient`.
 *
 * @since 0.1.0
 */
export const layer = (config: Options): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError> =>
  PgClient.layerFrom(make(config))

/**
 * {@link layer} with its settings read from a `Config`, for example
 * `Config.all({ url: Config.Redacted("DATABASE_URL") })`.
 *
 * @since 0.1.0
 */
export const layerConfig = (
  config: Config.Config<Options>
): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, Config.ConfigError | SqlError> =>
  PgClient.layerFrom(Effect.gen(function*() {
    return yield* make(yield* config)
  }))

/**
 * The connections of `PgPipelinedClient`: what `effect/sql` runs statements and transactions on.
 *
 * A transaction's session comes from a pool whose sessions are exclusive (one borrower each) but
 * multiplexed, so that statements sent without waiting leave in one write. `BEGIN` is held back
 * until the transaction's first statement: when that is a statement written with
 * {@link transactionGuard} (the idempotency store's dedup row), `BEGIN`, a `SET LOCAL` marking the
 * transaction and the statement leave together, one round trip for three; any other first
 * statement waits for its `BEGIN` as usual.
 *
 * Why the guard: each pipelined statement is its own extended-query cycle, so a `BEGIN` that failed
 * would leave the next statement to commit on its own. The guard makes that statement fail instead
 * unless the `SET LOCAL` sent after `BEGIN` holds, which it does only inside the transaction block.
 */
import type { PgConnection } from "@effect/sql-pg"
import { type Array as Arr, Effect, Exit, Fiber, Scope, Semaphore, Stream } from "effect"
import type { Connection } from "effect/sql/SqlConnection"
import type { SqlError } from "effect/sql/SqlError"
import { SqlError as SqlErrorClass, UnknownError } from "effect/sql/SqlError"

/**
 * What `PgPipelinedClient` passes to `effect/sql` as its `BEGIN`: a transaction's connection holds
 * it back instead of sending it (and sends a plain `BEGIN` later). Were it ever sent, it would open
 * a transaction all the same.
 */
export const beginMarker = "BEGIN /* @jetworker/sql-pg: held back until the first statement */"

/** The setting the `SET LOCAL` after a held-back `BEGIN` sets; it lives as long as the transaction. */
const markerSetting = "jetworker.transaction"

const setLocal = `SET LOCAL ${markerSetting} = 'open'`

/**
 * A condition for a statement's `WHERE` that is true inside a transaction this module opened, and
 * otherwise fails the statement (an `integer` that does not parse, naming the cause), so that the
 * statement never commits on its own.
 */
export const transactionGuard = `CAST(CASE WHEN current_setting('${markerSetting}', true) = 'open' THEN '1' ` +
  `ELSE 'jetworker: BEGIN did not open a transaction block' END AS integer) = 1`

type Rows = ReadonlyArray<PgConnection.Row>
type TransformRows = (<A extends object>(row: ReadonlyArray<A>) => ReadonlyArray<A>) | undefined

const emptyRows: Rows = []

const startAtOnce = { startImmediately: true } as const

/** A session used for one statement or one reservation: pinned, as `@effect/sql-pg`'s own are. */
export class SessionConnection implements Connection {
  readonly session: PgConnection.PgConnection

  constructor(session: PgConnection.PgConnection) {
    this.session = session
  }

  protected withSession<A>(f: (session: PgConnection.PgConnection) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return f(this.session)
  }

  execute(sql: string, params: ReadonlyArray<unknown>, transformRows: TransformRows): Effect.Effect<Rows, SqlError> {
    const rows = this.withSession((session) => Effect.map(session.query(sql, params), (result) => result.rows))
    return transformRows === undefined ? rows : Effect.map(rows, transformRows)
  }

  executeRaw(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<unknown, SqlError> {
    return this.withSession((session) => session.query(sql, params))
  }

  executeWithoutTransform(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<Rows, SqlError> {
    return this.execute(sql, params, undefined)
  }

  executeValues(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<ReadonlyArray<ReadonlyArray<unknown>>, SqlError> {
    return this.withSession((session) => session.queryValues(sql, params))
  }

  executeValuesUnprepared(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<ReadonlyArray<ReadonlyArray<unknown>>, SqlError> {
    return this.withSession((session) => session.queryValues(sql, params, false))
  }

  executeUnprepared(sql: string, params: ReadonlyArray<unknown>, transformRows: TransformRows): Effect.Effect<Rows, SqlError> {
    const rows = this.withSession((session) => Effect.map(session.query(sql, params, false), (result) => result.rows))
    return transformRows === undefined ? rows : Effect.map(rows, transformRows)
  }

  executeStream(sql: string, params: ReadonlyArray<unknown>, transformRows: TransformRows): Stream.Stream<PgConnection.Row, SqlError> {
    const rows = Stream.unwrap(this.withSession((session) => Effect.succeed(session.stream(sql, params))))
    return transformRows === undefined
      ? rows
      : Stream.mapArray(rows, (chunk) => transformRows(chunk) as Arr.NonEmptyReadonlyArray<PgConnection.Row>)
  }

  /** `COMMIT`, failing when PostgreSQL answers `ROLLBACK` (the transaction had aborted). */
  commit(): Effect.Effect<void, SqlError> {
    return this.withSession((session) => Effect.flatMap(session.query("COMMIT"), (result) => committedOrFailure(result)))
  }
}

const committedOrFailure = (result: PgConnection.Result): Effect.Effect<void, SqlError> =>
  result.command === "ROLLBACK"
    ? Effect.fail(
      new SqlErrorClass({
        reason: new UnknownError({
          cause: new Error("COMMIT rolled back an aborted transaction"),
          message: "PgPipelinedClient: COMMIT rolled back an aborted transaction",
          operation: "commit"
        })
      })
    )
    : Effect.void

/**
 * Where a {@link TransactionConnection} is: `idle` (no transaction asked for: a reservation),
 * `held` (`BEGIN` asked for, nothing sent), `opening` (`BEGIN` on the wire), `open`, `failed`
 * (`BEGIN` failed: there is no transaction, and nothing more is sent), `abandoned` (interrupted
 * with a statement on the wire: the session was ended, and nothing more is sent).
 */
type State = "idle" | "held" | "opening" | "open" | "failed" | "abandoned"

const notOpen = (state: State): SqlError =>
  new SqlErrorClass({
    reason: new UnknownError({
      cause: new Error(`transaction ${state}`),
      message: state === "failed"
        ? "PgPipelinedClient: the transaction's BEGIN failed, so nothing more is sent in it"
        : "PgPipelinedClient: the transaction's session was ended when it was interrupted, so nothing more is sent in it",
      operation: "execute"
    })
  })

/**
 * A transaction's session (also what `sql.reserve` returns): `base` is exclusive and unpinned, so
 * what is sent without waiting shares a write. The driver cannot cancel an unpinned statement, so
 * a statement interrupted on the wire has the session ended instead (`abandon`: taken out of the
 * pool and its backend terminated, which rolls its transaction back) rather than waited for. A
 * stream in the transaction pins the session (the driver's streams need it); later statements go
 * through the pinned view, which the driver cancels itself.
 */
export class TransactionConnection extends SessionConnection {
  private state: State = "idle"
  private pinned: PgConnection.PgConnection | undefined
  private readonly base: PgConnection.PgConnection
  private readonly scope: Scope.Scope
  private readonly abandon: Effect.Effect<void>
  /** Held while `BEGIN` is on the wire, and while pinning: statements of other fibers wait. */
  private readonly lock = Semaphore.makeUnsafe(1)

  /** `abandon` takes the session out of use for good and ends its backend, bounded. */
  constructor(base: PgConnection.PgConnection, scope: Scope.Scope, abandon: Effect.Effect<void>) {
    super(base)
    this.base = base
    this.scope = scope
    this.abandon = abandon
  }

  /** Whether a transaction is open on the server, to roll back. */
  get started(): boolean {
    return this.state === "open"
  }

  /** Whether the next statement can be sent together with the held `BEGIN` (see {@link executeFirst}). */
  get canPipelineFirst(): boolean {
    return this.state === "held"
  }

  /** A statement on the unpinned session; interrupted on the wire, the session is abandoned. */
  private onBase<A>(run: Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.onInterrupt(run, () =>
      Effect.suspend(() => {
        this.state = "abandoned"
        return this.abandon
      }))
  }

  /** Sends the held `BEGIN` and waits for it, under the lock. */
  private readonly begin: Effect.Effect<void, SqlError> = this.lock.withPermit(Effect.suspend(() => {
    if (this.state !== "held") return Effect.void
    this.state = "opening"
    const sent = this.pinned === undefined ? this.onBase(this.base.query("BEGIN")) : this.pinned.query("BEGIN")
    return Effect.matchEffect(sent, {
      onFailure: (error) => {
        if (this.state === "opening") this.state = "failed"
        return Effect.fail(error)
      },
      onSuccess: () => {
        this.state = "open"
        return Effect.void
      }
    })
  }))

  protected override withSession<A>(f: (session: PgConnection.PgConnection) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.suspend(() => {
      switch (this.state) {
        case "idle":
        case "open":
          return this.pinned === undefined ? this.onBase(f(this.base)) : f(this.pinned)
        case "held":
        case "opening":
          return Effect.andThen(this.begin, this.withSession(f))
        case "failed":
        case "abandoned":
          return Effect.fail(notOpen(this.state))
      }
    })
  }

  override execute(sql: string, params: ReadonlyArray<unknown>, transformRows: TransformRows): Effect.Effect<Rows, SqlError> {
    if (sql !== beginMarker) return super.execute(sql, params, transformRows)
    return Effect.suspend(() => {
      if (this.state !== "idle") return super.execute(sql, params, transformRows)
      this.state = "held"
      return Effect.succeed(emptyRows)
    })
  }

  override executeStream(
    sql: string,
    params: ReadonlyArray<unknown>,
    transformRows: TransformRows
  ): Stream.Stream<PgConnection.Row, SqlError> {
    const pin = Effect.andThen(
      this.state === "held" || this.state === "opening" ? this.begin : Effect.void,
      this.lock.withPermit(Effect.suspend(() =>
        this.pinned !== undefined
          ? Effect.void
          : Effect.map(Scope.provide(this.base.pin, this.scope), (pinned) => {
            this.pinned = pinned
          })
      ))
    )
    return Stream.unwrap(Effect.as(pin, super.executeStream(sql, params, transformRows)))
  }

  /**
   * Runs `sql`, which must hold {@link transactionGuard} in its `WHERE`, as the transaction's first
   * statement: with the held `BEGIN` and the `SET LOCAL`, in one write. Anywhere else (no `BEGIN`
   * held) it runs as any statement.
   */
  executeFirst(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<Rows, SqlError> {
    return Effect.suspend(() =>
      this.state !== "held"
        ? this.execute(sql, params, undefined)
        // Under the lock, statements of other fibers wait for the round. No state seen under it
        // takes the lock again: `held` is handled here, and `opening` exists only under it.
        : this.lock.withPermit(Effect.suspend(() => {
          if (this.state !== "held") return this.execute(sql, params, undefined)
          this.state = "opening"
          return this.onBase(this.firstRound(sql, params))
        }))
    )
  }

  /**
   * `BEGIN` and the `SET LOCAL` submitted by fibers started at once, then the statement by this
   * one: in this order, from one synchronous stretch, so that they share the session's next write.
   * The statement succeeds only if both did (its guard); what `BEGIN` answered sets the state.
   */
  private firstRound(sql: string, params: ReadonlyArray<unknown>): Effect.Effect<Rows, SqlError> {
    return Effect.flatMap(Effect.forkChild(this.base.query("BEGIN"), startAtOnce), (begin) =>
      Effect.flatMap(Effect.forkChild(Effect.ignore(this.base.query(setLocal)), startAtOnce), () =>
        Effect.flatMap(Effect.exit(this.base.query(sql, params)), (statement) =>
          Effect.flatMap(Fiber.await(begin), (began): Effect.Effect<Rows, SqlError> => {
            if (this.state === "opening") this.state = Exit.isSuccess(began) ? "open" : "failed"
            // A failed BEGIN is the cause worth reporting (the statement then failed its guard).
            if (Exit.isFailure(began)) return Effect.failCause(began.cause)
            return Exit.isSuccess(statement) ? Effect.succeed(statement.value.rows) : Effect.failCause(statement.cause)
          }))))
  }

  /** `COMMIT`; nothing when nothing was sent. */
  override commit(): Effect.Effect<void, SqlError> {
    return Effect.suspend(() => {
      if (this.state !== "held") return super.commit()
      this.state = "idle"
      return Effect.void
    })
  }
}

/**
 * The connections of `PgPipelinedClient`: what `effect/sql` runs statements and transactions on.
 *
 * A transaction's session comes from a pool whose sessions are exclusive (one borrower each) but
 * multiplexed, so that statements sent without waiting leave in one write. `BEGIN` is held back
 * until the transaction's first statement: when that is a statement written with
 * {@link transactionGuard} (the idempotency store's dedup row), `BEGIN DEFERRABLE` and the
 * statement leave together, one round trip for two; any other first statement waits for its
 * `BEGIN` as usual.
 *
 * Why the guard: each pipelined statement is its own extended-query cycle, so a `BEGIN` that failed
 * would leave the next statement to commit on its own. The guard makes that statement fail instead
 * unless its transaction is `DEFERRABLE` while the session's default is not, which holds only
 * inside the transaction block that `BEGIN DEFERRABLE` opened.
 */
import type { PgConnection } from "@effect/sql-pg"
import { type Array as Arr, Cause, Effect, Exit, Fiber, Option, Scope, Semaphore, Stream } from "effect"
import type { Connection } from "effect/sql/SqlConnection"
import type { SqlError } from "effect/sql/SqlError"
import { SqlError as SqlErrorClass, UnknownError } from "effect/sql/SqlError"
import { spanName } from "effect/sql/Statement"

/**
 * The `BEGIN` sent with a guarded first statement. `DEFERRABLE` is what the guard reads: it changes
 * nothing for a transaction that is not `SERIALIZABLE` and `READ ONLY`, which one that writes a
 * row cannot be.
 */
const beginMarked = "BEGIN DEFERRABLE"

/** The text the guard's failure carries (see {@link transactionGuard}). */
const guardFailure = "jetworker: BEGIN did not open a transaction block"

/**
 * A condition for a statement's `WHERE` that is true inside a transaction opened by
 * {@link beginMarked}, and otherwise fails the statement (an `integer` that does not parse, naming
 * the cause), so that it never commits on its own. Outside a transaction block
 * `transaction_deferrable` is the session's default, so a session whose default is on fails it
 * everywhere: safe, and then {@link TransactionConnection} stops pipelining on that client.
 */
export const transactionGuard = "CAST(CASE WHEN current_setting('transaction_deferrable') = 'on' " +
  "AND current_setting('default_transaction_deferrable') = 'off' " +
  `THEN '1' ELSE '${guardFailure}' END AS integer) = 1`

/** Whether `error` is the guard's failure: `BEGIN` ran, but the session's defaults defeat the guard. */
const isGuardFailure = (error: SqlError): boolean => {
  const cause = error.reason.cause
  const message = cause instanceof Error ? cause.message : typeof cause === "string" ? cause : ""
  return message.includes(guardFailure) || error.message.includes(guardFailure)
}

/** Shared by a client's transactions: whether a guarded first statement may leave with its `BEGIN`. */
export interface Pipelining {
  enabled: boolean
}

type Rows = ReadonlyArray<PgConnection.Row>
type TransformRows = (<A extends object>(row: ReadonlyArray<A>) => ReadonlyArray<A>) | undefined

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

/** The errors of statements sent without waiting, as reported (see {@link isSentFailure}). */
const sentFailures = new WeakSet<object>()

/**
 * Whether `error` is the failure of a statement sent without waiting (`PgPipelinedClient.send`),
 * reported by a later statement or the `COMMIT`: the failure of the effect that sent it, not of
 * the transaction's own statements.
 */
export const isSentFailure = (error: unknown): boolean => typeof error === "object" && error !== null && sentFailures.has(error)

/** The cause of the first failed statement among `exits`, its error marked as sent; `undefined` when none failed. */
const firstFailure = (exits: ReadonlyArray<Exit.Exit<unknown, SqlError>>): Cause.Cause<SqlError> | undefined => {
  for (const exit of exits) {
    if (Exit.isSuccess(exit)) continue
    const error = Cause.findErrorOption(exit.cause)
    if (Option.isSome(error)) sentFailures.add(error.value)
    return exit.cause
  }
  return undefined
}

/** Waits for `sent` (statements sent without waiting): the cause of the first that failed, if one did (see {@link firstFailure}). */
const sentFailure = (sent: ReadonlyArray<Fiber.Fiber<unknown, SqlError>>): Effect.Effect<Cause.Cause<SqlError> | undefined> =>
  Effect.map(Fiber.awaitAll(sent), firstFailure)

/**
 * The first failure of `sent`, or `otherwise`. They are on the session ahead of the statement that
 * failed with `otherwise`, so they have answered (or they are failing with the session) by the
 * time it has.
 */
const firstSentFailure = (
  sent: ReadonlyArray<Fiber.Fiber<unknown, SqlError>>,
  otherwise: SqlError
): Effect.Effect<never, SqlError> => Effect.flatMap(sentFailure(sent), (failure) => Effect.failCause(failure ?? Cause.fail(otherwise)))

/** A transaction's statement or stream from a fiber that outlived it, as a defect. */
const endedError = (what: string): Error =>
  new Error(`${what}: the transaction has already ended (this fiber outlived it)`)

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
  private readonly abandon: (session: PgConnection.PgConnection) => Effect.Effect<void>
  private readonly pipelining: Pipelining
  private readonly spanAttributes: ReadonlyArray<readonly [string, unknown]>
  private readonly sendWindow: number
  /** Held while `BEGIN` is on the wire, and while pinning: statements of other fibers wait. */
  private readonly lock = Semaphore.makeUnsafe(1)
  /** Statements sent without waiting ({@link send}), until the transaction ends. */
  private sent: Array<Fiber.Fiber<unknown, SqlError>> | undefined
  /** Whether the transaction has been committed or rolled back (its session may serve another). */
  ended = false

  /**
   * `abandon` takes a session out of use for good and ends its backend, bounded; it is built only
   * when a statement is interrupted, not for every transaction. `spanAttributes` are the
   * client's, for the span of {@link executeFirst}'s statement when a tracing backend is installed.
   * `sendWindow` bounds the statements sent without waiting that are not known to have answered
   * (see {@link send}).
   */
  constructor(
    base: PgConnection.PgConnection,
    scope: Scope.Scope,
    abandon: (session: PgConnection.PgConnection) => Effect.Effect<void>,
    pipelining: Pipelining,
    spanAttributes: ReadonlyArray<readonly [string, unknown]>,
    sendWindow: number
  ) {
    super(base)
    this.base = base
    this.scope = scope
    this.abandon = abandon
    this.pipelining = pipelining
    this.spanAttributes = spanAttributes
    this.sendWindow = sendWindow
  }

  /**
   * Whether a transaction may be open on the server, to roll back: after its `BEGIN` answered, and
   * on a session that sent its own (a `BeginTransaction` statement runs as any statement, leaving
   * the state `idle`); not when nothing was sent, `BEGIN` failed, or the session was ended.
   */
  get started(): boolean {
    return this.state === "open" || this.state === "idle"
  }

  /** Whether the next statement can be sent together with the held `BEGIN` (see {@link executeFirst}). */
  get canPipelineFirst(): boolean {
    return this.state === "held" && this.pipelining.enabled
  }

  /** A statement on the unpinned session; interrupted on the wire, the session is abandoned. */
  private onBase<A>(run: Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.onInterrupt(run, () =>
      Effect.suspend(() => {
        this.state = "abandoned"
        return this.abandon(this.base)
      }))
  }

  /** Sends the held `BEGIN` and waits for it, under the lock. */
  private readonly begin: Effect.Effect<void, SqlError> = this.lock.withPermit(Effect.suspend(() => {
    if (this.state !== "held") return Effect.void
    this.state = "opening"
    // Never pinned yet: a stream sends the held BEGIN before it pins.
    return Effect.matchEffect(this.onBase(this.base.query("BEGIN")), {
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

  /**
   * A statement of the transaction. From a fiber that outlived it (its end has begun) it dies,
   * as `afterCommit` does there: the session goes back to the pool, and the statement would run
   * outside any transaction or in the next one on it.
   */
  protected override withSession<A>(f: (session: PgConnection.PgConnection) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.suspend(() => this.ended ? Effect.die(endedError("PgPipelinedClient, a statement in a transaction")) : this.onSession(f))
  }

  /**
   * {@link withSession} without the check, also for the statements that end the transaction. It
   * reads the state when called: call it when the statement runs (in a `suspend`).
   */
  private onSession<A>(f: (session: PgConnection.PgConnection) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    switch (this.state) {
      case "idle":
      case "open": {
        const run = this.pinned === undefined ? this.onBase(f(this.base)) : f(this.pinned)
        if (this.sent === undefined || this.sent.length === 0) return run
        // After a sent statement failed, the next ones fail as the transaction is aborted
        // (25P02): what failed first is the cause worth reporting. Only those sent before this
        // one (a statement being sent is not among them yet, and must not wait for itself).
        const earlier = this.sent.slice()
        return Effect.catch(run, (error) => firstSentFailure(earlier, error))
      }
      case "held":
      case "opening":
        return Effect.andThen(this.begin, Effect.suspend(() => this.onSession(f)))
      case "failed":
      case "abandoned":
        return Effect.fail(notOpen(this.state))
    }
  }

  /**
   * Begins the transaction of a session just acquired (`idle`): its `BEGIN` is held back until the
   * first statement (see {@link executeFirst}), and never sent if none comes.
   */
  readonly hold: Effect.Effect<void> = Effect.sync(() => {
    if (this.state === "idle") this.state = "held"
  })

  override executeStream(
    sql: string,
    params: ReadonlyArray<unknown>,
    transformRows: TransformRows
  ): Stream.Stream<PgConnection.Row, SqlError> {
    const pin = Effect.andThen(
      Effect.suspend(() =>
        this.ended
          ? Effect.die(endedError("PgPipelinedClient, a stream in a transaction"))
          : this.state === "held" || this.state === "opening"
          ? this.begin
          : Effect.void
      ),
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
   * Runs `guarded` (a statement holding {@link transactionGuard} in its `WHERE`) as the
   * transaction's first statement, with the held `BEGIN`, in one write. Anywhere else (no `BEGIN`
   * held, or pipelining off on this client) it runs `plain`, the same statement without the guard,
   * as any statement. `traced` (a tracing backend is installed, which the caller's fiber knows)
   * gives it the span a statement of the client would have (its name and attributes,
   * `db.query.text` the text sent), so that tracing does not cost the round trip.
   */
  executeFirst(guarded: string, plain: string, params: ReadonlyArray<unknown>, traced: boolean): Effect.Effect<Rows, SqlError> {
    if (!traced) return this.first(guarded, plain, params)
    return Effect.useSpan(spanName(this.spanAttributes), { kind: "client" }, (span) => {
      for (const [key, value] of this.spanAttributes) span.attribute(key, value)
      span.attribute("effect.sql.method", "execute")
      span.attribute("db.query.text", this.canPipelineFirst ? guarded : plain)
      return this.first(guarded, plain, params)
    })
  }

  /** {@link executeFirst} without its span. */
  private first(guarded: string, plain: string, params: ReadonlyArray<unknown>): Effect.Effect<Rows, SqlError> {
    return Effect.suspend(() =>
      !this.canPipelineFirst
        ? this.execute(plain, params, undefined)
        // Under the lock, statements of other fibers wait for the round. No state seen under it
        // takes the lock again: `held` is handled here, and `opening` exists only under it.
        : this.lock.withPermit(Effect.suspend(() => {
          if (!this.canPipelineFirst) return this.execute(plain, params, undefined)
          this.state = "opening"
          return this.onBase(this.firstRound(guarded, plain, params))
        }))
    )
  }

  /**
   * `BEGIN` submitted by a fiber started at once, then the statement by this one: in this order,
   * from one synchronous stretch, so that they share the session's next write. The statement
   * succeeds only inside the transaction (its guard); what `BEGIN` answered sets the state. A guard
   * that failed although `BEGIN` succeeded means the session's defaults defeat it: the transaction
   * starts again without it (`ROLLBACK`, `BEGIN`, the plain statement), and the client stops
   * pipelining.
   */
  private firstRound(guarded: string, plain: string, params: ReadonlyArray<unknown>): Effect.Effect<Rows, SqlError> {
    return Effect.flatMap(Effect.forkChild(this.base.query(beginMarked), startAtOnce), (begin) =>
      Effect.flatMap(Effect.exit(this.base.query(guarded, params)), (statement) =>
        Effect.flatMap(Fiber.await(begin), (began): Effect.Effect<Rows, SqlError> => {
          if (this.state === "opening") this.state = Exit.isSuccess(began) ? "open" : "failed"
          // A failed BEGIN is the cause worth reporting (the statement then failed its guard).
          if (Exit.isFailure(began)) return Effect.failCause(began.cause)
          if (Exit.isSuccess(statement)) return Effect.succeed(statement.value.rows)
          const error = Cause.findErrorOption(statement.cause)
          if (Option.isNone(error) || !isGuardFailure(error.value)) return Effect.failCause(statement.cause)
          this.pipelining.enabled = false
          return Effect.andThen(
            Effect.andThen(this.base.query("ROLLBACK"), this.base.query("BEGIN")),
            Effect.map(this.base.query(plain, params), (result) => result.rows)
          )
        })))
  }

  /**
   * Whether a statement can be sent without waiting for its answer: the transaction is open (its
   * `BEGIN` answered, so what is sent keeps the order it is sent in), not {@link ended} (a late
   * statement runs as any, and dies), and its session unpinned.
   */
  get canSend(): boolean {
    return this.state === "open" && !this.ended && this.pinned === undefined
  }

  /**
   * Sends `statement` (an effect running one statement on this connection) without waiting for
   * its answer: a fiber of the transaction's scope runs it, started at once, so that it is queued
   * on the session before this returns and leaves with what is sent next. Only where
   * {@link canSend}. Its failure fails the transaction: a later statement and the `COMMIT` report
   * it. With `sendWindow` statements sent since the last wait, it
   * first waits for them (one round trip), so that a transaction sending many holds a bounded
   * number of fibers; one of them that failed then fails this call.
   */
  send(statement: Effect.Effect<unknown, SqlError>): Effect.Effect<void, SqlError> {
    const sent = (this.sent ??= [])
    const fork = Effect.map(Effect.forkIn(statement, this.scope, startAtOnce), (fiber) => {
      sent.push(fiber)
    })
    if (sent.length < this.sendWindow) return fork
    return Effect.flatMap(sentFailure(sent), (failure) => {
      if (failure !== undefined) return Effect.failCause(failure)
      sent.length = 0
      return fork
    })
  }

  /**
   * `COMMIT`, failing when PostgreSQL answers `ROLLBACK` (the transaction had aborted); nothing
   * when nothing was sent. After statements sent without waiting it leaves with them, and one of
   * them that failed fails the commit.
   */
  commit(): Effect.Effect<void, SqlError> {
    return Effect.suspend(() => {
      this.ended = true
      if (this.state === "held") {
        this.state = "idle"
        return Effect.void
      }
      const commit = this.onSession((session) => Effect.flatMap(session.query("COMMIT"), committedOrFailure))
      if (this.sent === undefined) return commit
      const sent = this.sent
      this.sent = undefined
      return Effect.flatMap(Effect.exit(commit), (committed) =>
        Effect.flatMap(sentFailure(sent), (failure) => failure === undefined ? committed : Effect.failCause(failure)))
    })
  }

  /**
   * `sql` (prepared: it never changes), a statement ending (part of) the transaction, sent only
   * when one may be open ({@link started}): one that sent nothing, or whose `BEGIN` failed, has
   * nothing to end. Decided when it runs: a sent statement interrupted just before may have ended
   * the session. It runs after {@link ended} is set.
   */
  ending(sql: string): Effect.Effect<void, SqlError> {
    return Effect.suspend(() => this.started ? Effect.asVoid(this.onSession((session) => session.query(sql))) : Effect.void)
  }

  /**
   * `ROLLBACK` after a failure (see {@link ending}), ending the statements sent without waiting. When the transaction was interrupted, those still on the
   * wire are interrupted first (which ends the session, as for any statement interrupted on the
   * wire) rather than waited for; otherwise they are waited for after the `ROLLBACK` (which
   * answers after them), so that none is still running, to be interrupted when the transaction's
   * scope closes.
   */
  rollingBack(interrupted: boolean): Effect.Effect<void, SqlError> {
    const rollback = this.ending("ROLLBACK")
    return Effect.suspend(() => {
      this.ended = true
      const sent = this.sent
      this.sent = undefined
      if (sent === undefined) return rollback
      return interrupted ? Effect.andThen(Fiber.interruptAll(sent), rollback) : Effect.ensuring(rollback, Fiber.awaitAll(sent))
    })
  }
}

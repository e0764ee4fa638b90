/**
 * A transaction around a handler's own statements and its commits, typed to the end when the
 * connection to PostgreSQL is lost.
 *
 * `effect/sql`'s `withTransaction` rolls a failed transaction back under `orDie`: when the effect
 * failed because the connection is gone, the rollback fails too, and the transaction ends with the
 * effect's failure and the rollback's `SqlError`, both as defects. Logs then label a lost
 * connection a defect, and the effect's typed error is out of its channel. A dead connection
 * commits nothing, so the effect's own failure is the whole truth: this module's
 * {@link withTransaction} ends with it, typed. Nothing else changes: a rollback that fails on a
 * live connection, the effect's own defects and interruptions stay as they are, and a failed
 * `COMMIT` is a typed `SqlError` as before.
 *
 * Use it where a handler wraps `IdempotencyStore` commits in a transaction of its own, for
 * example to lock rows first (the ledger example's batch mode); the store's own transactions
 * already end typed.
 *
 * @since 0.1.0
 */
import { Cause, Effect } from "effect"
import { SqlClient } from "effect/sql"
import { isSqlError, type SqlError } from "effect/sql/SqlError"
import { isConnectionLoss } from "./internal/errors.ts"

/**
 * Runs `effect` in a transaction of the `SqlClient` (a savepoint when one is open), as
 * `sql.withTransaction` does, except that a rollback which failed because the connection is lost
 * leaves the effect's typed failure as it was, instead of turning it and itself into defects (see
 * the module's description).
 */
export const withTransaction = <A, E, R>(
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E | SqlError, R | SqlClient.SqlClient> =>
  SqlClient.SqlClient.use((sql) =>
    Effect.catchCause(
      sql.withTransaction(Effect.mapError(effect, (error) => new Boxed(error))),
      (cause) => Effect.failCause(settle(cause))
    )
  )

/** The effect's own failure, told apart from the transaction's (its `COMMIT`, its rollback). */
class Boxed<E> {
  readonly error: E
  constructor(error: E) {
    this.error = error
  }
}

/**
 * The cause the transaction ends with. When its rollback failed, effect/sql reports the effect's
 * failure and the rollback's `SqlError` as defects; when that `SqlError` says the connection is
 * gone and nothing else is there (no interruption, no defect of the effect's own), the effect's
 * failures are the truth and are what remains. Otherwise the cause is the transaction's, unboxed.
 */
const settle = <E>(cause: Cause.Cause<Boxed<E> | SqlError>): Cause.Cause<E | SqlError> => {
  let boxed = false
  let lost = false
  let onlyTheTransaction = true
  for (const reason of cause.reasons) {
    if (!Cause.isDieReason(reason)) onlyTheTransaction = false
    else if (reason.defect instanceof Boxed) boxed = true
    else if (isSqlError(reason.defect)) lost ||= isConnectionLoss(reason.defect)
    else onlyTheTransaction = false
  }
  if (onlyTheTransaction && boxed && lost) {
    return Cause.fromReasons(cause.reasons.flatMap((reason) =>
      Cause.isDieReason(reason) && reason.defect instanceof Boxed ? [Cause.makeFailReason(reason.defect.error as E)] : []
    ))
  }
  return Cause.fromReasons(cause.reasons.map((reason): Cause.Reason<E | SqlError> =>
    Cause.isFailReason(reason) && reason.error instanceof Boxed
      ? Cause.makeFailReason(reason.error.error as E)
      : Cause.isDieReason(reason) && reason.defect instanceof Boxed
      ? Cause.makeDieReason(reason.defect.error)
      : reason as Cause.Reason<SqlError>
  ))
}

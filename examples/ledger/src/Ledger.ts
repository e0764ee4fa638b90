/**
 * The ledger's business logic: apply one transfer inside the caller's transaction. Accounts are
 * locked in id order (no deadlock between opposite transfers), balances may not go negative, and
 * the `transfers` row, keyed by the transfer id, records the effect. An unknown account, a
 * currency mismatch or insufficient funds is a permanent business error: no effect.
 */
import { Data, Effect } from "effect"
import { PgPipelinedClient } from "@jetworker/sql-pg"
import { SqlClient } from "effect/sql"
import type { TransferEvent } from "./TransferEvent.ts"

/** An account named by the transfer does not exist. */
export class UnknownAccount extends Data.TaggedError("UnknownAccount")<{
  readonly account: string
  readonly message: string
}> {}

/** The paying account's balance is below the amount. */
export class InsufficientFunds extends Data.TaggedError("InsufficientFunds")<{
  readonly account: string
  readonly balance: string
  readonly amount: number
  readonly message: string
}> {}

/** An account holds another currency than the transfer's. */
export class CurrencyMismatch extends Data.TaggedError("CurrencyMismatch")<{
  readonly account: string
  readonly currency: string
  readonly message: string
}> {}

/** Every business error of a transfer; all permanent. */
export type TransferError = UnknownAccount | InsufficientFunds | CurrencyMismatch

interface AccountRow {
  readonly id: string
  readonly balance: string
  readonly currency: string
}

/** Moves the money and records the transfer, in the current transaction. */
export const applyTransfer = Effect.fnUntraced(function*(event: TransferEvent) {
  const sql = yield* SqlClient.SqlClient
  const ids = [event.from, event.to].sort()
  const rows = yield* sql<AccountRow>`
    SELECT id, balance::text AS balance, currency FROM accounts
    WHERE id IN ${sql.in(ids)} ORDER BY id FOR UPDATE`
  for (const account of [event.from, event.to]) {
    const row = rows.find((r) => r.id === account)
    if (row === undefined) {
      return yield* new UnknownAccount({ account, message: `account ${account} does not exist` })
    }
    if (row.currency !== event.currency) {
      return yield* new CurrencyMismatch({
        account,
        currency: row.currency,
        message: `account ${account} holds ${row.currency}, the transfer is in ${event.currency}`
      })
    }
  }
  const payer = rows.find((r) => r.id === event.from)!
  if (BigInt(payer.balance) < BigInt(event.amount)) {
    return yield* new InsufficientFunds({
      account: event.from,
      balance: payer.balance,
      amount: event.amount,
      message: `account ${event.from} has ${payer.balance}, needs ${event.amount}`
    })
  }
  // The writes' results are not read: on PgPipelinedClient they leave with the COMMIT, in one
  // round trip (a failure among them fails the transaction, with its own error).
  yield* PgPipelinedClient.send(sql`UPDATE accounts SET balance = balance - ${event.amount} WHERE id = ${event.from}`)
  yield* PgPipelinedClient.send(sql`UPDATE accounts SET balance = balance + ${event.amount} WHERE id = ${event.to}`)
  yield* PgPipelinedClient.send(sql`
    INSERT INTO transfers (id, from_account, to_account, amount, currency, created_at)
    VALUES (${event.id}, ${event.from}, ${event.to}, ${event.amount}, ${event.currency},
            ${new Date(event.createdAt.epochMilliseconds)})`)
})

/**
 * Locks the accounts of `events` in id order, in the current transaction: a batch that takes all
 * its locks first, in one order, cannot deadlock with another batch touching the same accounts.
 */
export const lockAccounts = (events: ReadonlyArray<TransferEvent>) =>
  SqlClient.SqlClient.use((sql) => {
    const ids = [...new Set(events.flatMap((event) => [event.from, event.to]))].sort()
    return sql`SELECT id FROM accounts WHERE id IN ${sql.in(ids)} ORDER BY id FOR UPDATE`.pipe(Effect.asVoid)
  })

/** Opens (or tops up) an account; for set-up and demos, not part of the consumer. */
export const openAccount = (id: string, currency: string, balance: number) =>
  SqlClient.SqlClient.use((sql) =>
    sql`INSERT INTO accounts (id, currency, balance) VALUES (${id}, ${currency}, ${balance})
        ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance`.pipe(Effect.asVoid))

/** The sum of the balances of `ids` (as a bigint, exact). */
export const totalBalance = (ids: ReadonlyArray<string>) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly total: string | null }>`SELECT sum(balance)::text AS total FROM accounts WHERE id IN ${sql.in(ids)}`
      .pipe(Effect.map((rows) => BigInt(rows[0]?.total ?? "0"))))

/** How many transfers with `id` are recorded (0 or 1: the id is the primary key). */
export const transferCount = (id: string) =>
  SqlClient.SqlClient.use((sql) =>
    sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM transfers WHERE id = ${id}`.pipe(
      Effect.map((rows) => rows[0]?.n ?? 0)
    ))

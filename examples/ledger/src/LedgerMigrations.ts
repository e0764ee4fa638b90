/**
 * The ledger's own tables, run with effect's migrator (its table: `ledger_migrations`). The
 * jetworker dedup table comes from `@jetworker/sql-pg`'s migrations, run beside these.
 */
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"

const createTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE accounts (
      id text PRIMARY KEY,
      currency char(3) NOT NULL,
      balance bigint NOT NULL CHECK (balance >= 0),
      opened_at timestamptz NOT NULL DEFAULT now()
    )`
  yield* sql`
    CREATE TABLE transfers (
      id text PRIMARY KEY,
      from_account text NOT NULL REFERENCES accounts (id),
      to_account text NOT NULL REFERENCES accounts (id),
      amount bigint NOT NULL CHECK (amount > 0),
      currency char(3) NOT NULL,
      created_at timestamptz NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`
})

/** Runs the ledger's migrations (idempotent; safe from several processes at once). */
export const run = Migrator.make({})({
  loader: Migrator.fromRecord({ "1_accounts_and_transfers": createTables }),
  table: "ledger_migrations"
})

/**
 * `@jetworker/sql-pg`: jetworker's idempotency store on PostgreSQL and the migrations that create
 * its table. Import modules as namespaces, e.g. `import { Migrations, PgIdempotencyStore } from
 * "@jetworker/sql-pg"`. It holds no connection settings of its own: both modules run on the
 * `SqlClient` the application provides (for example `PgClient.layer` from `@effect/sql-pg`).
 *
 * @since 0.1.0
 */
/** Migrations creating the tables the stores need. */
export * as Migrations from "./Migrations.ts"
/** The PostgreSQL attempt store: failed attempts per event, for the attempts budget. */
export * as PgAttemptStore from "./PgAttemptStore.ts"
/** The PostgreSQL idempotency store and its bounded clean-up. */
export * as PgIdempotencyStore from "./PgIdempotencyStore.ts"
/** A PostgreSQL client whose transactions send BEGIN with the store's dedup row: one round trip less per commit. */
export * as PgPipelinedClient from "./PgPipelinedClient.ts"
/** A transaction around a handler's own statements and commits, typed to the end when the connection is lost. */
export * as PgTransaction from "./PgTransaction.ts"
/** The transactional outbox: events recorded in a transaction, published afterwards by its relay. */
export * as PgOutbox from "./PgOutbox.ts"

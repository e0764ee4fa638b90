/**
 * The real services the cross-package tests use, and Layers over them: NATS from `NATS_URL`
 * (default 127.0.0.1:4222) and PostgreSQL from `DATABASE_URL` (a throw-away schema per layer).
 */
import { Migrations, PgIdempotencyStore, PgOutbox } from "@jetworker/sql-pg"
import { NatsConnection } from "@jetworker/nats"
import { FaultProxy, TestDatabase } from "@jetworker/testing"
import { Effect, Layer } from "effect"
import * as LedgerMigrations from "../../examples/ledger/src/LedgerMigrations.ts"

/** The NATS server under test. */
export const natsUrl = process.env.NATS_URL ?? "nats://127.0.0.1:4222"

/** The PostgreSQL database under test (each layer works in its own schema of it). */
export const databaseUrl = TestDatabase.defaultUrl()

/** One NATS connection for a test file. */
export const NatsLive = NatsConnection.layer({ servers: natsUrl, name: "jetworker-test" })

/** Runs jetworker's and the ledger's migrations on the current schema. */
export const MigratedLive = Layer.effectDiscard(Migrations.run).pipe(
  Layer.provideMerge(Layer.effectDiscard(LedgerMigrations.run))
)

/**
 * Everything a ledger test needs in-process: NATS, a fresh migrated schema with a client, the
 * schema's name (`TestDatabase.TestSchema`), the PostgreSQL idempotency store and the outbox (no
 * relay: its rows stay in the schema).
 */
export const LedgerTestLive = Layer.mergeAll(
  NatsLive,
  Layer.merge(PgIdempotencyStore.layer(), PgOutbox.layer()).pipe(
    Layer.provideMerge(MigratedLive),
    Layer.provideMerge(TestDatabase.layer())
  )
)

/**
 * A `FaultProxy` on loopback in front of the PostgreSQL under test, and the database URL through
 * it (for a worker whose link to the database a test cuts); closed with the scope.
 */
export const databaseProxy = Effect.gen(function*() {
  const target = new URL(databaseUrl)
  const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 5432) } })
  const viaProxy = new URL(databaseUrl)
  viaProxy.hostname = proxy.address.host
  viaProxy.port = String(proxy.address.port)
  return { proxy, url: viaProxy.toString() }
})

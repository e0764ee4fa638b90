/**
 * Your first consumer (README, "Your first consumer"): it ships orders. The whole program a new
 * service needs, in two files: `OrderShipping.ts` (the event's schema, a permanent error of its
 * own, an idempotent effect, the consumer, the stream and consumer declarations with its tables)
 * and this one (a few events published, and the process under `Worker.runMain`: signals, health,
 * the budgeted shutdown, the stores with jetworker's migrations beneath them).
 *
 *   source scripts/toolchain.sh && node examples/first-consumer/src/main.ts
 *
 * It ships each order once: a known SKU gets one `shipments` row (`Committed`), an unknown one is
 * dead-lettered (`DeadLettered`), the same order published again is a `Duplicate`. Stop it with
 * Ctrl-C (SIGINT) or SIGTERM: it drains and exits 0. Settings: `NATS_URL`, `DATABASE_URL`, and
 * `DATABASE_SCHEMA` to work in a schema of its own.
 */
import { PgClient } from "@effect/sql-pg"
import { Consumer, Envelope, Lifecycle } from "@jetworker/core"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Worker } from "@jetworker/node"
import { Migrations, PgAttemptStore, PgIdempotencyStore } from "@jetworker/sql-pg"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { setup, shipping } from "./OrderShipping.ts"

// Steps 1 to 5 (the event, its error, the effect, the consumer, the declarations) are in
// OrderShipping.ts.

// 6. A few orders (another service would publish them): two to ship, one unknown SKU, and the
//    first again with a new message id, as a republish after the stream's duplicate window would.
const publishSomeOrders = Effect.gen(function*() {
  const run = Date.now().toString(36)
  const orders = [["book", 2], ["lamp", 1], ["unicorn", 1]] as const
  const events = yield* Effect.forEach(orders, ([sku, quantity], i) =>
    Envelope.make({ type: "order.created", id: `order-${run}-${i}`, data: { orderId: `${run}-${i}`, sku, quantity } }))
  for (const event of events) yield* Publisher.publishEnvelope("orders.created", event, { stream: "ORDERS" })
  const first = events[0]!
  yield* Publisher.publish("orders.created", new TextEncoder().encode(Envelope.toJson(first)), {
    msgId: `${first.id}-again`,
    stream: "ORDERS"
  })
})

// 7. The resources, each closed by the shutdown in its turn: NATS and PostgreSQL (whose `check`
//    keeps /healthz/ready at 503 while the database does not answer). On it, the dedup store and
//    the attempt store (failed runs counted in PostgreSQL; a periodic PgAttemptStore.purge keeps
//    its table small), with jetworker's migrations beneath them: their layers refuse to build
//    without their tables, and Migrations.layer waits for a database that is not up yet (each try
//    logged as startup.waiting, bounded by STARTUP_TIMEOUT).
const schema = process.env.DATABASE_SCHEMA
const DatabaseLive = PgClient.layer({
  url: Redacted.make(process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"),
  ...(schema === undefined ? {} : { startupParameters: { search_path: schema } })
})
const Live = Layer.mergeAll(
  Lifecycle.resource("nats", NatsConnection.layerConfig({ name: "order-shipping" })),
  Layer.mergeAll(PgIdempotencyStore.layer(), PgAttemptStore.layer()).pipe(
    Layer.provide(Migrations.layer),
    Layer.provideMerge(Lifecycle.resource("postgres", DatabaseLive, { check: SqlClient.SqlClient.use((sql) => sql`SELECT 1`) }))
  )
)

Worker.runMain(
  setup.pipe(Effect.andThen(publishSomeOrders), Effect.andThen(Consumer.run(shipping()))),
  { layer: Live }
)

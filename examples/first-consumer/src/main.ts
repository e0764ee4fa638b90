/**
 * Your first consumer (README, "Your first consumer"): it ships orders. The whole program a new
 * service needs, in one file: the event's schema, a permanent error of its own, an idempotent
 * effect, the consumer, the stream and consumer declarations with the migrations, a few events
 * published, and the process under `Worker.runMain` (signals, health, the budgeted shutdown).
 *
 *   source scripts/toolchain.sh && node examples/first-consumer/src/main.ts
 *
 * It ships each order once: a known SKU gets one `shipments` row (`Committed`), an unknown one is
 * dead-lettered (`DeadLettered`), the same order published again is a `Duplicate`. Stop it with
 * Ctrl-C (SIGINT) or SIGTERM: it drains and exits 0. Settings: `NATS_URL`, `DATABASE_URL`, and
 * `DATABASE_SCHEMA` to work in a schema of its own.
 */
import { PgClient } from "@effect/sql-pg"
import { Consumer, Envelope, IdempotencyStore, Lifecycle } from "@jetworker/core"
import { JetStreamSource, NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Worker } from "@jetworker/node"
import { Migrations, PgIdempotencyStore } from "@jetworker/sql-pg"
import { Data, Effect, Layer, Redacted, Schema } from "effect"
import { SqlClient } from "effect/sql"

// 1. The event: an envelope (id, type, time, data) whose data is the order.
const OrderCreated = Envelope.schema(
  "order.created",
  Schema.Struct({ orderId: Schema.String, sku: Schema.String, quantity: Schema.Int })
)
type OrderCreated = typeof OrderCreated.Type

// 2. An error of our own: retrying cannot make an unknown SKU known.
class UnknownSku extends Data.TaggedError("UnknownSku")<{ readonly sku: string; readonly message: string }> {}

// 3. The effect: one shipment per order. It runs in the transaction of the order's dedup row.
const ship = (order: OrderCreated) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const known = yield* sql`SELECT 1 FROM skus WHERE sku = ${order.data.sku}`
    if (known.length === 0) return yield* new UnknownSku({ sku: order.data.sku, message: `unknown SKU ${order.data.sku}` })
    yield* sql`INSERT INTO shipments (order_id, sku, quantity)
               VALUES (${order.data.orderId}, ${order.data.sku}, ${order.data.quantity})`
  })

// 4. The consumer: where from, how to decode, what to do, how to treat each error.
const shipping = Consumer.make({
  name: "order-shipping",
  source: JetStreamSource.make({ stream: "ORDERS", consumer: "order-shipping" }),
  schema: OrderCreated,
  handle: (order) => IdempotencyStore.commit(order.id, ship(order)),
  classify: { UnknownSku: "permanent", SqlError: "isRetryable", IdempotencyError: "isRetryable" }
})

// 5. This service owns its stream and consumer; jetworker's migrations create the dedup table.
const setup = Effect.gen(function*() {
  yield* Topology.ensureStream({ name: "ORDERS", subjects: ["orders.>"] })
  // MaxDeliver above the engine's crash-loop guard (twice the 5 attempts of the default policy).
  yield* Topology.ensureConsumer({ stream: "ORDERS", name: "order-shipping", maxDeliver: 11 })
  yield* Migrations.run
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS skus (sku text PRIMARY KEY)`
  yield* sql`CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL)`
  yield* sql`INSERT INTO skus (sku) VALUES ('book'), ('lamp') ON CONFLICT DO NOTHING`
})

// 6. A few orders (another service would publish them): two to ship, one unknown SKU, and the
//    first again with a new message id, as a republish after the stream's duplicate window would.
const publishSomeOrders = Effect.gen(function*() {
  const run = Date.now().toString(36)
  const orders = [["book", 2], ["lamp", 1], ["unicorn", 1]] as const
  const events = yield* Effect.forEach(orders, ([sku, quantity], i) =>
    Envelope.make({ type: "order.created", id: `order-${run}-${i}`, data: { orderId: `${run}-${i}`, sku, quantity } }))
  for (const event of events) yield* Publisher.publishEnvelope("orders.created", event, { stream: "ORDERS" })
  const first = events[0]!
  const again = { id: first.id, type: first.type, time: new Date(first.time.epochMilliseconds).toISOString(), data: first.data }
  yield* Publisher.publish("orders.created", new TextEncoder().encode(JSON.stringify(again)), {
    msgId: `${first.id}-again`,
    stream: "ORDERS"
  })
})

// 7. The resources, each closed by the shutdown in its turn: NATS and PostgreSQL.
const schema = process.env.DATABASE_SCHEMA
const DatabaseLive = PgClient.layer({
  url: Redacted.make(process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"),
  ...(schema === undefined ? {} : { startupParameters: { search_path: schema } })
})
const Live = Layer.mergeAll(
  Lifecycle.resource("nats", NatsConnection.layerConfig({ name: "order-shipping" })),
  PgIdempotencyStore.layer().pipe(Layer.provideMerge(Lifecycle.resource("postgres", DatabaseLive)))
)

Worker.runMain(
  setup.pipe(Effect.andThen(publishSomeOrders), Effect.andThen(Consumer.run(shipping))),
  { layer: Live }
)

/**
 * Your first consumer, the service's own code: the event, its error, the effect, the consumer and
 * its declarations. `main.ts` runs it as a process; `test/OrderShipping.test.ts` tests it.
 */
import { Consumer, Envelope, IdempotencyStore, type Outcome, type Source } from "@jetworker/core"
import { JetStreamSource, type NatsConnection, Topology } from "@jetworker/nats"
import { Data, Effect, Schema } from "effect"
import { SqlClient } from "effect/sql"

// 1. The event: an envelope (id, type, time, data) whose data is the order.
export const OrderCreated = Envelope.schema(
  "order.created",
  Schema.Struct({ orderId: Schema.String, sku: Schema.String, quantity: Schema.Int })
)
export type OrderCreated = typeof OrderCreated.Type

// 2. An error of our own: retrying cannot make an unknown SKU known.
export class UnknownSku extends Data.TaggedError("UnknownSku")<{ readonly sku: string; readonly message: string }> {}

// 3. The effect: one shipment per order. It runs in the transaction of the order's dedup row.
export const ship = (order: OrderCreated) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const known = yield* sql`SELECT 1 FROM skus WHERE sku = ${order.data.sku}`
    if (known.length === 0) return yield* new UnknownSku({ sku: order.data.sku, message: `unknown SKU ${order.data.sku}` })
    yield* sql`INSERT INTO shipments (order_id, sku, quantity)
               VALUES (${order.data.orderId}, ${order.data.sku}, ${order.data.quantity})`
  })

// 4. The consumer: where from, how to decode, what to do, how to treat each error. (The options
//    let a test point it at a throw-away stream and watch its outcomes.)
export const shipping = (options: {
  readonly source?: Source.Source<NatsConnection.NatsConnection> | undefined
  readonly onOutcome?: ((outcome: Outcome.Outcome) => Effect.Effect<void>) | undefined
} = {}) =>
  Consumer.make({
    name: "order-shipping",
    source: options.source ?? JetStreamSource.make({ stream: "ORDERS" }),
    schema: OrderCreated,
    handle: (order) => IdempotencyStore.commit(order.id, ship(order)),
    classify: { UnknownSku: "permanent", SqlError: "isRetryable", IdempotencyError: "isRetryable" },
    onOutcome: options.onOutcome
  })

// 5. This service owns its stream and consumer, and its tables. (jetworker's tables come from its
//    migrations, which main.ts runs beneath the stores.)
export const setup = Effect.gen(function*() {
  yield* Topology.ensureStream({ name: "ORDERS", subjects: ["orders.>"] })
  // MaxDeliver above the engine's crash-loop guard (twice the 5 attempts of the default policy).
  yield* Topology.ensureConsumer({ stream: "ORDERS", name: "order-shipping", maxDeliver: 11 })
  yield* tables
})

/** The service's own tables, with two known SKUs. */
export const tables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS skus (sku text PRIMARY KEY)`
  yield* sql`CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL)`
  yield* sql`INSERT INTO skus (sku) VALUES ('book'), ('lamp') ON CONFLICT DO NOTHING`
})


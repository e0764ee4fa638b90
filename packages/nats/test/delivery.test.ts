import { assert, describe, it } from "@effect/vitest"
import type { Msg } from "@nats-io/transport-node"
import { parse } from "../src/internal/delivery.ts"

const msg = (reply: string | undefined): Msg => ({ subject: "orders.created", reply, data: new Uint8Array() }) as unknown as Msg

describe("a pulled message's ack reply subject", () => {
  it("the short form (NATS 2.9): stream, deliveries, stream sequence, stored time and pending, with the time it was received", () => {
    const pulled = parse(msg("$JS.ACK.ORDERS.shipper.3.1042.77.1764578000123456789.12"), 1764578000200)
    assert.deepStrictEqual(pulled && { ...pulled, msg: undefined }, {
      msg: undefined,
      reply: "$JS.ACK.ORDERS.shipper.3.1042.77.1764578000123456789.12",
      stream: "ORDERS",
      deliveryCount: 3,
      streamSequence: 1042,
      storedAtMillis: 1764578000123,
      pending: 12,
      receivedAt: 1764578000200
    })
  })

  it("the long form with a domain and an account hash (newer servers)", () => {
    const pulled = parse(msg("$JS.ACK.hub.ACCHASH.ORDERS.shipper.1.7.7.1764578000999000000.0.rnd"), 0)
    assert.strictEqual(pulled?.stream, "ORDERS")
    assert.strictEqual(pulled?.deliveryCount, 1)
    assert.strictEqual(pulled?.streamSequence, 7)
    assert.strictEqual(pulled?.storedAtMillis, 1764578000999)
    assert.strictEqual(pulled?.pending, 0)
  })

  it("anything else is not a delivery: statuses without a reply, other replies, malformed ones", () => {
    assert.isUndefined(parse(msg(undefined), 0))
    assert.isUndefined(parse(msg("_INBOX.abc.1"), 0))
    assert.isUndefined(parse(msg("$JS.ACK.ORDERS.shipper.3.1042"), 0))
    assert.isUndefined(parse(msg("$JS.ACK.ORDERS.shipper.x.1042.77.1764578000123456789.12"), 0))
  })
})

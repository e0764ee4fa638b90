import { assert, describe, it } from "@effect/vitest"
import { Envelope } from "@jetworker/core"
import { DateTime, Effect, Schema } from "effect"

const Shipped = Envelope.schema("order.shipped", Schema.Struct({ orderId: Schema.String, quantity: Schema.Number }))

describe("Envelope.toJson", () => {
  it.effect("writes the wire form the envelope's schema decodes back to the same event, expiry included", () =>
    Effect.gen(function*() {
      const event = yield* Envelope.make({ type: "order.shipped", id: "o-1", data: { orderId: "o1", quantity: 2 }, ttl: "5 minutes" })
      const json = Envelope.toJson(event)
      const wire = JSON.parse(json) as Record<string, unknown>
      assert.deepStrictEqual(Object.keys(wire), ["id", "type", "time", "expiresAt", "data"])
      assert.strictEqual(wire.time, new Date(event.time.epochMilliseconds).toISOString())
      const decoded = yield* Schema.decodeUnknownEffect(Shipped)(wire)
      assert.strictEqual(decoded.id, "o-1")
      assert.isTrue(DateTime.Equivalence(decoded.time, event.time))
      assert.isTrue(decoded.expiresAt !== undefined && DateTime.Equivalence(decoded.expiresAt, event.expiresAt!))
      assert.deepStrictEqual(decoded.data, { orderId: "o1", quantity: 2 })
    }))

  it.effect("leaves out an absent expiry", () =>
    Effect.gen(function*() {
      const event = yield* Envelope.make({ type: "order.shipped", data: { orderId: "o2", quantity: 1 } })
      assert.notProperty(JSON.parse(Envelope.toJson(event)), "expiresAt")
    }))
})

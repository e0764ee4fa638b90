import { assert, describe, it } from "@effect/vitest"
import { DateTime, Exit, Schema } from "effect"
import * as Envelope from "../src/Envelope.ts"
import * as EnvelopeDecoder from "../src/internal/envelopeDecoder.ts"

// The consumer's quicker decoder of `Envelope.schema`s must give exactly what the schema gives, and
// leave to the schema whatever it is not sure of (the schema then decodes it, or says why not).
const Order = Envelope.schema("order.placed", Schema.Struct({ orderId: Schema.String, total: Schema.Number }))
const WithDates = Envelope.schema("with.dates", Schema.Struct({ at: Schema.DateTimeUtcFromString }))
const quick = (schema: object) => EnvelopeDecoder.quickDecoderOf(schema)!

const valid = { id: "order-1", type: "order.placed", time: "2026-12-04T10:11:12.345Z", data: { orderId: "o1", total: 12.5 } }

/** What the schema decodes `json` to, or `undefined` when it refuses it. */
const byTheSchema = (schema: Schema.Decoder<unknown>, json: unknown) => {
  const exit = Schema.decodeUnknownExit(schema)(json)
  return Exit.isSuccess(exit) ? exit.value : undefined
}

/** The same value, to the key order and the prototypes of its dates. */
const assertSame = (actual: unknown, expected: unknown) => {
  assert.deepStrictEqual(actual, expected)
  const keys = (value: unknown): unknown =>
    typeof value === "object" && value !== null && !DateTime.isDateTime(value)
      ? Object.entries(value).map(([key, field]) => [key, keys(field)])
      : DateTime.isDateTime(value)
      ? [Object.getPrototypeOf(value), value.epochMilliseconds, Object.keys(value)]
      : value
  assert.deepStrictEqual(keys(actual), keys(expected))
}

describe("the quick decoder of Envelope.schema", () => {
  it("is registered for the schemas Envelope.schema builds, and only for them", () => {
    assert.isDefined(EnvelopeDecoder.quickDecoderOf(Order))
    assert.isUndefined(EnvelopeDecoder.quickDecoderOf(Schema.Struct({ id: Schema.String })))
    // A schema derived from an envelope's is another schema: the schema's own decoder decodes it.
    assert.isUndefined(EnvelopeDecoder.quickDecoderOf(Order.annotate({ title: "changed" })))
  })

  it("decodes what the schema decodes to the same value: fields in the schema's order, dates as DateTime.Utc", () => {
    const inputs: Array<unknown> = [
      valid,
      { ...valid, expiresAt: "2026-12-04T10:12:00Z" },
      // Extra fields are dropped, as the schema drops them; the field order of the input does not matter.
      { data: valid.data, extra: 1, time: valid.time, type: valid.type, id: valid.id },
      { ...valid, time: "2026-12-04T10:11:12Z" },
      { ...valid, time: "2026-12-04T10:11:12.123456789Z" },
      { ...valid, id: "~".repeat(200) },
      { ...valid, data: { orderId: "o2", total: 0, more: true } }
    ]
    for (const input of inputs) {
      const decoded = quick(Order)(input)
      assert.isDefined(decoded, JSON.stringify(input))
      assertSame(decoded, byTheSchema(Order, input))
    }
    const dated = { id: "d1", type: "with.dates", time: valid.time, data: { at: "2026-01-02T03:04:05.006Z" } }
    assertSame(quick(WithDates)(dated), byTheSchema(WithDates, dated))
  })

  it("leaves to the schema what it refuses, and what it is not sure of", () => {
    const inputs: Array<unknown> = [
      null,
      "text",
      [valid],
      { ...valid, id: "" },
      { ...valid, id: "has space" },
      { ...valid, id: "x".repeat(201) },
      { ...valid, id: 7 },
      { ...valid, type: "order.cancelled" },
      { ...valid, time: "not a date" },
      { ...valid, time: "2026-13-45T10:11:12Z" },
      { ...valid, time: 1733307072345 },
      { ...valid, expiresAt: null },
      { ...valid, expiresAt: "soon" },
      { ...valid, data: { orderId: 1, total: 2 } },
      { id: valid.id, type: valid.type, time: valid.time },
      // Dates the schema reads but this decoder leaves to it: no zone, an offset, a date alone.
      { ...valid, time: "2026-12-04T10:11:12" },
      { ...valid, time: "2026-12-04T10:11:12+02:00" },
      { ...valid, time: "2026-12-04" }
    ]
    for (const input of inputs) assert.isUndefined(quick(Order)(input), JSON.stringify(input))
    // The schema still decodes the dates left to it.
    assert.isDefined(byTheSchema(Order, { ...valid, time: "2026-12-04T10:11:12+02:00" }))
  })
})

/**
 * A quicker decoder for the schemas `Envelope.schema` builds, used by the consumer before the
 * schema's own: it checks the envelope's fields by hand and decodes only `data` with its schema.
 * Schema's decoder of the whole envelope cost a consumer more than its JSON parse (the struct's
 * walk, and a date string read through `DateTime.make`, two regular expressions and a `Date`).
 * It decodes only what it is sure of, to exactly what the schema gives (the same fields in the
 * same order, the same `DateTime.Utc`s); anything else it leaves to the schema (`undefined`),
 * which then decodes it or says why not in its own words.
 */
import { DateTime, Exit, Schema } from "effect"

/** Gives the decoded envelope, or `undefined` to leave `json` to the schema. */
export type QuickDecoder = (json: unknown) => object | undefined

const quickDecoders = new WeakMap<object, QuickDecoder>()

/** The quick decoder of `schema`, when `Envelope.schema` built it (and it was not changed since). */
export const quickDecoderOf = (schema: object): QuickDecoder | undefined => quickDecoders.get(schema)

// A time as `DateTime.formatIso` and `toISOString` write it, in UTC with its `Z`: its instant is
// what `Date.parse` reads, as `DateTime.make` does (a string with a zone goes to `new Date`).
const isoUtc = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z$/

const utcOf = (value: unknown): DateTime.Utc | undefined => {
  if (typeof value !== "string" || !isoUtc.test(value)) return undefined
  const millis = Date.parse(value)
  return Number.isNaN(millis) ? undefined : DateTime.makeUnsafe(millis)
}

/**
 * Registers the quick decoder of `envelope`, the schema of envelopes of `type` whose event ids
 * match `eventId` and whose `data` is `data`'s.
 */
export const register = (envelope: object, type: string, eventId: RegExp, data: Schema.Top): void => {
  // Built on first use, as the consumer builds the schema's own.
  let decodeData: ((input: unknown) => Exit.Exit<unknown, unknown>) | undefined
  const quick: QuickDecoder = (json) => {
    if (typeof json !== "object" || json === null || Array.isArray(json)) return undefined
    const fields = json as Record<string, unknown>
    const id = fields.id
    if (typeof id !== "string" || !eventId.test(id) || fields.type !== type || !Object.hasOwn(fields, "data")) return undefined
    const time = utcOf(fields.time)
    if (time === undefined) return undefined
    decodeData ??= Schema.decodeUnknownExit(data as unknown as Schema.Decoder<unknown>)
    const decoded = decodeData(fields.data)
    if (!Exit.isSuccess(decoded)) return undefined
    if (!Object.hasOwn(fields, "expiresAt")) return { id, type, time, data: decoded.value }
    const expiresAt = utcOf(fields.expiresAt)
    return expiresAt === undefined ? undefined : { id, type, time, expiresAt, data: decoded.value }
  }
  quickDecoders.set(envelope, quick)
}

import { assert, describe, it } from "@effect/vitest"
import { JsonLogger } from "@jetworker/node"
import { Effect, Logger } from "effect"

/** Runs `effect` with the JSON formatter and returns the raw lines. */
const capture = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const lines: Array<string> = []
    const logger = Logger.map(JsonLogger.formatter, (line) => {
      lines.push(line)
    })
    yield* effect.pipe(Effect.provide(Logger.layer([logger])), Effect.ignore)
    return lines
  })

/** Parses `raw`, which must be one JSON object on one line. */
const object = (raw: string | undefined): Record<string, unknown> => {
  assert.isString(raw)
  assert.notInclude(raw!, "\n")
  const parsed: unknown = JSON.parse(raw!)
  assert.isTrue(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed), `not an object: ${raw}`)
  return parsed as Record<string, unknown>
}

const circular = () => {
  const ctx: Record<string, unknown> = { name: "ctx" }
  ctx.self = ctx
  return ctx
}

describe("JsonLogger", () => {
  it.effect("a circular annotation prints as [Circular]; the fixed keys and the other annotations survive", () =>
    Effect.gen(function*() {
      const [raw] = yield* capture(
        Effect.logWarning("order.failed").pipe(Effect.annotateLogs({ orderId: "o-1", ctx: circular() }))
      )
      const line = object(raw)
      assert.deepInclude(line, { level: "WARN", message: "order.failed", orderId: "o-1" })
      assert.match(String(line.timestamp), /^\d{4}-\d\d-\d\dT/)
      assert.deepStrictEqual(line.ctx, { name: "ctx", self: "[Circular]" })
    }))

  it.effect("a circular detail prints as [Circular]", () =>
    Effect.gen(function*() {
      const [raw] = yield* capture(Effect.logError("x", circular()).pipe(Effect.annotateLogs({ orderId: "o-2" })))
      const line = object(raw)
      assert.deepInclude(line, { level: "ERROR", message: "x", orderId: "o-2" })
      assert.deepStrictEqual(line.details, { name: "ctx", self: "[Circular]" })
    }))

  it.effect("a value whose toJSON throws prints as [unserialisable: <reason>]", () =>
    Effect.gen(function*() {
      const bad = { toJSON: () => { throw new Error("no json for you") } }
      const [raw] = yield* capture(Effect.logInfo("m").pipe(Effect.annotateLogs({ bad, ok: 1 })))
      const line = object(raw)
      assert.deepInclude(line, { level: "INFO", message: "m", ok: 1, bad: "[unserialisable: no json for you]" })
    }))

  it.effect("a value seen twice without a cycle is printed both times", () =>
    Effect.gen(function*() {
      const shared = { id: 7 }
      const [raw] = yield* capture(Effect.logInfo("m").pipe(Effect.annotateLogs({ a: shared, b: [shared, shared] })))
      const line = object(raw)
      assert.deepStrictEqual(line.a, { id: 7 })
      assert.deepStrictEqual(line.b, [{ id: 7 }, { id: 7 }])
    }))

  it.effect("a message that is itself circular keeps the line an object", () =>
    Effect.gen(function*() {
      const [raw] = yield* capture(Effect.logInfo(circular()))
      const line = object(raw)
      assert.strictEqual(line.level, "INFO")
      assert.strictEqual(line.message, JSON.stringify({ name: "ctx", self: "[Circular]" }))
    }))

  it.effect("a structure too deep for the stack still gives a line with the fixed keys", () =>
    Effect.gen(function*() {
      let deep: Record<string, unknown> = {}
      for (let i = 0; i < 200_000; i++) deep = { deep }
      const [raw] = yield* capture(Effect.logError("too.deep").pipe(Effect.annotateLogs({ deep })))
      const line = object(raw)
      assert.deepInclude(line, { level: "ERROR", message: "too.deep" })
      assert.match(String(line.error), /^\[unserialisable: /)
    }))
})

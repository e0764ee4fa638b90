import { assert, describe, it } from "@effect/vitest"
import { JsonLogger } from "@jetworker/node"
import { Effect, Logger } from "effect"

const capture = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const lines: Array<string> = []
    const logger = Logger.map(JsonLogger.formatter, (line) => {
      lines.push(line)
    })
    yield* effect.pipe(Effect.provide(Logger.layer([logger])))
    return lines.map((line) => JSON.parse(line) as Record<string, unknown>)
  })

describe("JsonLogger: a plain Error logged as a detail", () => {
  it.effect("keeps its code and the chain of causes, where the operator reads what to do", () =>
    Effect.gen(function*() {
      const driver = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5433"), { code: "ECONNREFUSED" })
      const error = new Error("Query failed", { cause: driver })
      const [line] = yield* capture(Effect.logError("payment.failed", error))
      assert.deepStrictEqual(line!.details, {
        name: "Error",
        message: "Query failed",
        cause: { name: "Error", message: "connect ECONNREFUSED 127.0.0.1:5433", code: "ECONNREFUSED" }
      })
    }))

  it.effect("an error that is its own cause is written once, with [Circular] where it recurs", () =>
    Effect.gen(function*() {
      const error: Error & { cause?: unknown } = new Error("loop")
      error.cause = error
      const [line] = yield* capture(Effect.logWarning("odd", error))
      assert.deepStrictEqual(line!.details, { name: "Error", message: "loop", cause: "[Circular]" })
      assert.strictEqual(line!.message, "odd")
    }))
})

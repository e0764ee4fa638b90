/**
 * `ErrorSummary` of a defect that is not an `Error` and has no message (a library's internal
 * wrapper, a plain object): it must say what the object is, not "[object Object]", which is what
 * the soak's logs and dead letters carried ("Defect: [object Object]").
 */
import { assert, describe, it } from "@effect/vitest"
import { ErrorSummary } from "@jetworker/core"
import { Cause, Data } from "effect"

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

/** A wrapper of the kind a store boxes its user's errors in: a class with no tag and no message. */
class Box<E> {
  readonly error: E
  constructor(error: E) {
    this.error = error
  }
}

describe("ErrorSummary of a defect without a message", () => {
  it("a class instance is named by its class and shown as bounded JSON, the wrapped error's tag and message included", () => {
    const summary = ErrorSummary.fromCause(Cause.die(new Box(new Boom({ message: "transfer rejected" }))))
    assert.strictEqual(summary.kind, "Defect")
    assert.strictEqual(summary.tag, "Box")
    assert.notInclude(summary.message, "[object Object]")
    assert.include(summary.message, "\"_tag\":\"Boom\"")
    assert.include(summary.message, "transfer rejected")
    assert.strictEqual(
      ErrorSummary.describe(summary),
      `Box: {"error":{"_tag":"Boom","message":"transfer rejected"}}`
    )
  })

  it("a plain object keeps the Defect tag and is shown as JSON; its _tag and message, when present, are used as for an error", () => {
    const plain = ErrorSummary.fromError({ code: 7, what: "lost" }, "Defect")
    assert.strictEqual(plain.tag, "Defect")
    assert.strictEqual(plain.message, `{"code":7,"what":"lost"}`)
    const tagged = ErrorSummary.fromError({ _tag: "Gone", message: "the link went down" }, "Defect")
    assert.strictEqual(tagged.tag, "Gone")
    assert.strictEqual(tagged.message, "the link went down")
  })

  it("the JSON is bounded: deep, wide, cyclic and long values are cut, and it never throws", () => {
    const cyclic: Record<string, unknown> = { name: "loop" }
    cyclic.self = cyclic
    assert.include(ErrorSummary.fromError(cyclic, "Defect").message, "[Circular]")
    const deep = { a: { b: { c: { d: { e: 1 } } } } }
    assert.strictEqual(ErrorSummary.fromError(deep, "Defect").message, `{"a":{"b":{"c":"…"}}}`)
    const wide = Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`k${i}`, i]))
    const wideMessage = ErrorSummary.fromError(wide, "Defect").message
    assert.isAtMost(wideMessage.length, 500)
    assert.include(wideMessage, "\"k19\":19")
    assert.notInclude(wideMessage, "k20\":")
    const long = ErrorSummary.fromError({ text: "x".repeat(10_000), big: 10n, fn: () => 1 }, "Defect").message
    assert.isAtMost(long.length, 500)
    const hostile = {
      code: 1,
      toString(): string {
        throw new Error("toString threw")
      }
    }
    assert.strictEqual(ErrorSummary.fromError(hostile, "Defect").message, `{"code":1,"toString":"[function toString]"}`)
    assert.strictEqual(ErrorSummary.fromError(Object.create(null), "Defect").message, "{}")
  })

  it("strings, numbers and errors are summarised as before", () => {
    assert.strictEqual(ErrorSummary.fromError("plain words", "Defect").message, "plain words")
    assert.strictEqual(ErrorSummary.fromError(42, "Defect").message, "42")
    const error = ErrorSummary.fromError(new RangeError("too far"), "Defect")
    assert.deepStrictEqual([error.tag, error.message], ["RangeError", "too far"])
  })
})

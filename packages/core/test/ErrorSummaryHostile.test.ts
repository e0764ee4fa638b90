/**
 * `ErrorSummary` of a hostile error value: getters that throw, proxies whose traps throw, an
 * `Error` whose `message` throws. The engine summarises every handler error and defect, so a
 * summary must come out of any value, saying what can be said safely, and never throw.
 */
import { assert, describe, it } from "@effect/vitest"
import { ErrorSummary } from "@jetworker/core"
import { Cause } from "effect"

const boom = (): never => {
  throw new Error("hostile getter")
}

/** A proxy over `target` whose `traps` all throw. */
const throwing = (traps: ReadonlyArray<keyof ProxyHandler<object>>, target: object = {}): object =>
  new Proxy(target, Object.fromEntries(traps.map((trap) => [trap, boom])) as ProxyHandler<object>)

class HostileError extends Error {}
// An accessor on the prototype: `super()` without a message defines no own `message`, so the getter is what is read.
Object.defineProperty(HostileError.prototype, "message", { get: boom })

const revoked = (): object => {
  const { proxy, revoke } = Proxy.revocable({}, {})
  revoke()
  return proxy
}

const hostiles: ReadonlyArray<readonly [string, () => unknown]> = [
  ["a message getter that throws", () => ({ get message() { return boom() } })],
  ["a tagged error whose cause getter throws", () => ({ _tag: "Foo", message: "foo failed", get cause() { return boom() } })],
  ["a _tag getter that throws", () => ({ get _tag() { return boom() }, message: "tagless" })],
  ["a scalar field whose getter throws", () => ({ message: "m", get code() { return boom() }, other: 1 })],
  ["a constructor getter that throws", () => Object.create({ get constructor() { return boom() } }) as object],
  ["a cause whose message getter throws", () => ({ _tag: "Outer", message: "outer", cause: { get message() { return boom() }, code: "X" } })],
  ["a cause that is a proxy whose get trap throws", () => ({ _tag: "Outer", message: "outer", cause: throwing(["get"]) })],
  ["a proxy whose get trap throws", () => throwing(["get"])],
  ["a proxy whose has trap throws", () => throwing(["has"])],
  ["a proxy whose ownKeys trap throws", () => throwing(["ownKeys"])],
  ["a proxy whose getPrototypeOf trap throws", () => throwing(["getPrototypeOf"])],
  ["a proxy whose getOwnPropertyDescriptor trap throws", () => throwing(["getOwnPropertyDescriptor"])],
  ["a proxy whose every trap throws", () => throwing(["get", "has", "ownKeys", "getPrototypeOf", "getOwnPropertyDescriptor"])],
  ["a proxy over an Error whose every trap throws", () => throwing(["get", "has", "ownKeys", "getPrototypeOf", "getOwnPropertyDescriptor"], new Error("hidden"))],
  ["a revoked proxy", revoked],
  ["an Error subclass whose message getter throws", () => new HostileError()],
  ["an Error whose name getter throws", () => Object.defineProperty(new Error("named"), "name", { get: boom })],
  ["an Error whose message is not a string", () => Object.assign(new Error(), { message: 42 as unknown as string })]
]

/** `summarise()`, failing the test with `label` (which value) if it throws. */
const attempt = (label: string, summarise: () => ErrorSummary.ErrorSummary): ErrorSummary.ErrorSummary => {
  try {
    return summarise()
  } catch (error) {
    return assert.fail(`${label}: the summary threw ${String(error)}`)
  }
}

/** A summary as the engine needs it: strings where strings are promised, bounded, serialisable. */
const assertSound = (summary: ErrorSummary.ErrorSummary, label: string) => {
  assert.isString(summary.tag, label)
  assert.isAbove(summary.tag.length, 0, label)
  assert.isString(summary.message, label)
  assert.isAbove(summary.message.length, 0, label)
  assert.isAtMost(summary.message.length, 500, label)
  assert.isObject(summary.fields, label)
  for (const cause of summary.causes ?? []) {
    assert.isString(cause.tag, label)
    assert.isString(cause.message, label)
  }
  assert.isString(JSON.stringify(summary), label)
  assert.isString(ErrorSummary.describe(summary), label)
}

describe("ErrorSummary of a hostile error value", () => {
  it("every hostile value gives a summary, as a failure and as a defect, and never throws", () => {
    for (const [label, make] of hostiles) {
      for (const kind of ["Failure", "Defect"] as const) {
        const summary = attempt(`${label} (${kind})`, () => ErrorSummary.fromError(make(), kind))
        assertSound(summary, `${label} (${kind})`)
        assert.strictEqual(summary.kind, kind, label)
      }
    }
  })

  it("fromCause gives a summary of a hostile failure and of a hostile defect", () => {
    for (const [label, make] of hostiles) {
      const failure = attempt(`${label} (Cause.fail)`, () => ErrorSummary.fromCause(Cause.fail(make())))
      const defect = attempt(`${label} (Cause.die)`, () => ErrorSummary.fromCause(Cause.die(make())))
      assertSound(failure, label)
      assertSound(defect, label)
      assert.strictEqual(failure.kind, "Failure", label)
      assert.strictEqual(defect.kind, "Defect", label)
    }
  })

  it("what can be read safely is kept; what cannot falls back to the class name or [object Object]", () => {
    const noMessage = ErrorSummary.fromError({ get message() { return boom() } })
    assert.deepStrictEqual([noMessage.tag, noMessage.message], ["UnknownError", "[object Object]"])

    const tagged = ErrorSummary.fromError({ _tag: "Foo", message: "foo failed", get cause() { return boom() } })
    assert.deepStrictEqual([tagged.tag, tagged.message, tagged.causes], ["Foo", "foo failed", undefined])

    const tagless = ErrorSummary.fromError({ get _tag() { return boom() }, message: "tagless" }, "Defect")
    assert.deepStrictEqual([tagless.tag, tagless.message], ["Defect", "tagless"])

    // One field that cannot be read costs that field, not the others.
    const field = ErrorSummary.fromError({ _tag: "Bad", message: "m", get code() { return boom() }, other: 1 })
    assert.deepStrictEqual(field.fields, { other: 1 })

    const inner = ErrorSummary.fromError({ _tag: "Outer", message: "outer", cause: { get message() { return boom() }, code: "X" } })
    assert.deepStrictEqual(inner.causes, [{ tag: "Error", message: "[object Object]", fields: { code: "X" } }])

    const subclass = ErrorSummary.fromError(new HostileError(), "Defect")
    assert.strictEqual(subclass.message, "[object HostileError]")

    const named = ErrorSummary.fromError(Object.defineProperty(new Error("named"), "name", { get: boom }), "Defect")
    assert.deepStrictEqual([named.tag, named.message], ["Error", "named"])

    const proxy = ErrorSummary.fromError(throwing(["get", "has", "ownKeys", "getPrototypeOf", "getOwnPropertyDescriptor"]), "Defect")
    assert.deepStrictEqual([proxy.tag, proxy.message, proxy.fields], ["Defect", "[object Object]", {}])
  })

  it("ordinary errors are summarised as before", () => {
    const error = ErrorSummary.fromError(Object.assign(new TypeError("bad input"), { code: "E1" }), "Defect")
    assert.deepStrictEqual([error.tag, error.message, error.fields], ["TypeError", "bad input", { code: "E1" }])
    const tagged = ErrorSummary.fromError({ _tag: "Nope", message: "no", cause: new Error("inner", { cause: { code: "23505", message: "dup" } }) })
    assert.deepStrictEqual(tagged.causes, [
      { tag: "Error", message: "inner", fields: {} },
      { tag: "Error", message: "dup", fields: { code: "23505" } }
    ])
  })

  it("a huge tag or name is cut to 100 characters, on one line", () => {
    const huge = ErrorSummary.fromError({ _tag: `Tag${"x".repeat(10_000)}\nmore`, message: "m" })
    assert.isAtMost(huge.tag.length, 100)
    assert.isTrue(huge.tag.startsWith("Tagxxx"))
    const named = ErrorSummary.fromError(Object.assign(new Error("m"), { name: "N".repeat(5_000) }))
    assert.isAtMost(named.tag.length, 100)
    assert.strictEqual(ErrorSummary.fromError({ _tag: "Short", message: "m" }).tag, "Short")
  })
})

/**
 * The key check every store shares (`IdempotencyStore.keyProblem`): a key PostgreSQL cannot keep
 * apart from others is refused as `InvalidData`, naming the operation, the part and where the bad
 * character is; a good key passes.
 */
import { assert, describe, it } from "@effect/vitest"
import { firstKeyProblem, keyProblem } from "../src/IdempotencyStore.ts"

describe("IdempotencyStore.keyProblem", () => {
  it("passes good keys, including an empty id, surrogate pairs and long ids", () => {
    for (const id of ["", "evt-1", "emoji-\uD83D\uDE00", "x".repeat(100_000)]) {
      assert.isUndefined(keyProblem({ scope: "s", id }, "commit"))
    }
  })

  it("refuses a NUL and a lone surrogate in either part, as InvalidData and not retryable", () => {
    const cases = [
      [{ scope: "s", id: "a\u0000b" }, /^commit: the idempotency key's id "a\\u0000b" holds at index 1 a NUL/],
      [{ scope: "s\uD800", id: "ok" }, /^commit: the idempotency key's scope .* holds at index 1 not well-formed Unicode \(a lone surrogate\)/],
      [{ scope: "s", id: "ab\uDC00" }, /^commit: the idempotency key's id .* holds at index 2 not well-formed Unicode/]
    ] as const
    for (const [key, message] of cases) {
      const problem = keyProblem(key, "commit")
      assert.isDefined(problem)
      assert.strictEqual(problem!.reason, "InvalidData")
      assert.isFalse(problem!.isRetryable)
      assert.match(problem!.message, message)
    }
  })

  it("firstKeyProblem names the first refused key of many", () => {
    const problem = firstKeyProblem([{ scope: "s", id: "ok" }, { scope: "s", id: "b\u0000" }, { scope: "s", id: "\uD800" }], "commitAll")
    assert.match(problem!.message, /^commitAll: the idempotency key's id "b\\u0000" holds at index 1 a NUL/)
    assert.isUndefined(firstKeyProblem([{ scope: "s", id: "ok" }], "commitAll"))
  })
})

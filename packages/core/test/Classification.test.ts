import { assert, describe, it } from "@effect/vitest"
import { Classification, Consumer, Envelope, type Source } from "@jetworker/core"
import { Data, Effect, Schema } from "effect"
import { ConnectionError, SqlError, UniqueViolation } from "effect/sql/SqlError"

class Timeout extends Data.TaggedError("Timeout")<{ readonly message: string }> {}
class Refused extends Data.TaggedError("Refused")<{ readonly message: string }> {}
/** Says itself whether a retry can help. */
class Upstream extends Data.TaggedError("Upstream")<{ readonly status: number }> {
  get isRetryable(): boolean {
    return this.status >= 500
  }
}

type HandlerError = Timeout | Refused | Upstream

// ---- Compile-time checks (run by `tsc -p .`): a classification must name every tag, and only those.

/** Complete: compiles. */
const complete: Classification.Classification<HandlerError> = {
  Timeout: "transient",
  Refused: "permanent",
  Upstream: "isRetryable"
}

// @ts-expect-error `Upstream` is not classified
const missingTag: Classification.Classification<HandlerError> = { Timeout: "transient", Refused: "permanent" }

const extraTag: Classification.Classification<HandlerError> = {
  Timeout: "transient",
  Refused: "permanent",
  Upstream: "isRetryable",
  // @ts-expect-error `Gone` is not an error the handler can fail with
  Gone: "permanent"
}

const badEntry: Classification.Classification<HandlerError> = {
  Timeout: "transient",
  // @ts-expect-error an entry is "transient", "permanent" or "isRetryable"
  Refused: "sometimes",
  Upstream: "isRetryable"
}

// The same checks where it matters: the handler's inferred error type drives `classify`.
const source: Source.Source = { name: "never-opened", open: () => Effect.die("not opened in a type test") }
const schema = Envelope.schema("test", Schema.Struct({ n: Schema.Number }))
const handle = (event: typeof schema.Type): Effect.Effect<void, HandlerError> =>
  event.data.n > 0 ? Effect.void : Effect.fail(new Refused({ message: "no" }))

const consumers = [
  Consumer.make({ name: "complete", source, schema, handle, classify: complete }),
  Consumer.make({
    name: "missing",
    source,
    schema,
    handle,
    // @ts-expect-error the handler can fail with `Upstream`, which is not classified
    classify: { Timeout: "transient", Refused: "permanent" }
  }),
  Consumer.make({
    name: "extra",
    source,
    schema,
    handle,
    classify: {
      Timeout: "transient",
      Refused: "permanent",
      Upstream: "isRetryable",
      // @ts-expect-error the handler cannot fail with `Gone`
      Gone: "permanent"
    }
  }),
  // A handler that cannot fail needs an empty classification, and accepts no entry.
  Consumer.make({ name: "infallible", source, schema, handle: () => Effect.void, classify: {} }),
  Consumer.make({
    name: "infallible-extra",
    source,
    schema,
    handle: () => Effect.void,
    // @ts-expect-error nothing to classify
    classify: { Timeout: "transient" }
  })
]

describe("Classification", () => {
  it.effect("the type-checked classifications above exist at run time as plain data", () =>
    Effect.sync(() => {
      assert.strictEqual(consumers.length, 5)
      assert.deepStrictEqual(Object.keys(complete).sort(), ["Refused", "Timeout", "Upstream"])
      assert.deepStrictEqual([missingTag, extraTag, badEntry].map((c) => typeof c), ["object", "object", "object"])
    }))

  it.effect("transient and permanent entries classify their tags as given", () =>
    Effect.sync(() => {
      assert.strictEqual(Classification.classify(complete, new Timeout({ message: "slow" })), "transient")
      assert.strictEqual(Classification.classify(complete, new Refused({ message: "no" })), "permanent")
    }))

  it.effect("isRetryable asks the error itself", () =>
    Effect.sync(() => {
      assert.strictEqual(Classification.classify(complete, new Upstream({ status: 503 })), "transient")
      assert.strictEqual(Classification.classify(complete, new Upstream({ status: 404 })), "permanent")
    }))

  it.effect("isRetryable on an error without the property, or with a non-boolean, is permanent", () =>
    Effect.sync(() => {
      const classification: Classification.Classification<{ readonly _tag: "Plain" } | { readonly _tag: "Odd" }> = {
        Plain: "isRetryable",
        Odd: "isRetryable"
      }
      assert.strictEqual(Classification.classify(classification, { _tag: "Plain" }), "permanent")
      const odd = { _tag: "Odd" as const, isRetryable: "yes" }
      assert.strictEqual(Classification.classify(classification, odd), "permanent")
    }))

  it.effect("isRetryable follows SqlError's reason", () =>
    Effect.sync(() => {
      const classification: Classification.Classification<SqlError> = { SqlError: "isRetryable" }
      const lost = new SqlError({ reason: new ConnectionError({ cause: new Error("ECONNRESET") }) })
      const unique = new SqlError({ reason: new UniqueViolation({ cause: new Error("23505"), constraint: "k" }) })
      assert.strictEqual(Classification.classify(classification, lost), "transient")
      assert.strictEqual(Classification.classify(classification, unique), "permanent")
    }))

  it.effect("a tag missing at run time (types bypassed) is permanent, so it cannot cause a retry loop", () =>
    Effect.sync(() => {
      const partial = { Timeout: "transient" } as unknown as Classification.Classification<HandlerError>
      assert.strictEqual(Classification.classify(partial, new Upstream({ status: 503 })), "permanent")
      assert.strictEqual(Classification.classify(partial, new Refused({ message: "no" })), "permanent")
      assert.strictEqual(Classification.classify(partial, new Timeout({ message: "slow" })), "transient")
    }))
})

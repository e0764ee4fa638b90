import { assert, describe, it } from "@effect/vitest"
import { SpanLog } from "@jetworker/testing"
import { Effect, Option } from "effect"

describe("SpanLog", () => {
  it.effect("records the spans started under its tracer, in order, with their parents, attributes and exits", () =>
    Effect.gen(function*() {
      const log = yield* SpanLog.make
      yield* Effect.withSpan("inner", { attributes: { n: 1 } })(Effect.void).pipe(
        Effect.withSpan("outer", { kind: "consumer" }),
        Effect.withTracer(log.tracer)
      )
      yield* Effect.withSpan("failing")(Effect.fail("boom")).pipe(Effect.withTracer(log.tracer), Effect.ignore)
      yield* Effect.withSpan("untraced")(Effect.void)

      const all = yield* log.all
      assert.deepStrictEqual(all.map((span) => span.name), ["outer", "inner", "failing"], "only the spans under its tracer")
      const [outer, inner, failing] = all
      assert.strictEqual(outer!.kind, "consumer")
      assert.strictEqual(Option.getOrUndefined(inner!.parent)?.spanId, outer!.spanId)
      assert.strictEqual(inner!.attributes.get("n"), 1)
      for (const span of all) assert.strictEqual(span.status._tag, "Ended")
      const ended = failing!.status
      assert.isTrue(ended._tag === "Ended" && ended.exit._tag === "Failure")
      assert.deepStrictEqual((yield* log.named("inner")).map((span) => span.spanId), [inner!.spanId])
      assert.deepStrictEqual(yield* log.named("none"), [])
    }))
})

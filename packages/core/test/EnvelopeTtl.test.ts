import { assert, describe, it } from "@effect/vitest"
import { Envelope } from "@jetworker/core"
import { DateTime, Duration, Effect, Exit } from "effect"
import { TestClock } from "effect/testing"

describe("Envelope.make", () => {
  it.effect("an infinite ttl means no expiry: the event has no expiresAt and its JSON has none", () =>
    Effect.gen(function*() {
      for (const ttl of [Duration.infinity, "Infinity" as const]) {
        const event = yield* Envelope.make({ type: "order.placed", data: { orderId: "o-1" }, ttl })
        assert.isUndefined(event.expiresAt)
        assert.notProperty(JSON.parse(Envelope.toJson(event)), "expiresAt")
      }
    }))

  it.effect("a finite ttl gives expiresAt = time + ttl, a 0 ttl expiresAt = time", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(1_700_000_000_000)
      const event = yield* Envelope.make({ type: "order.placed", data: {}, ttl: "5 minutes" })
      assert.strictEqual(event.expiresAt!.epochMilliseconds, 1_700_000_000_000 + 300_000)
      const now = yield* Envelope.make({ type: "order.placed", data: {}, ttl: 0 })
      assert.isTrue(DateTime.Equivalence(now.expiresAt!, now.time))
    }))

  it.effect("without a ttl, make cannot fail (its error type is never), so existing callers need no new classification", () =>
    Effect.gen(function*() {
      const made: Effect.Effect<Envelope.Envelope<"order.placed", { readonly n: number }>, never> = Envelope.make({
        type: "order.placed",
        data: { n: 1 }
      })
      assert.isUndefined((yield* made).expiresAt)
    }))

  it.effect("a NaN, negative or out-of-range ttl is refused in the error channel with InvalidTtl naming the value, never thrown", () =>
    Effect.gen(function*() {
      const refused: ReadonlyArray<readonly [Duration.Input, string]> = [
        [Number.NaN, "NaN"],
        [{ seconds: Number.NaN }, "NaN"],
        [[Number.NaN, 0], "NaN"],
        [-1, "-1"],
        ["-5 minutes", "-5 minutes"],
        ["-Infinity", "-Infinity"],
        ["200000000 days", "200000000 days"],
        [Number.MAX_VALUE, "e+308"]
      ]
      for (const [ttl, shown] of refused) {
        const exit = yield* Effect.exit(Envelope.make({ type: "order.placed", data: {}, ttl }))
        assert.isTrue(Exit.isFailure(exit), `ttl ${String(ttl)} was taken`)
        const error = yield* Effect.flip(Envelope.make({ type: "order.placed", data: {}, ttl }))
        assert.strictEqual(error._tag, "InvalidTtl")
        assert.include(error.message, "ttl")
        assert.include(error.message, shown)
      }
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { Consumer, Envelope, type Source } from "@jetworker/core"
import { Duration, Effect, Schema } from "effect"

/** A source that must never be opened: a consumer with bad options fails before any I/O. */
const neverOpened: Source.Source = { name: "never-opened", open: () => Effect.die("the source must not be opened") }

/** The options of a minimal consumer, with `extra` on top (cast: they stand for values read from config). */
const consumerWith = (extra: Record<string, unknown>) =>
  Consumer.make({
    name: "options-check",
    source: neverOpened,
    schema: Envelope.schema("test", Schema.Struct({})),
    handle: () => Effect.void,
    classify: {},
    ...(extra as object)
  })

const problemsOf = (extra: Record<string, unknown>) => consumerWith(extra).problems

describe("Consumer options", () => {
  it.effect("expiry.onExpired other than \"ack\" or \"deadLetter\" is a problem naming the value, and run fails with InvalidOptions", () =>
    Effect.gen(function*() {
      for (const onExpired of ["dead-letter", "deadletter", "DeadLetter", "nak", ""]) {
        const consumer = consumerWith({ expiry: { onExpired } })
        assert.deepStrictEqual(consumer.problems, [{
          option: "expiry.onExpired",
          problem: `must be "ack" or "deadLetter", got ${JSON.stringify(onExpired)}`
        }], `onExpired ${JSON.stringify(onExpired)}`)
        const error = yield* Effect.flip(Consumer.run(consumer))
        assert.strictEqual(error._tag, "InvalidOptions")
        assert.include(error.message, "expiry.onExpired")
      }
      // The accepted spellings, and none at all.
      assert.strictEqual(consumerWith({ expiry: { onExpired: "deadLetter" } }).definition.expiredTo, "DeadLetter")
      assert.strictEqual(consumerWith({ expiry: { onExpired: "ack" } }).definition.expiredTo, "Ack")
      assert.strictEqual(consumerWith({ expiry: {} }).definition.expiredTo, "Ack")
      for (const extra of [{ expiry: { onExpired: "ack" } }, { expiry: { onExpired: "deadLetter" } }, { expiry: {} }, {}]) {
        assert.deepStrictEqual(problemsOf(extra), [], JSON.stringify(extra))
      }
    }))

  it.effect("a NaN duration is a problem for every duration option, naming the value got", () =>
    Effect.sync(() => {
      const nans = [Number.NaN, [Number.NaN, 0], { seconds: Number.NaN }]
      const options: ReadonlyArray<readonly [string, (value: unknown) => Record<string, unknown>]> = [
        ["handlerTimeout", (v) => ({ handlerTimeout: v })],
        ["drainTimeout", (v) => ({ drainTimeout: v })],
        ["expiry.skew", (v) => ({ expiry: { skew: v } })],
        ["onOutcomeTimeout", (v) => ({ onOutcomeTimeout: v })],
        ["progressInterval", (v) => ({ progressInterval: v })]
      ]
      for (const [option, set] of options) {
        for (const nan of nans) {
          const problems = problemsOf(set(nan))
          assert.deepStrictEqual(problems.map((p) => p.option), [option], `${option} = ${String(nan)}`)
          assert.include(problems[0]!.problem, "got ", `${option}: ${problems[0]!.problem}`)
          assert.include(problems[0]!.problem, "NaN", `${option}: ${problems[0]!.problem}`)
        }
      }
    }))

  it.effect("batch.maxWait NaN is a problem naming the value got", () =>
    Effect.sync(() => {
      const consumer = Consumer.makeBatch({
        name: "batch-options-check",
        source: neverOpened,
        schema: Envelope.schema("test", Schema.Struct({})),
        handleBatch: () => Effect.succeed([]),
        classify: {},
        batch: { maxSize: 10, maxWait: Number.NaN }
      })
      assert.deepStrictEqual(consumer.problems.map((p) => p.option), ["batch.maxWait"])
      assert.include(consumer.problems[0]!.problem, "got NaN")
    }))

  it.effect("an unparsable duration string is a problem naming the value, never a throw; negative and infinite ones name theirs", () =>
    Effect.sync(() => {
      const problems = problemsOf({ drainTimeout: "5 secs", handlerTimeout: "-1 seconds", progressInterval: Duration.infinity })
      assert.deepStrictEqual(problems.map((p) => p.option), ["handlerTimeout", "drainTimeout", "progressInterval"])
      assert.include(problems[0]!.problem, "got \"-1 seconds\"")
      assert.include(problems[1]!.problem, "got \"5 secs\"")
      assert.include(problems[2]!.problem, "got Infinity")
    }))

  it.effect("valid durations, zero where allowed, stay accepted", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(
        problemsOf({ drainTimeout: 0, progressInterval: "0 millis", expiry: { skew: [1, 0] }, handlerTimeout: { seconds: 5 } }),
        []
      )
      assert.strictEqual(consumerWith({ expiry: { skew: "2 seconds" } }).definition.skewMillis, 2000)
    }))
})

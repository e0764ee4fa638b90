import { assert, describe, it } from "@effect/vitest"
import { Consumer, Envelope, Retry, type Source } from "@jetworker/core"
import { Duration, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"

const millisAfter = (policy: Retry.RetryPolicy, attempt: number) =>
  Effect.map(Retry.delayAfter(policy, attempt), Duration.toMillis)

/** `n` samples of the delay after `attempt`. */
const sample = (policy: Retry.RetryPolicy, attempt: number, n: number) =>
  Effect.forEach(Array.from({ length: n }, () => attempt), (a) => millisAfter(policy, a))

/** Runs an always-failing effect under `schedule`, counting runs; returns the counter and the fiber. */
const retryCounting = (schedule: ReturnType<typeof Retry.inProcessSchedule>) =>
  Effect.gen(function*() {
    let runs = 0
    const fiber = yield* Effect.forkChild(
      Effect.suspend(() => {
        runs++
        return Effect.fail("transient" as const)
      }).pipe(Effect.retry(schedule))
    )
    yield* Effect.yieldNow
    return { runs: () => runs, fiber }
  })

describe("Retry", () => {
  it.effect("delays grow exponentially from the base by the factor, one step per attempt", () =>
    Effect.gen(function*() {
      const doubling = Retry.exponential({ base: "100 millis", cap: "1 hour", jitter: false })
      const delays = yield* Effect.forEach([1, 2, 3, 4, 5, 6], (attempt) => millisAfter(doubling, attempt))
      assert.deepStrictEqual(delays, [100, 200, 400, 800, 1600, 3200])
      const tripling = Retry.exponential({ base: "10 millis", factor: 3, cap: "1 hour", jitter: false })
      assert.deepStrictEqual(yield* Effect.forEach([1, 2, 3, 4], (a) => millisAfter(tripling, a)), [10, 30, 90, 270])
    }))

  it.effect("delays are capped", () =>
    Effect.gen(function*() {
      const policy = Retry.exponential({ base: "100 millis", cap: "1 second", jitter: false })
      const delays = yield* Effect.forEach([3, 4, 5, 10, 64, 1000], (attempt) => millisAfter(policy, attempt))
      assert.deepStrictEqual(delays, [400, 800, 1000, 1000, 1000, 1000])
    }))

  it.effect("jitter spreads each delay within 80% to 120% of the exponential delay", () =>
    Effect.gen(function*() {
      const policy = Retry.exponential({ base: "100 millis", cap: "1 hour" })
      assert.isTrue(policy.jitter, "jitter is on by default")
      for (const attempt of [1, 2, 3, 5]) {
        const exact = 100 * 2 ** (attempt - 1)
        const ratios = (yield* sample(policy, attempt, 300)).map((d) => d / exact)
        for (const ratio of ratios) {
          assert.isAtLeast(ratio, 0.8)
          assert.isAtMost(ratio, 1.2)
        }
        // Spread over the range, not a constant factor.
        assert.isBelow(Math.min(...ratios), 0.9, `attempt ${attempt} has low samples`)
        assert.isAbove(Math.max(...ratios), 1.1, `attempt ${attempt} has high samples`)
      }
    }))

  it.effect("the cap bounds jittered delays too", () =>
    Effect.gen(function*() {
      // 800 ms jittered is 640..960 ms; with a 900 ms cap nothing exceeds 900 ms.
      const policy = Retry.exponential({ base: "100 millis", cap: "900 millis" })
      const fourth = yield* sample(policy, 4, 300)
      for (const d of fourth) {
        assert.isAtLeast(d, 640)
        assert.isAtMost(d, 900)
      }
      assert.include(fourth, 900, "high jitter is cut to the cap")
      const late = yield* sample(policy, 12, 50)
      assert.deepStrictEqual(new Set(late), new Set([900]))
    }))

  it.effect("delayAfter computes delays without waiting on the clock", () =>
    Effect.gen(function*() {
      // Under TestClock a sleep would never end; delayAfter returns at once.
      const delay = yield* millisAfter(Retry.exponential({ base: "1 hour", cap: "10 hours", jitter: false }), 3)
      assert.strictEqual(delay, 4 * 3_600_000)
    }))

  it.effect("inProcessSchedule retries `inProcessRetries` times, after the policy's delays", () =>
    Effect.gen(function*() {
      const policy = Retry.exponential({ base: "100 millis", cap: "1 hour", jitter: false, inProcessRetries: 2 })
      const { fiber, runs } = yield* retryCounting(Retry.inProcessSchedule(policy))
      assert.strictEqual(runs(), 1)
      yield* TestClock.adjust("99 millis")
      assert.strictEqual(runs(), 1)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(runs(), 2, "first retry after 100 ms")
      yield* TestClock.adjust("199 millis")
      assert.strictEqual(runs(), 2)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(runs(), 3, "second retry 200 ms later")
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(runs(), 3, "no third retry")
      const exit = yield* Fiber.await(fiber)
      assert.isTrue(exit._tag === "Failure", "the last failure comes out")
    }))

  it.effect("inProcessSchedule stops before a delay longer than inProcessMaxDelay", () =>
    Effect.gen(function*() {
      const policy = Retry.exponential({
        base: "100 millis",
        cap: "1 hour",
        jitter: false,
        inProcessRetries: 5,
        inProcessMaxDelay: "250 millis"
      })
      const { fiber, runs } = yield* retryCounting(Retry.inProcessSchedule(policy))
      yield* TestClock.adjust("100 millis")
      yield* TestClock.adjust("200 millis")
      assert.strictEqual(runs(), 3)
      // The next delay would be 400 ms: over the 250 ms bound, so it is left to a nak.
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(runs(), 3)
      assert.strictEqual((yield* Fiber.await(fiber))._tag, "Failure")
    }))

  it.effect("inProcessSchedule with inProcessRetries 0 runs once", () =>
    Effect.gen(function*() {
      const { fiber, runs } = yield* retryCounting(
        Retry.inProcessSchedule(Retry.exponential({ base: "10 millis", inProcessRetries: 0 }))
      )
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(runs(), 1)
      assert.strictEqual((yield* Fiber.await(fiber))._tag, "Failure")
    }))

  it.effect("inProcessSchedule delays are jittered and capped like the nak delays", () =>
    Effect.gen(function*() {
      const policy = Retry.exponential({ base: "100 millis", cap: "1 hour", inProcessRetries: 1 })
      const { fiber, runs } = yield* retryCounting(Retry.inProcessSchedule(policy))
      yield* TestClock.adjust("79 millis")
      assert.strictEqual(runs(), 1, "no retry before 80% of the base")
      yield* TestClock.adjust("41 millis")
      assert.strictEqual(runs(), 2, "a retry by 120% of the base")
      yield* TestClock.adjust("1 hour")
      assert.strictEqual((yield* Fiber.await(fiber))._tag, "Failure")
    }))

  it.effect("validate accepts the default and the defaults of exponential()", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(Retry.validate(Retry.defaultPolicy), [])
      assert.deepStrictEqual(Retry.validate(Retry.exponential()), [])
      assert.deepStrictEqual(Retry.exponential(), Retry.defaultPolicy)
      assert.deepStrictEqual(
        Retry.validate(Retry.exponential({ attempts: 1, inProcessRetries: 10, factor: 1, base: "1 millis", cap: "1 millis" })),
        []
      )
    }))

  it.effect("validate rejects unusable options, naming each", () =>
    Effect.sync(() => {
      const problemsOf = (options: Retry.ExponentialOptions) =>
        Retry.validate(Retry.exponential(options)).map((p) => p.option)
      assert.deepStrictEqual(problemsOf({ attempts: 0 }), ["retry.attempts"])
      assert.deepStrictEqual(problemsOf({ attempts: 1001 }), ["retry.attempts"])
      assert.deepStrictEqual(problemsOf({ attempts: 2.5 }), ["retry.attempts"])
      assert.deepStrictEqual(problemsOf({ attempts: Number.NaN }), ["retry.attempts"])
      assert.deepStrictEqual(problemsOf({ inProcessRetries: -1 }), ["retry.inProcessRetries"])
      assert.deepStrictEqual(problemsOf({ inProcessRetries: 11 }), ["retry.inProcessRetries"])
      assert.deepStrictEqual(problemsOf({ factor: 0.5 }), ["retry.factor"])
      assert.deepStrictEqual(problemsOf({ factor: 11 }), ["retry.factor"])
      assert.deepStrictEqual(problemsOf({ factor: Number.POSITIVE_INFINITY }), ["retry.factor"])
      assert.deepStrictEqual(problemsOf({ base: 0 }), ["retry.base"])
      assert.deepStrictEqual(problemsOf({ base: "2 seconds", cap: "1 second" }), ["retry.cap"])
      assert.deepStrictEqual(problemsOf({ cap: Duration.infinity }), ["retry.cap"])
      assert.deepStrictEqual(problemsOf({ inProcessMaxDelay: Duration.infinity }), ["retry.inProcessMaxDelay"])
      assert.deepStrictEqual(problemsOf({ attempts: 0, factor: 0, base: 0 }), ["retry.attempts", "retry.factor", "retry.base"])
      for (const problem of Retry.validate(Retry.exponential({ attempts: 0 }))) {
        assert.include(problem.problem, "got 0")
      }
    }))

  it.effect("a consumer with an invalid retry policy fails with InvalidOptions before touching its source", () =>
    Effect.gen(function*() {
      const source: Source.Source = { name: "never-opened", open: () => Effect.die("the source must not be opened") }
      const consumer = Consumer.make({
        name: "bad-retry",
        source,
        schema: Envelope.schema("test", Schema.Struct({})),
        handle: () => Effect.void,
        classify: {},
        retry: Retry.exponential({ attempts: 0, cap: Duration.infinity })
      })
      const error = yield* Effect.flip(Consumer.run(consumer))
      assert.strictEqual(error._tag, "InvalidOptions")
      if (error._tag === "InvalidOptions") {
        assert.deepStrictEqual(error.problems.map((p) => p.option), ["retry.attempts", "retry.cap"])
        assert.include(error.message, "retry.attempts")
      }
    }))
})

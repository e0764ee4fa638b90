/**
 * A handler that throws (a defect: a plain exception, a rejected promise) is logged with where it
 * threw: its outcome lines (the retry, `Released` `Retrying`, and the dead letter) carry
 * `defect: true` and a bounded `stack` (its first frames, not its message again), so an operator
 * finds the line of code without the source's history. A typed error's line keeps its fields and
 * has neither. The dead-letter record stays as it was (no stack). In-memory broker, test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, ErrorSummary, Outcome, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Data, DateTime, Effect, Fiber, Logger, Schema } from "effect"
import { TestClock } from "effect/testing"

const Event = Schema.Struct({ id: Schema.String })
const metadata = (event: { readonly id: string }) => ({ id: event.id, time: DateTime.makeUnsafe(0) })

class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string; readonly table: string }> {}

interface Line {
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

/**
 * Runs a consumer of one message whose handler is `handle` (2 attempts, 1 s apart) until the
 * message is dead-lettered; gives its outcome log lines, its outcomes and the dead letters.
 */
const runWith = (name: string, handle: Effect.Effect<void, Flaky>) =>
  Effect.gen(function*() {
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver: 5 })
    yield* broker.publish(JSON.stringify({ id: "e1" }))
    const outcomes: Array<Outcome.Outcome> = []
    const lines: Array<Line> = []
    const logger = Logger.map(Logger.formatStructured, (entry) => {
      lines.push({ message: String(entry.message), annotations: entry.annotations })
    })
    const consumer = Consumer.make({
      name,
      source: broker.source,
      schema: Event,
      metadata,
      handle: () => handle,
      classify: { Flaky: "transient" },
      retry: Retry.exponential({ attempts: 2, base: "1 second", jitter: false, inProcessRetries: 0 }),
      onOutcome: (outcome) => Effect.sync(() => void outcomes.push(outcome))
    })
    const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(Logger.layer([logger]))))
    for (let i = 0; i < 500 && !outcomes.some((o) => o._tag === "DeadLettered"); i++) yield* TestClock.adjust("10 millis")
    yield* Fiber.interrupt(fiber)
    const outcomeLines = lines.filter((l) => "outcome" in l.annotations)
    assert.deepStrictEqual(
      outcomeLines.map((l) => [l.annotations.outcome, l.annotations.reason]),
      [["Released", "Retrying"], ["DeadLettered", "AttemptsExhausted"]],
      lines.map((l) => l.message).join("\n")
    )
    return { outcomeLines, outcomes, deadLetters: broker.deadLetters() }
  })

const thisFile = "DefectLogLines.test.ts"

const assertDefectLines = (outcomeLines: ReadonlyArray<Line>, error: string) => {
  for (const line of outcomeLines) {
    const { annotations } = line
    assert.strictEqual(annotations.defect, true, line.message)
    assert.strictEqual(annotations.error, error)
    const stack = annotations.stack
    assert.isString(stack, `${line.message}: a stack`)
    const frames = (stack as string).split("\n")
    assert.include(frames[0], thisFile, `the first frame is the handler's line: ${String(stack)}`)
    assert.isAtMost(frames.length, 10)
    assert.isAtMost((stack as string).length, 2_000)
    assert.notInclude(stack as string, error.slice(error.indexOf(": ") + 2), "the message is not repeated in the stack")
  }
}

describe("a defect's outcome lines", () => {
  it.effect("a handler that throws: its retry and dead-letter lines say defect: true and carry the stack's first frames", () =>
    Effect.gen(function*() {
      const { deadLetters, outcomeLines, outcomes } = yield* runWith(
        "throws",
        Effect.sync(() => {
          throw new TypeError("x is undefined")
        })
      )
      assertDefectLines(outcomeLines, "TypeError: x is undefined")
      // The defect is still retried as transient, then dead-lettered AttemptsExhausted (unchanged).
      const last = outcomes.at(-1)!
      assert.isTrue(last._tag === "DeadLettered" && last.error.kind === "Defect" && last.error.stack !== undefined)
      // The dead-letter record (a header of the dead letter) is unchanged: no stack in it.
      assert.lengthOf(deadLetters, 1)
      assert.deepStrictEqual(Object.keys(deadLetters[0]!.error).sort(), ["fields", "kind", "message", "tag"])
    }))

  it.effect("a handler whose promise rejects: its lines carry the stack of the rejection", () =>
    Effect.gen(function*() {
      const { outcomeLines } = yield* runWith(
        "rejects",
        Effect.promise(async () => {
          throw new RangeError("no such row")
        })
      )
      assertDefectLines(outcomeLines, "RangeError: no such row")
    }))

  it.effect("a typed error's lines keep their fields, without defect or stack", () =>
    Effect.gen(function*() {
      const { outcomeLines } = yield* runWith("typed", Effect.fail(new Flaky({ message: "lock timeout", table: "t" })))
      for (const { annotations } of outcomeLines) {
        assert.deepStrictEqual(Object.keys(annotations).sort(), ["consumer", "deliveryCount", "error", "eventId", "outcome", "reason", "sequence", "subject"])
        assert.strictEqual(annotations.error, "Flaky: lock timeout")
      }
    }))
})

describe("ErrorSummary of a defect", () => {
  it("keeps the stack's frames, at most 10 lines and 2 000 characters, without the message", () => {
    const error = new Error("a message\nover two lines")
    error.stack = `Error: a message\nover two lines\n${Array.from({ length: 50 }, (_, i) => `    at f${i} (${"/deep/path".repeat(30)}/file.ts:${i}:1)`).join("\n")}`
    const stack = ErrorSummary.fromError(error, "Defect").stack!
    assert.isTrue(stack.startsWith("    at f0 ("), stack)
    assert.isAtMost(stack.split("\n").length, 10)
    assert.isAtMost(stack.length, 2_000)
    assert.notInclude(stack, "two lines")
    const short = new Error("short")
    short.stack = "Error: short\n    at g (/a.ts:1:1)\n    at h (/b.ts:2:2)"
    assert.strictEqual(ErrorSummary.fromError(short, "Defect").stack, "    at g (/a.ts:1:1)\n    at h (/b.ts:2:2)")
  })

  it("has no stack for a typed failure, a value without frames, or a stack that cannot be read", () => {
    assert.isUndefined(ErrorSummary.fromError(new Error("typed"), "Failure").stack)
    assert.isUndefined(ErrorSummary.fromError("plain words", "Defect").stack)
    assert.isUndefined(ErrorSummary.fromError({ stack: "no frames here" }, "Defect").stack)
    const hostile = Object.defineProperty(new Error("hostile"), "stack", {
      get: () => {
        throw new Error("no")
      }
    })
    assert.strictEqual(ErrorSummary.fromError(hostile, "Defect").message, "hostile")
    assert.isUndefined(ErrorSummary.fromError(hostile, "Defect").stack)
  })

  it("is left out of the dead-letter record", () => {
    const error = ErrorSummary.fromError(new TypeError("x is undefined"), "Defect")
    assert.isString(error.stack)
    const message = { consumer: "c", subject: "s", sequence: 1, deliveryCount: 1, eventId: "e1" }
    const command = Outcome.toCommand(Outcome.verdict("DeadLettered", { message, reason: "AttemptsExhausted", error }), {
      expiredTo: "Ack",
      now: DateTime.makeUnsafe(0)
    })
    assert.isTrue(command._tag === "DeadLetter" && !("stack" in command.record.error))
  })
})

/**
 * The crash-loop guard (`maxDeliveries`, default twice the attempts) is kept below the broker's
 * MaxDeliver, so a consumer whose MaxDeliver is at or below `maxDeliveries` has a lower guard. The
 * start check only asks for MaxDeliver above the attempts, and with MaxDeliver = attempts + 1 one
 * release that spends no attempt (a shutdown that cut a handler) left the message one run short:
 * dead-lettered `DeliveriesExhausted` after a single run with 2 attempts (a review against the real
 * NATS). The consumer now says so at start, with the MaxDeliver that would not lower it.
 * In-memory broker and test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Retry } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { DateTime, Effect, Logger, References, Schema } from "effect"
import { runUntil } from "./support/testClock.ts"

const Event = Schema.Struct({ id: Schema.String })

/** The WARN lines' events and texts. */
const warnings = () => {
  const lines: Array<{ readonly event: unknown; readonly text: string }> = []
  const logger = Logger.make(({ logLevel, message, fiber }) => {
    const parts = Array.isArray(message) ? message : [message]
    const annotations = fiber.getRef(References.CurrentLogAnnotations)
    if (logLevel === "Warn") lines.push({ event: annotations.event, text: parts.map(String).join(" ") })
  })
  return { lines, layer: Logger.layer([logger]) }
}

const runWith = (maxDeliver: number) =>
  Effect.gen(function*() {
    const broker = InMemoryBroker.make({ lease: "30 seconds", maxDeliver })
    yield* broker.publish(JSON.stringify({ id: "e1" }))
    const log = warnings()
    let settled = false
    const consumer = Consumer.make({
      name: `guard-${maxDeliver}`,
      source: broker.source,
      schema: Event,
      metadata: (event) => ({ id: event.id, time: DateTime.makeUnsafe(0) }),
      handle: () => Effect.void,
      classify: {},
      retry: Retry.exponential({ attempts: 2, base: "1 second", cap: "30 seconds", jitter: false }),
      onOutcome: () =>
        Effect.sync(() => {
          settled = true
        })
    })
    yield* runUntil(Consumer.run(consumer).pipe(Effect.provide(log.layer)), () => settled, 1_000)
    return log.lines.filter((line) => line.event === "consumer.delivery_guard_lowered")
  })

describe("the crash-loop guard lowered by the broker's MaxDeliver", () => {
  it.effect("BE-JOB-003: MaxDeliver 3 with 2 attempts (guard 4): the consumer warns at start that the guard is 2 deliveries and names MaxDeliver 5", () =>
    Effect.gen(function*() {
      const lines = yield* runWith(3)
      assert.lengthOf(lines, 1)
      assert.include(lines[0]!.text, "max_deliver 3 lowers the crash-loop guard to 2 deliveries, below maxDeliveries 4")
      assert.include(lines[0]!.text, "raise max_deliver to at least 5")
    }))

  it.effect("BE-JOB-003: MaxDeliver 5 with 2 attempts leaves the guard at 4: no warning", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* runWith(5), [])
    }))
})

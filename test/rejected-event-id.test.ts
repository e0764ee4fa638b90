/**
 * A rejected delivery names the event its payload states, when the payload is JSON with a valid
 * top-level `id`: its outcome line (`eventId`), its metrics and its dead letter then say which
 * event an operator looks for. Before, every `Rejected` outcome had no event id, and
 * `jetworker dlq list` showed "event -" for a message whose id was plain to read (a newcomer's
 * review: a producer publishing plain JSON without the envelope). In-memory broker, test clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Envelope, type Outcome } from "@jetworker/core"
import { InMemoryBroker } from "@jetworker/testing"
import { Effect, Schema } from "effect"
import { runUntil } from "./support/testClock.ts"

const Payment = Envelope.schema("payment.received", Schema.Struct({ amount: Schema.Number }))

describe("a rejected delivery's event id", () => {
  it.effect("BE-JOB-003: Rejected names the payload's valid top-level id; none for a payload that is no JSON, has no id, or an id that is no valid event id", () =>
    Effect.gen(function*() {
      const broker = InMemoryBroker.make({ lease: "30 seconds" })
      const payloads = [
        JSON.stringify({ id: "payment-7", amount: 1 }), // plain JSON, no envelope
        JSON.stringify({ id: "payment-8", type: "payment.recieved", time: new Date(0).toISOString(), data: { amount: 1 } }),
        "not json",
        JSON.stringify({ amount: 1 }),
        JSON.stringify({ id: "has a space", amount: 1 }),
        JSON.stringify({ id: 42 }),
        JSON.stringify(["payment-9"])
      ]
      for (const payload of payloads) yield* broker.publish(payload)
      const outcomes: Array<Outcome.Outcome> = []
      const consumer = Consumer.make({
        name: "payments",
        source: broker.source,
        schema: Payment,
        handle: () => Effect.void,
        classify: {},
        onOutcome: (outcome) => Effect.sync(() => outcomes.push(outcome))
      })
      yield* runUntil(Consumer.run(consumer), () => outcomes.length === payloads.length, 1_000)
      assert.deepStrictEqual(
        outcomes.map((o) => [o.message.sequence, o._tag, o.message.eventId]),
        [[1, "Rejected", "payment-7"], [2, "Rejected", "payment-8"], [3, "Rejected", undefined], [4, "Rejected", undefined], [5, "Rejected", undefined], [6, "Rejected", undefined], [7, "Rejected", undefined]]
      )
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { Envelope, Outbox } from "@jetworker/core"
import { DateTime, Effect } from "effect"

/** An outbox that keeps what it is given. */
const memoryOutbox = () => {
  const recorded: Array<Outbox.OutboxMessage> = []
  return { recorded, service: Outbox.Outbox.of({ record: (message) => Effect.sync(() => void recorded.push(message)) }) }
}

const envelope = <A>(data: A, expiresAt?: DateTime.Utc): Envelope.Envelope<"order.placed", A> => ({
  id: "e-1",
  type: "order.placed",
  time: DateTime.makeUnsafe(1_700_000_000_000),
  expiresAt,
  data
})

describe("Outbox.recordEnvelope", () => {
  it.effect("an envelope JSON cannot write (bigint data, an expiry outside the Date range) fails with OutboxError when run, records nothing, and never throws", () =>
    Effect.gen(function*() {
      const { recorded, service } = memoryOutbox()
      const unwritable = [
        ["BigInt", envelope({ amount: 10n })],
        ["Invalid time value", envelope({}, DateTime.addDuration(DateTime.makeUnsafe(1_700_000_000_000), "200000000 days"))]
      ] as const
      for (const [cause, event] of unwritable) {
        // Building the effect must not throw: only running it may fail, in its error channel.
        let built: Effect.Effect<void, Outbox.OutboxError, Outbox.Outbox> | undefined
        assert.doesNotThrow(() => {
          built = Outbox.recordEnvelope("orders.placed", event)
        })
        const error = yield* Effect.flip(Effect.provideService(built!, Outbox.Outbox, service))
        assert.strictEqual(error._tag, "OutboxError")
        assert.include(error.message, "e-1")
        assert.include(error.message, cause)
      }
      assert.deepStrictEqual(recorded, [])
      yield* Effect.provideService(Outbox.recordEnvelope("orders.placed", envelope({ amount: 10 })), Outbox.Outbox, service)
      assert.lengthOf(recorded, 1)
    }))
})

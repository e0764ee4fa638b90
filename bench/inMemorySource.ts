/**
 * The in-memory source of the benchmarks without a broker: it hands out a delivery of
 * `payloadOf(sequence)` at every take, without end, and its commands do nothing but tell `acked`
 * how many deliveries were acked (one ack, or all of an `ackAll`).
 */
import type { Delivery, Source } from "@jetworker/core"
import { Duration, Effect } from "effect"

export const inMemorySource = (payloadOf: (sequence: number) => Uint8Array, acked?: (count: number) => void): Source.Source => {
  let sequence = 0
  const ack = acked === undefined ? Effect.void : Effect.sync(() => acked(1))
  const delivery = (seq: number): Delivery.Delivery => ({
    subject: "bench",
    payload: payloadOf(seq),
    sequence: seq,
    deliveryCount: 1,
    header: () => undefined,
    ack,
    nak: () => Effect.void,
    deadLetter: () => Effect.void,
    extend: Effect.void
  })
  return {
    name: "in-memory",
    open: () =>
      Effect.succeed({
        lease: Duration.seconds(30),
        maxDeliver: undefined,
        take: Effect.sync(() => delivery(++sequence)),
        ackAll: (deliveries) =>
          Effect.sync(() => {
            acked?.(deliveries.length)
            return deliveries.map(() => undefined)
          }),
        close: Effect.void
      })
  }
}

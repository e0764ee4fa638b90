/**
 * Acks watched on the wire: a subscription to a consumer's `$JS.ACK` subjects sees every ack, nak
 * and term a client sends for it, with the delivery count and stream sequence it was sent for.
 */
import { NatsConnection } from "@jetworker/nats"
import { Effect } from "effect"

/** One ack-subject message: the delivery it settles and what it said (`+ACK`, `-NAK`, `+TERM`, `+WPI`). */
export interface WireAck {
  readonly deliveryCount: number
  readonly sequence: number
  readonly body: string
}

const decoder = new TextDecoder()

/** Every ack-subject message of `stream`/`consumer` from now on, in arrival order (until the scope closes). */
export const watchAcks = (stream: string, consumer: string) =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const seen: Array<WireAck> = []
    const subscription = connection.subscribe(`$JS.ACK.${stream}.${consumer}.>`, {
      callback: (_error, msg) => {
        // $JS.ACK.<stream>.<consumer>.<delivery count>.<stream seq>.<consumer seq>.<time>.<pending>
        const parts = msg.subject.split(".")
        seen.push({ deliveryCount: Number(parts[4]), sequence: Number(parts[5]), body: decoder.decode(msg.data) })
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => subscription.unsubscribe()))
    yield* Effect.promise(() => connection.flush())
    return seen
  })

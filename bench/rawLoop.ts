/**
 * The hand-written nats.js side shared by the benchmarks: filling a stream with confirmed
 * publishes, and the loop a user would write to consume it (`consume()` with `prefetch` messages,
 * `concurrency` messages in flight, each JSON-decoded and acked with a request the server
 * confirms).
 */
import type { ConsumerMessages, JsMsg } from "@nats-io/jetstream"
import type { NatsConnection } from "@nats-io/transport-node"

const ACK = new TextEncoder().encode("+ACK")
const utf8 = new TextDecoder()

/** Acks `count` messages of `messages`; `onAcked` sees each decoded payload once it is confirmed. */
export const ackAll = (
  nc: NatsConnection,
  messages: ConsumerMessages,
  options: { readonly count: number; readonly concurrency: number; readonly onAcked?: (payload: unknown) => void }
): Promise<void> =>
  new Promise<void>((resolve, reject) => {
    const waiters: Array<() => void> = []
    let done = 0
    let inFlight = 0
    const one = async (msg: JsMsg) => {
      const payload: unknown = JSON.parse(utf8.decode(msg.data))
      await nc.request((msg as unknown as { readonly reply: string }).reply, ACK, { timeout: 5000 })
      options.onAcked?.(payload)
      inFlight--
      waiters.shift()?.()
      if (++done === options.count) resolve()
    }
    void (async () => {
      for await (const msg of messages) {
        while (inFlight >= options.concurrency) await new Promise<void>((r) => waiters.push(r))
        inFlight++
        one(msg).catch(reject)
      }
    })().catch(reject)
  })

/** Runs `publish(n)` for n from 0 to `count` - 1, with at most `window` PubAcks awaited at once. */
export const publishAll = async (count: number, publish: (n: number) => Promise<unknown>, window = 500): Promise<void> => {
  const pending: Array<Promise<unknown>> = []
  for (let n = 0; n < count; n++) {
    pending.push(publish(n))
    if (pending.length >= window) await Promise.all(pending.splice(0))
  }
  await Promise.all(pending)
}

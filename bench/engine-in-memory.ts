/**
 * The engine's own cost per message, without a broker: `Consumer.run` over an in-memory source
 * whose commands do nothing, against a plain loop doing the same per-message work the engine
 * cannot avoid (JSON parse + Schema decode of the envelope), measured in the same run. Prints
 * both rates, microseconds per message and the ratio.
 *
 *   node bench/engine-in-memory.ts [messages=30000] [concurrency=16]
 */
import { Consumer, type Delivery, Envelope, type Source } from "@jetworker/core"
import { Deferred, Duration, Effect, Exit, Fiber, Logger, References, Schema } from "effect"

const total = Number(process.argv[2] ?? 30000)
const concurrency = Number(process.argv[3] ?? 16)
const Event = Envelope.schema("bench.event", Schema.Struct({ n: Schema.Number }))
const payload = new TextEncoder().encode(
  JSON.stringify({ id: "e1", type: "bench.event", time: new Date().toISOString(), data: { n: 1 } })
)

/** The unavoidable work, in a plain loop. */
const baseline = (): number => {
  const decode = Schema.decodeUnknownExit(Event)
  const utf8 = new TextDecoder()
  let acked = 0
  const ack = () => {
    acked++
  }
  const started = performance.now()
  for (let i = 0; i < total; i++) {
    if (Exit.isSuccess(decode(JSON.parse(utf8.decode(payload))))) ack()
  }
  const ms = performance.now() - started
  if (acked !== total) throw new Error("baseline lost messages")
  return ms
}

/** The engine over a source that hands out the same payload and ignores every command. */
const engine = Effect.gen(function*() {
  let sequence = 0
  const delivery = (seq: number): Delivery.Delivery => ({
    subject: "bench",
    payload,
    sequence: seq,
    deliveryCount: 1,
    header: () => undefined,
    ack: Effect.void,
    nak: () => Effect.void,
    deadLetter: () => Effect.void,
    extend: Effect.void
  })
  const source: Source.Source = {
    name: "in-memory",
    open: () =>
      Effect.succeed({
        lease: Duration.seconds(30),
        maxDeliver: undefined,
        take: Effect.sync(() => delivery(++sequence)),
        close: Effect.void
      })
  }
  const done = yield* Deferred.make<void>()
  let settled = 0
  const consumer = Consumer.make({
    name: "bench",
    source,
    schema: Event,
    handle: () => Effect.void,
    classify: {},
    concurrency,
    onOutcome: () => Effect.suspend(() => (++settled === total ? Deferred.succeed(done, undefined) : Effect.void))
  })
  const started = performance.now()
  const fiber = yield* Effect.forkChild(Consumer.run(consumer))
  yield* Deferred.await(done)
  const ms = performance.now() - started
  yield* Fiber.interrupt(fiber)
  return ms
}).pipe(
  Effect.provide(Logger.layer([Logger.consolePretty()])),
  Effect.provideService(References.MinimumLogLevel, "Error")
)

baseline() // warm-up
const base = baseline()
const eng = await Effect.runPromise(engine)
const rate = (ms: number) => `${((total / ms) * 1000).toFixed(0)} msg/s (${((ms * 1000) / total).toFixed(1)} µs/msg)`
console.log(`messages ${total}, concurrency ${concurrency}, no broker`)
console.log(`decode-only loop: ${rate(base)}`)
console.log(`jetworker engine: ${rate(eng)}`)
console.log(`engine / baseline: ${(base / eng).toFixed(3)}  (engine overhead ${(((eng - base) * 1000) / total).toFixed(1)} µs/msg)`)

/**
 * The engine's own cost per message, without a broker: `Consumer.run` over an in-memory source
 * whose commands do nothing, against a plain loop doing the same per-message work the engine
 * cannot avoid (JSON parse + Schema decode of the envelope), measured in the same run. Prints
 * both rates, microseconds per message and the ratio. With a batch size, the engine runs in batch
 * mode (`Consumer.makeBatch`, `concurrency` batches at once, every element succeeding, the acks
 * through the source's `ackAll`); ONOUTCOME=0 runs it without an `onOutcome` hook (the end is
 * then found by counting acks).
 *
 *   node bench/engine-in-memory.ts [messages=30000] [concurrency=16] [batchSize=0]
 */
import { Consumer, Envelope } from "@jetworker/core"
import { Deferred, Duration, Effect, Exit, Fiber, Logger, References, Result, Schema } from "effect"
import { inMemorySource } from "./inMemorySource.ts"

const total = Number(process.argv[2] ?? 30000)
const concurrency = Number(process.argv[3] ?? 16)
const batchSize = Number(process.argv[4] ?? 0)
const withOnOutcome = process.env.ONOUTCOME !== "0"
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
  const done = yield* Deferred.make<void>()
  let settled = 0
  const count = (n: number) => {
    settled += n
    if (settled >= total) Deferred.doneUnsafe(done, Effect.void)
  }
  // Without an `onOutcome` hook, the end is found by counting acks.
  const source = inMemorySource(() => payload, withOnOutcome ? undefined : count)
  const onOutcome = withOnOutcome ? { onOutcome: () => Effect.sync(() => count(1)) } : {}
  const consumer = batchSize > 0
    ? Consumer.makeBatch({
      name: "bench",
      source,
      schema: Event,
      batch: { maxSize: batchSize, maxWait: Duration.millis(5) },
      handleBatch: (events) => Effect.succeed(events.map(() => Result.succeed(undefined))),
      classify: {},
      concurrency,
      ...onOutcome
    })
    : Consumer.make({
      name: "bench",
      source,
      schema: Event,
      handle: () => Effect.void,
      classify: {},
      concurrency,
      ...onOutcome
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
console.log(
  `messages ${total}, concurrency ${concurrency}${batchSize > 0 ? `, batches of ${batchSize}` : ""}` +
    `${withOnOutcome ? "" : ", no onOutcome"}, no broker`
)
console.log(`decode-only loop: ${rate(base)}`)
console.log(`jetworker engine: ${rate(eng)}`)
console.log(`engine / baseline: ${(base / eng).toFixed(3)}  (engine overhead ${(((eng - base) * 1000) / total).toFixed(1)} µs/msg)`)

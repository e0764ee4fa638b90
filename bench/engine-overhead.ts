/**
 * Engine overhead: messages per second through `Consumer.run` with a trivial handler, against a
 * hand-written nats.js pull loop that does the same work (JSON decode, confirmed ack request per
 * message, same concurrency and prefetch), on the same server in the same run. Prints both rates
 * and their ratio. No database: this isolates what the engine adds on top of the broker. The sides
 * alternate over `rounds` rounds (the order rotates); it prints medians with min and max, and
 * this process's CPU time per message on each side (the server shares the machine; CPU per
 * message moves less than rates between runs), with the bytes it allocated (and had promoted, and
 * allocated straight into the old space) and the garbage collector's time per message
 * (`gcStats.ts`), and its socket writes to NATS per message (`socketWrites.ts`).
 * BENCH_CPU_PROFILE=dir writes a CPU profile of each round to `dir` (jetworker's: the consumer's
 * run only; the hand-written loop's: its consuming only).
 *
 *   node bench/engine-overhead.ts [messages=5000] [concurrency=16] [prefetch=concurrency] [rounds=3]
 */
import { Consumer, Envelope } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { jetstream, jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { Deferred, Effect, Fiber, Logger, References, Schema } from "effect"
import { profiled } from "./cpuProfile.ts"
import { ackAll, publishAll } from "./rawLoop.ts"
import * as SocketWrites from "./socketWrites.ts"
import * as Stopwatch from "./stopwatch.ts"

const total = Number(process.argv[2] ?? 5000)
const concurrency = Number(process.argv[3] ?? 16)
const prefetch = Number(process.argv[4] ?? concurrency)
const rounds = Number(process.argv[5] ?? 3)
const servers = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const Event = Envelope.schema("bench.event", Schema.Struct({ n: Schema.Number }))
const encoder = new TextEncoder()
const countsWrites = SocketWrites.install(process.env.DATABASE_URL ?? "postgres://127.0.0.1:5432", servers)

/** A side's figures per message (rate, CPU, allocation, the collector's time). */
type Run = Stopwatch.PerMessage

/** Starts the clock; the returned function stops it and gives the {@link Run} of `total` messages. */
const stopwatch = () => {
  const stopped = Stopwatch.start()
  return (): Run => Stopwatch.perMessage(stopped(), total)
}

/** Measures `consume` (which consumes `total` messages). */
const measured = async (consume: () => Promise<void>): Promise<Run> => {
  const stop = stopwatch()
  await consume()
  return stop()
}

let profiles = 0
let baselineProfiles = 0

const fill = async (stream: string) => {
  // Both sides skip nats.js's per-request async stack capture (an Error per request).
  const nc = await connect({ servers, noAsyncTraces: true })
  const js = jetstream(nc)
  const jsm = await jetstreamManager(nc)
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`] })
  await jsm.consumers.add(stream, { durable_name: "c", ack_policy: "explicit" as never, ack_wait: 30_000_000_000 })
  const time = new Date().toISOString()
  await publishAll(total, (n) =>
    js.publish(`${stream}.e`, encoder.encode(JSON.stringify({ id: `e${n}`, type: "bench.event", time, data: { n } }))))
  return { nc, jsm }
}

/** The hand-written baseline: consume with the same prefetch, `concurrency` workers, confirmed acks. */
const baseline = async (): Promise<Run> => {
  const stream = `BENCH_BASE_${Date.now()}`
  const { nc, jsm } = await fill(stream)
  const consumer = await jetstream(nc).consumers.get(stream, "c")
  const messages = await consumer.consume({ max_messages: prefetch })
  const run = await profiled(`baseline-${baselineProfiles++}`, () => measured(() => ackAll(nc, messages, { count: total, concurrency })))
  messages.stop()
  await jsm.streams.delete(stream)
  await nc.close()
  return run
}

/** The engine: the same stream shape, a handler that does nothing. */
const engine = async (): Promise<Run> => {
  const stream = `BENCH_ENGINE_${Date.now()}`
  const { nc, jsm } = await fill(stream)
  await nc.close()
  const program = Effect.gen(function*() {
    yield* Topology.ensureConsumer({ stream, name: "c", ackWait: "30 seconds" })
    const allDone = yield* Deferred.make<void>()
    let done = 0
    const consumer = Consumer.make({
      name: "c",
      source: JetStreamSource.make({ stream, consumer: "c" }),
      schema: Event,
      handle: () => Effect.void,
      classify: {},
      concurrency,
      prefetch,
      onOutcome: () => Effect.suspend(() => (++done === total ? Deferred.succeed(allDone, undefined) : Effect.void))
    })
    const stop = stopwatch()
    const fiber = yield* Effect.forkChild(Consumer.run(consumer))
    yield* Deferred.await(allDone)
    const run = stop()
    yield* Fiber.interrupt(fiber)
    return run
  }).pipe(
    Effect.provide(NatsConnection.layer({ servers })),
    Effect.provide(Logger.layer([Logger.consolePretty()])),
    Effect.provideService(References.MinimumLogLevel, "Error")
  )
  const run = await profiled(`jetworker-${profiles++}`, () => Effect.runPromise(program))
  const admin = await connect({ servers })
  const manager = await jetstreamManager(admin)
  await manager.streams.delete(stream)
  // The source declares a dead-letter stream for the consumer; leave nothing behind.
  await manager.streams.delete(DeadLetter.destination(stream, "c").stream).catch(() => false)
  await admin.close()
  void jsm
  return run
}

// Alternating rounds (the order rotates), each side on a fresh stream; medians with min and max.
const bases: Array<Run> = []
const engines: Array<Run> = []
for (let round = 0; round < rounds; round++) {
  if (round % 2 === 0) {
    bases.push(await baseline())
    engines.push(await engine())
  } else {
    engines.push(await engine())
    bases.push(await baseline())
  }
}
const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
const range = (values: ReadonlyArray<number>) => `${Math.min(...values).toFixed(0)}..${Math.max(...values).toFixed(0)}`
const rates = (runs: ReadonlyArray<Run>) => runs.map((run) => run.rate)
const cpu = (runs: ReadonlyArray<Run>) =>
  `CPU ${median(runs.map((run) => run.cpuMicros)).toFixed(0)} µs/msg, allocated ${(median(runs.map((run) => run.allocatedBytes)) / 1024).toFixed(1)} KB/msg ` +
  `(promoted ${(median(runs.map((run) => run.promotedBytes)) / 1024).toFixed(2)}, tenured ${(median(runs.map((run) => run.tenuredBytes)) / 1024).toFixed(2)}), GC ${median(runs.map((run) => run.gcMicros)).toFixed(1)} µs/msg` +
  (countsWrites
    ? `, ${median(runs.map((run) => run.writesNats)).toFixed(2)} writes to NATS/msg (${median(runs.map((run) => run.inWritesMicros)).toFixed(0)} µs/msg in them)`
    : "")
const ratios = engines.map((run, i) => run.rate / bases[i]!.rate)
console.log(`messages ${total}, concurrency ${concurrency}, prefetch ${prefetch}, confirmed acks, ${rounds} rounds`)
console.log(`hand-written nats.js loop: ${median(rates(bases)).toFixed(0)} msg/s (${range(rates(bases))}), ${cpu(bases)}`)
console.log(`jetworker engine:          ${median(rates(engines)).toFixed(0)} msg/s (${range(rates(engines))}), ${cpu(engines)}`)
console.log(
  `engine / baseline:         ${(median(rates(engines)) / median(rates(bases))).toFixed(2)} of medians ` +
    `(per round ${Math.min(...ratios).toFixed(2)}..${Math.max(...ratios).toFixed(2)})`
)

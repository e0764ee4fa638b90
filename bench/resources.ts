/**
 * Resources and timings, side by side with the hand-written nats.js loop where one applies, in
 * the same run (no-op handler, `concurrency` handlers, prefetch = concurrency, confirmed acks):
 *
 * - peak RSS while consuming a backlog of each size in `backlogs`, each side in a child process
 *   of its own (`process.resourceUsage().maxRSS` at the last ack), with the rate it reached (the
 *   clock stops at the last ack on both sides) and the live heap then (the used heap after a full
 *   collection, the consumer still running); each side under each of `heapSettings` (V8's
 *   defaults, and the heap bounded two ways);
 * - latency from publish to confirmed ack (p50, p90, p99, max) at a paced load of half the raw
 *   loop's capacity while this process publishes at full speed (its rate on the first backlog's
 *   count, published as it consumes: what the machine sustains with the publisher on it too; its
 *   rate on a backlog can be twice that), the same offered load for both sides, in 3 alternating
 *   rounds per side (1 with BENCH_SMOKE), each percentile the median of the rounds; each round
 *   also says how long its publishing took and how long after the last publish the last ack came,
 *   so that a round that queued (did not keep up with the offered load) shows as one;
 * - time from SIGTERM to exit for a jetworker worker under `Worker.runMain` with `concurrency`
 *   handlers in flight and 1 s of work left in each (the raw loop has no drain to measure); the
 *   run checks that every one of those messages was acked before the exit.
 *
 *   node bench/resources.ts [backlogs=10000,1000000] [concurrency=16]
 *
 * Prints the tables and writes them to `bench/results/resources.md`, unless BENCH_SMOKE is set.
 * NATS_URL (default nats://127.0.0.1:4222) selects the server. Internally the script is also its
 * own child (`--child <mode> <json>`).
 */
import { Consumer, Envelope, type Outcome } from "@jetworker/core"
import { DeadLetter, JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { Worker } from "@jetworker/node"
import { jetstream, jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { Deferred, Effect, Logger, References, Schema } from "effect"
import { spawn } from "node:child_process"
import { mkdir, writeFile } from "node:fs/promises"
import os from "node:os"
import { fileURLToPath } from "node:url"
import v8 from "node:v8"
import { ackAll, publishAll } from "./rawLoop.ts"

const servers = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const Event = Envelope.schema("bench.event", Schema.Struct({ n: Schema.Number, t: Schema.Number }))
const encoder = new TextEncoder()
/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes. */
const epochMillis = () => performance.timeOrigin + performance.now()

interface ChildArgs {
  readonly stream: string
  readonly consumer: string
  readonly count: number
  readonly concurrency: number
}

interface Drained {
  readonly rssMiB: number
  readonly rate: number
  /** The largest size V8 gave its young generation (both semi-spaces) during the run, in MiB. */
  readonly youngMiB: number
  /** The largest size of V8's old space during the run, in MiB. */
  readonly oldMiB: number
  /**
   * The heap still alive once the last message was acked, the consumer still running: V8's used
   * heap after a full collection, in MiB. What the process keeps, whatever the heap's sizing did.
   */
  readonly liveMiB: number
}

interface Latencies {
  readonly p50: number
  readonly p90: number
  readonly p99: number
  readonly max: number
  /** When the last message was acked (`epochMillis`). */
  readonly lastAckAt: number
}

const percentiles = (values: Array<number>, lastAckAt: number): Latencies => {
  const sorted = values.sort((a, b) => a - b)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: sorted[sorted.length - 1]!, lastAckAt }
}

const report = (value: unknown) => process.stdout.write(`RESULT ${JSON.stringify(value)}\n`)
const rssMiB = () => process.resourceUsage().maxRSS / 1024

/**
 * The peak RSS so far, then the live heap ({@link Drained.liveMiB}): the full collection comes
 * after the peak is read, so it cannot raise it. The drain children run with `--expose-gc`.
 */
const peakAndLive = () => {
  const peak = rssMiB()
  const gc: unknown = Reflect.get(globalThis, "gc")
  if (typeof gc !== "function") throw new Error("the drain children run with --expose-gc")
  gc()
  return { rssMiB: peak, liveMiB: process.memoryUsage().heapUsed / 2 ** 20 }
}

/**
 * Samples the sizes V8 gives its young generation and old space every 50 ms (no timer keeps the
 * process alive) and returns their peaks so far: what the heap's sizing did during the run, the
 * cause of most of the peak RSS's growth with the backlog (docs/performance-log.md, the known gaps in detail).
 */
const heapPeaks = () => {
  let young = 0
  let old = 0
  const sample = () => {
    for (const space of v8.getHeapSpaceStatistics()) {
      if (space.space_name === "new_space") young = Math.max(young, space.space_size)
      else if (space.space_name === "old_space") old = Math.max(old, space.space_size)
    }
  }
  setInterval(sample, 50).unref()
  return () => {
    sample()
    return { youngMiB: young / 2 ** 20, oldMiB: old / 2 ** 20 }
  }
}

// ---------------------------------------------------------------------------------------------
// Children

/** The hand-written loop: consume() with the prefetch, `concurrency` workers, confirmed acks. */
const rawChild = async (args: ChildArgs, latency: boolean) => {
  const peaks = heapPeaks()
  const nc = await connect({ servers, noAsyncTraces: true })
  const consumer = await jetstream(nc).consumers.get(args.stream, args.consumer)
  const messages = await consumer.consume({ max_messages: args.concurrency })
  const latencies: Array<number> = []
  let started = 0
  let lastAckAt = 0
  let first = true
  // The clock starts at the first confirmed ack.
  await ackAll(nc, messages, {
    count: args.count,
    concurrency: args.concurrency,
    onAcked: (payload) => {
      if (started === 0) started = performance.now()
      lastAckAt = epochMillis()
      // The first message says the loop runs; the paced load comes after it.
      if (latency && first) report("ready")
      else if (latency) latencies.push(epochMillis() - (payload as { readonly data: { readonly t: number } }).data.t)
      first = false
    }
  })
  // The last ack is in: the clock stops, and the memory is read while the loop still runs.
  const seconds = (performance.now() - started) / 1000
  const drained = latency ? undefined : { ...peakAndLive(), rate: args.count / seconds }
  messages.stop()
  await nc.close()
  report(drained === undefined ? percentiles(latencies, lastAckAt) : ({ ...drained, ...peaks() } satisfies Drained))
}

/** jetworker: `Consumer.run` over a `JetStreamSource`, a handler that does nothing. */
const engineChild = async (args: ChildArgs, latency: boolean) => {
  const peaks = heapPeaks()
  const sentAt = new Map<string, number>()
  const latencies: Array<number> = []
  let lastAckAt = 0
  const program = Effect.gen(function*() {
    const allDone = yield* Deferred.make<void>()
    let done = 0
    let started = 0
    const consumer = Consumer.make({
      name: args.consumer,
      source: JetStreamSource.make({ stream: args.stream, consumer: args.consumer }),
      schema: Event,
      handle: (event) =>
        Effect.sync(() => {
          if (started === 0) started = performance.now()
          if (latency) sentAt.set(event.id, event.data.t)
        }),
      classify: {},
      concurrency: args.concurrency,
      prefetch: args.concurrency,
      onOutcome: (outcome: Outcome.Outcome) =>
        Effect.suspend(() => {
          lastAckAt = epochMillis()
          // The first message says the consumer runs; the paced load comes after it.
          if (latency && done === 0) report("ready")
          else if (latency && outcome.message.eventId !== undefined) {
            latencies.push(epochMillis() - sentAt.get(outcome.message.eventId)!)
            sentAt.delete(outcome.message.eventId)
          }
          return ++done === args.count ? Deferred.succeed(allDone, undefined) : Effect.void
        })
    })
    // The last outcome is in: the clock stops, and the memory is read while the consumer still
    // runs (the race ends it after).
    const lastOutcome = Effect.sync(() => {
      const seconds = (performance.now() - started) / 1000
      return latency ? undefined : { ...peakAndLive(), rate: args.count / seconds }
    })
    return yield* Effect.raceFirst(Effect.andThen(Deferred.await(allDone), lastOutcome), Consumer.run(consumer))
  }).pipe(
    Effect.provide(NatsConnection.layer({ servers })),
    Effect.provide(Logger.layer([Logger.consolePretty()])),
    Effect.provideService(References.MinimumLogLevel, "Error")
  )
  const drained = await Effect.runPromise(program)
  report(drained === undefined ? percentiles(latencies, lastAckAt) : ({ ...drained, ...peaks() } satisfies Drained))
}

/** A worker whose handlers each sleep 1 s; says "ready" once `concurrency` of them run. */
const sigtermChild = (args: ChildArgs) => {
  let running = 0
  const consumer = Consumer.make({
    name: args.consumer,
    source: JetStreamSource.make({ stream: args.stream, consumer: args.consumer }),
    schema: Event,
    handle: () =>
      Effect.andThen(
        Effect.sync(() => {
          if (++running === args.concurrency) report("ready")
        }),
        Effect.sleep("1 second")
      ),
    classify: {},
    concurrency: args.concurrency,
    prefetch: args.concurrency
  })
  // Its JSON log lines go to stdout with the results; the parent reads only the results.
  Worker.runMain(Consumer.run(consumer), { layer: NatsConnection.layer({ servers }), settings: { healthPort: "off" } })
}

// ---------------------------------------------------------------------------------------------
// Parent

/** The running children by mode (the SIGTERM measurement signals its child). */
const children = new Map<string, ReturnType<typeof spawn>>()

/**
 * The heap settings each side drains every backlog under, each in a process of its own:
 *
 * - V8's defaults;
 * - bounded, as docs/performance.md suggests for a deployment that wants its memory flat under
 *   load: a young generation of at most 4 MiB per semi-space, an old generation of at most
 *   128 MiB, well above the 30 to 40 MiB a worker's old space holds after start-up;
 * - bounded tight: a young generation of a fixed 4 MiB per semi-space and an old generation of at
 *   most 56 MiB, close to what the process needs: the old space then grows by a few MiB over a
 *   long run instead of filling a larger bound. Tighter costs rate: at 48 MiB both sides ran at
 *   about half their rate (docs/performance-log.md).
 */
const heapSettings = [
  { key: "default", name: "V8's default heap sizing", flags: [] },
  { key: "bounded", name: "the heap bounded", flags: ["--max-semi-space-size=4", "--max-old-space-size=128"] },
  { key: "tight", name: "the heap bounded tight", flags: ["--min-semi-space-size=4", "--max-semi-space-size=4", "--max-old-space-size=56"] }
] as const

const child = (mode: string, args: ChildArgs, onReady?: () => void, timeoutMillis = 600_000, flags: ReadonlyArray<string> = []) =>
  new Promise<{ readonly result: unknown; readonly code: number | null; readonly exitedAt: number }>((resolve, reject) => {
    const proc = spawn(process.execPath, [...flags, fileURLToPath(import.meta.url), "--child", mode, JSON.stringify(args)], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    let result: unknown
    let buffer = ""
    const timer = setTimeout(() => {
      proc.kill("SIGKILL")
      reject(new Error(`${mode}: no result within ${timeoutMillis} ms`))
    }, timeoutMillis)
    proc.stdout.on("data", (chunk: Buffer) => {
      buffer += chunk.toString()
      let newline: number
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline)
        buffer = buffer.slice(newline + 1)
        if (!line.startsWith("RESULT ")) continue
        const value: unknown = JSON.parse(line.slice(7))
        if (value === "ready") onReady?.()
        else result = value
      }
    })
    proc.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ result, code, exitedAt: performance.now() })
    })
    proc.on("error", reject)
    children.set(mode, proc)
  })

const parent = async () => {
  const backlogs = (process.argv[2] ?? "10000,1000000").split(",").map(Number)
  const concurrency = Number(process.argv[3] ?? 16)
  for (const value of [...backlogs, concurrency]) {
    if (!Number.isSafeInteger(value) || value < 1) throw new Error(`expected positive integers, got ${process.argv.slice(2).join(" ")}`)
  }
  const nc = await connect({ servers, noAsyncTraces: true, name: "jetworker-bench-resources" })
  const js = jetstream(nc)
  const jsm = await jetstreamManager(nc)
  const streams: Array<string> = []
  const makeStream = async (consumers: ReadonlyArray<string>) => {
    const stream = `BENCH_RES_${Date.now().toString(36)}_${streams.length}`
    streams.push(stream)
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`] })
    for (const name of consumers) await jsm.consumers.add(stream, Topology.consumerConfig({ stream, name, ackWait: "30 seconds" }))
    return stream
  }
  let sequence = 0
  const publish = (stream: string) => {
    const n = sequence++
    return js.publish(
      `${stream}.e`,
      encoder.encode(JSON.stringify({ id: `e${n}`, type: "bench.event", time: new Date().toISOString(), data: { n, t: epochMillis() } }))
    )
  }
  const fill = (stream: string, count: number) => publishAll(count, () => publish(stream), 1000)
  const cleanup = async () => {
    for (const stream of streams) {
      await jsm.streams.delete(stream).catch(() => false)
      for (const name of ["engine", "sigterm", ...heapSettings.map(({ key }) => `engine-${key}`)]) {
        await jsm.streams.delete(DeadLetter.destination(stream, name).stream).catch(() => false)
      }
    }
  }

  try {
    // Peak RSS per backlog; both sides' consumers on one stream, filled once. The first backlog
    // measures the capacity for the latency run, which comes before the larger backlogs (whose
    // stream deletion keeps the server busy for a while).
    // Each side once under each of `heapSettings`.
    interface Memory {
      readonly backlog: number
      /** By setting, in the order of `heapSettings`. */
      readonly sides: ReadonlyArray<{ readonly raw: Drained; readonly engine: Drained }>
    }
    const memory: Array<Memory> = []
    const drain = async (backlog: number) => {
      const stream = await makeStream(heapSettings.flatMap(({ key }) => [`raw-${key}`, `engine-${key}`]))
      const filledAt = performance.now()
      await fill(stream, backlog)
      console.log(`backlog ${backlog}: published in ${((performance.now() - filledAt) / 1000).toFixed(1)} s`)
      const run = async (side: "raw" | "engine", key: string, flags: ReadonlyArray<string>) =>
        // `--expose-gc` for the live heap's collection; it changes nothing in the heap's sizing.
        (await child(`${side}-drain`, { stream, consumer: `${side}-${key}`, count: backlog, concurrency }, undefined, 600_000, [
          ...flags,
          "--expose-gc"
        ]))
          .result as Drained
      const sides: Array<Memory["sides"][number]> = []
      for (const { flags, key, name } of heapSettings) {
        const raw = await run("raw", key, flags)
        const engine = await run("engine", key, flags)
        console.log(
          `backlog ${backlog}, ${name}: raw loop ${raw.rssMiB.toFixed(0)} MiB at ${raw.rate.toFixed(0)} msg/s, ` +
            `jetworker ${engine.rssMiB.toFixed(0)} MiB at ${engine.rate.toFixed(0)} msg/s`
        )
        sides.push({ raw, engine })
      }
      memory.push({ backlog, sides })
      await jsm.streams.delete(stream)
    }
    await drain(backlogs[0]!)

    // One round of the latency run: `side` consumes `count` messages published after it runs,
    // paced at `offered` msg/s (a tick every 10 ms publishes what the rate allows up to then) or,
    // with "full", as fast as this process publishes (confirmed, 1 000 awaited at a time).
    interface Round extends Latencies {
      /** How long the publishing took, in seconds (longer than planned: the publisher fell behind). */
      readonly publishSeconds: number
      /**
       * From the last publish's confirmation to the last ack, in ms: near zero (or below, the ack
       * coming before the confirmation) when the side kept up, seconds when it queued.
       */
      readonly lagMillis: number
      /** Messages per second from the first publish to the last ack. */
      readonly rate: number
    }
    const latencyRound = async (side: "raw" | "engine", offered: number | "full", count: number): Promise<Round> => {
      const stream = await makeStream([side])
      let started: () => void = () => undefined
      const ready = new Promise<void>((resolve) => (started = resolve))
      // One message first, whose settlement says the consumer runs; then the load.
      const run = child(`${side}-latency`, { stream, consumer: side, count: count + 1, concurrency }, () => started())
      await publish(stream)
      await ready
      const beganAt = epochMillis()
      if (offered === "full") {
        await fill(stream, count)
      } else {
        const begin = performance.now()
        let sent = 0
        for (;;) {
          const due = Math.min(count, Math.floor(((performance.now() - begin) / 1000) * offered))
          const batch: Array<Promise<unknown>> = []
          for (; sent < due; sent++) batch.push(publish(stream))
          await Promise.all(batch)
          if (sent === count) break
          await new Promise((resolve) => setTimeout(resolve, 10))
        }
      }
      const publishedAt = epochMillis()
      const result = (await run).result as Latencies
      return {
        ...result,
        publishSeconds: (publishedAt - beganAt) / 1000,
        lagMillis: result.lastAckAt - publishedAt,
        rate: count / ((result.lastAckAt - beganAt) / 1000)
      }
    }

    // The capacity the paced load is half of: the raw loop's rate while this process publishes
    // at full speed, as it publishes the paced load. The rate on a backlog is not it: the
    // publisher shares the machine's cores, and half that rate can be more than the two sustain
    // together (then both sides queue for the whole run, and the latency measures the queue).
    const flow = await latencyRound("raw", "full", backlogs[0]!)
    const capacity = flow.rate
    console.log(`capacity: the raw loop at ${capacity.toFixed(0)} msg/s with the publisher running (${memory[0]!.sides[0]!.raw.rate.toFixed(0)} on the backlog)`)
    // Latency at half that capacity, the same offered load for both sides, in `latencyRounds`
    // alternating rounds: a tail is a handful of pauses of the machine, which one round of a side
    // may catch and the other not, so each percentile is the median of the rounds.
    const rate = Math.max(100, Math.floor(capacity / 2))
    const seconds = 5
    const latencyRounds = process.env.BENCH_SMOKE === undefined ? 3 : 1
    const rounds: Record<"raw" | "engine", Array<Round>> = { raw: [], engine: [] }
    const paced = async (side: "raw" | "engine") => {
      const result = await latencyRound(side, rate, rate * seconds)
      rounds[side].push(result)
      console.log(`latency ${side} at ${rate} msg/s, round ${rounds[side].length}: ${JSON.stringify(result)}`)
    }
    for (let round = 0; round < latencyRounds; round++) {
      for (const side of round % 2 === 0 ? (["raw", "engine"] as const) : (["engine", "raw"] as const)) await paced(side)
    }
    const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
    const latency = (side: "raw" | "engine", q: "p50" | "p90" | "p99" | "max") => median(rounds[side].map((result) => result[q]))
    const p99Range = (side: "raw" | "engine") => {
      const p99s = rounds[side].map((result) => result.p99)
      return `${Math.min(...p99s).toFixed(1)}..${Math.max(...p99s).toFixed(1)}`
    }

    // SIGTERM to exit with `concurrency` handlers in flight, 1 s of work left in each.
    const stream = await makeStream(["sigterm"])
    await fill(stream, concurrency)
    let signalledAt = 0
    const proc = child("sigterm", { stream, consumer: "sigterm", count: concurrency, concurrency }, () => {
      signalledAt = performance.now()
      children.get("sigterm")!.kill("SIGTERM")
    }, 60_000)
    const exited = await proc
    const shutdownMillis = exited.exitedAt - signalledAt
    const info = await jsm.consumers.info(stream, "sigterm")
    const acked = info.ack_floor.stream_seq
    console.log(`SIGTERM to exit: ${shutdownMillis.toFixed(0)} ms (exit code ${exited.code}, ${acked} of ${concurrency} acked)`)
    if (signalledAt === 0 || exited.code !== 0 || acked !== concurrency || info.num_ack_pending !== 0) {
      throw new Error(`the worker did not drain: exit code ${exited.code}, ${acked} acked, ${info.num_ack_pending} pending`)
    }

    for (const backlog of backlogs.slice(1)) await drain(backlog)

    const fixed = (value: number, digits = 0) => value.toFixed(digits)
    const rssTable = (setting: number) => [
      "| backlog | raw loop peak RSS (MiB) | jetworker peak RSS (MiB) | jetworker / raw | raw msg/s | jetworker msg/s |",
      "|---:|---:|---:|---:|---:|---:|",
      ...memory.map(({ backlog, sides }) => {
        const { engine, raw } = sides[setting]!
        return `| ${backlog} | ${fixed(raw.rssMiB)} | ${fixed(engine.rssMiB)} | ${fixed(engine.rssMiB / raw.rssMiB, 2)} | ${fixed(raw.rate)} | ${fixed(engine.rate)} |`
      })
    ]
    const table = [
      ...heapSettings.flatMap(({ flags, name }, setting) => [
        setting === 0 ? `With ${name}:` : `With ${name} (\`node ${flags.join(" ")}\`, both sides):`,
        "",
        ...rssTable(setting),
        ""
      ]),
      "What V8's heap sizing did in those runs: the peak size of its young generation (both semi-spaces) and of its old " +
        "space, in MiB. The peak RSS grows with the backlog where these grow, not where more stays alive:",
      "",
      `| backlog | ${heapSettings.map(({ key }) => `${key}: raw loop young / old | ${key}: jetworker young / old`).join(" | ")} |`,
      `|---:|${heapSettings.map(() => "---:|---:|").join("")}`,
      ...memory.map(({ backlog, sides }) =>
        `| ${backlog} | ${sides.flatMap(({ engine, raw }) => [raw, engine]).map((side) => `${fixed(side.youngMiB)} / ${fixed(side.oldMiB)}`).join(" | ")} |`
      ),
      "",
      "What stayed alive: the used heap after a full collection, taken when the last message was acked while the " +
        "consumer still ran, in MiB (what the process keeps, whatever the heap's sizing did):",
      "",
      `| backlog | ${heapSettings.map(({ key }) => `${key}: raw loop | ${key}: jetworker`).join(" | ")} |`,
      `|---:|${heapSettings.map(() => "---:|---:|").join("")}`,
      ...memory.map(({ backlog, sides }) =>
        `| ${backlog} | ${sides.flatMap(({ engine, raw }) => [raw, engine]).map((side) => fixed(side.liveMiB, 1)).join(" | ")} |`
      ),
      "",
      `Latency, publish to confirmed ack, at ${rate} msg/s for ${seconds} s (half the ${fixed(capacity)} msg/s the raw loop reached ` +
        `on ${backlogs[0]} messages published as it consumed them; on the backlog it reached ${fixed(memory[0]!.sides[0]!.raw.rate)}), in ms; ` +
        (latencyRounds === 1 ? "one round per side" : `each percentile the median of ${latencyRounds} alternating rounds per side, with the p99 of each round`) +
        `; with each round's publishing time (${seconds} s planned) and the time from its last publish's confirmation to its ` +
        `last ack (near zero, or below when the ack came first: the side kept up; seconds: it was working off a queue when the load stopped):`,
      "",
      "| side | p50 | p90 | p99 | max | p99 per round | publishing, s, per round | last ack after the last publish, ms, per round |",
      "|---|---:|---:|---:|---:|---:|---:|---:|",
      ...(["raw", "engine"] as const).map((side) =>
        `| ${side === "raw" ? "raw loop" : "jetworker"} | ${fixed(latency(side, "p50"), 1)} | ${fixed(latency(side, "p90"), 1)} | ` +
        `${fixed(latency(side, "p99"), 1)} | ${fixed(latency(side, "max"), 1)} | ${p99Range(side)} | ` +
        `${rounds[side].map((round) => fixed(round.publishSeconds, 2)).join(", ")} | ${rounds[side].map((round) => fixed(round.lagMillis, 1)).join(", ")} |`
      ),
      "",
      `SIGTERM to exit with ${concurrency} handlers in flight and 1 s of work left in each: ${fixed(shutdownMillis)} ms ` +
        `(exit code 0, all ${concurrency} acked).`
    ].join("\n")
    const [smallest, largest] = [memory[0]!, memory[memory.length - 1]!]
    const ratios = heapSettings.map(({ name }, setting) => {
      const [first, last] = [smallest.sides[setting]!, largest.sides[setting]!]
      return `${name[0]!.toUpperCase()}${name.slice(1)}: jetworker peak RSS / raw loop's at ${largest.backlog}: ` +
        `${fixed(last.engine.rssMiB / last.raw.rssMiB, 2)}; jetworker at ${largest.backlog} / at ${smallest.backlog}: ` +
        `${fixed(last.engine.rssMiB / first.engine.rssMiB, 2)} (raw loop: ${fixed(last.raw.rssMiB / first.raw.rssMiB, 2)}); ` +
        `live heap, jetworker at ${largest.backlog} / at ${smallest.backlog}: ${fixed(last.engine.liveMiB / first.engine.liveMiB, 2)} ` +
        `(raw loop: ${fixed(last.raw.liveMiB / first.raw.liveMiB, 2)})`
    }).join("\n")
    console.log()
    console.log(table)
    console.log()
    console.log(ratios)
    if (process.env.BENCH_SMOKE === undefined) {
      const file = fileURLToPath(new URL("./results/resources.md", import.meta.url))
      await mkdir(fileURLToPath(new URL("./results/", import.meta.url)), { recursive: true })
      await writeFile(
        file,
        `# Resources and timings: jetworker vs the hand-written nats.js loop\n\n` +
          `Measured ${new Date().toISOString()} by \`node bench/resources.ts ${backlogs.join(",")} ${concurrency}\` ` +
          `on Node ${process.version}, ${os.cpus().length} CPUs, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB; ` +
          `nats-server on loopback. No-op handler, concurrency ${concurrency}, prefetch ${concurrency}, confirmed acks; ` +
          `each side in its own process (peak RSS is its \`maxRSS\`).\n\n${table}\n\n${ratios}\n`
      )
      console.log(`wrote ${file}`)
    }
  } finally {
    await cleanup()
    await nc.close()
  }
}

if (process.argv[2] === "--child") {
  const mode = process.argv[3]!
  const args = JSON.parse(process.argv[4]!) as ChildArgs
  switch (mode) {
    case "raw-drain":
      await rawChild(args, false)
      break
    case "raw-latency":
      await rawChild(args, true)
      break
    case "engine-drain":
      await engineChild(args, false)
      break
    case "engine-latency":
      await engineChild(args, true)
      break
    case "sigterm":
      sigtermChild(args)
      break
    default:
      throw new Error(`unknown child mode ${mode}`)
  }
} else {
  await parent()
}

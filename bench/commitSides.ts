/**
 * The jetworker sides of the commit benchmarks without NATS (`commit-in-memory.ts`,
 * `commit-postgres.ts`): a loop of fibers committing one key after the other, and the engine
 * running a handler over an in-memory source until `total` outcomes, every one `Committed`.
 */
import { Consumer, Envelope, type IdempotencyStore } from "@jetworker/core"
import { Deferred, Effect, Fiber, Schema } from "effect"
import type { SqlError } from "effect/sql/SqlError"
import { inMemorySource } from "./inMemorySource.ts"

export const Event = Envelope.schema("bench.event", Schema.Struct({ n: Schema.Number }))

/** Payloads of `Event` (their ids repeat every 1000: a handler picks keys of its own). */
const payloads = Array.from(
  { length: 1000 },
  (_, n) => new TextEncoder().encode(JSON.stringify({ id: `e${n}`, type: "bench.event", time: new Date().toISOString(), data: { n } }))
)

/** `concurrency` fibers that run `one(0)` .. `one(total - 1)` between them, each one after the other. */
export const fibersLoop = <E, R>(total: number, concurrency: number, one: (n: number) => Effect.Effect<unknown, E, R>) =>
  Effect.suspend(() => {
    let next = 0
    const loop: Effect.Effect<void, E, R> = Effect.suspend(() => {
      if (next >= total) return Effect.void
      return Effect.flatMap(one(next++), () => loop)
    })
    return Effect.all(Array.from({ length: concurrency }, () => loop), { concurrency: "unbounded", discard: true })
  })

/**
 * `Consumer.run` over an in-memory source with `concurrency` handlers, until `total` outcomes;
 * an outcome other than `Committed` fails the run. The workers may have started a few more
 * handler runs by then (they are interrupted, their transactions rolled back).
 */
export const throughEngine = <R>(options: {
  readonly name: string
  readonly total: number
  readonly concurrency: number
  readonly handle: (event: typeof Event.Type) => Effect.Effect<unknown, IdempotencyStore.IdempotencyError | SqlError, R>
}) =>
  Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    let settled = 0
    const fiber = yield* Effect.forkChild(Consumer.run(Consumer.make({
      name: options.name,
      source: inMemorySource((sequence) => payloads[sequence % payloads.length]!),
      schema: Event,
      handle: options.handle,
      classify: { IdempotencyError: "isRetryable", SqlError: "isRetryable" },
      concurrency: options.concurrency,
      onOutcome: (outcome) =>
        Effect.sync(() => {
          if (outcome._tag !== "Committed") Deferred.doneUnsafe(done, Effect.die(new Error(`unexpected outcome ${outcome._tag}`)))
          else if (++settled === options.total) Deferred.doneUnsafe(done, Effect.void)
        })
    })))
    yield* Deferred.await(done)
    yield* Fiber.interrupt(fiber)
  })

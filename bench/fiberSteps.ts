/**
 * Counts the steps of the Effect runtime while an effect runs: each primitive a fiber's loop
 * evaluates (a `flatMap` and the value it continues with, a `suspend`, a fork, an interruptible
 * region...), in every fiber the effect starts. The unit of the engine's own work: unlike CPU
 * time it does not move with the machine's load, so a change to the per-message path shows in
 * it at once. It uses the tracer's per-step hook (`Tracer.context`, which the runtime calls for
 * every step of a fiber whose context holds a tracer) on the native tracer itself, so the code
 * measured sees no tracing backend and takes the same paths as without the count. Process-wide
 * while it runs: count one effect at a time.
 */
import { Effect, Tracer } from "effect"

type Hook = (primitive: Tracer.EffectPrimitive<unknown>, fiber: Parameters<NonNullable<Tracer.Tracer["context"]>>[1]) => unknown

const native = Tracer.nativeTracer as { context?: Hook | undefined }
let steps = 0
const counting: Hook = (primitive, fiber) => {
  steps++
  return primitive["~effect/Effect/evaluate"](fiber)
}

/** Runs `effect`, counting the steps of its fibers; gives its value and the count. */
export const counted = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<readonly [A, number], E, R> =>
  Effect.suspend(() => {
    if (native.context !== undefined) return Effect.die(new Error("fiberSteps: a count is already running"))
    steps = 0
    native.context = counting
    return effect.pipe(
      // The runtime calls the hook only for fibers whose context holds a tracer: the native one, explicitly.
      Effect.provideService(Tracer.Tracer, Tracer.nativeTracer),
      Effect.map((value) => [value, steps] as const),
      Effect.ensuring(Effect.sync(() => {
        native.context = undefined
      }))
    )
  })

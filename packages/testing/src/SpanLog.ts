/**
 * Records the spans a program creates, for assertions on its tracing: install `tracer` around the
 * code under test (`Effect.withTracer(log.tracer)`), then read what was recorded. A span is
 * recorded when it starts, as Effect's own `NativeSpan`, so a test reads its name, kind, parent,
 * attributes and, once it ended, its status and exit. Installing a tracer is what makes jetworker
 * record a delivery's attributes (without one, its spans stay light: ids only).
 *
 * @since 0.1.0
 */
import { Effect, Tracer } from "effect"

/** The spans recorded so far, and the tracer that records them. */
export interface SpanLog {
  /** Install with `Effect.withTracer` (or `Layer.setTracer`) around the code under test. */
  readonly tracer: Tracer.Tracer
  /** Every span recorded so far, in the order they started. */
  readonly all: Effect.Effect<ReadonlyArray<Tracer.NativeSpan>>
  /** The recorded spans with this name, in the order they started. */
  readonly named: (name: string) => Effect.Effect<ReadonlyArray<Tracer.NativeSpan>>
}

/** The most spans a log keeps; the spans started past it are not recorded (they still run). */
export const limit = 1_000_000

/** A new, empty log. */
export const make: Effect.Effect<SpanLog> = Effect.sync(() => {
  const spans: Array<Tracer.NativeSpan> = []
  return {
    tracer: Tracer.make({
      span: (options) => {
        const span = new Tracer.NativeSpan(options)
        if (spans.length < limit) spans.push(span)
        return span
      }
    }),
    all: Effect.sync(() => [...spans]),
    named: (name) => Effect.sync(() => spans.filter((span) => span.name === name))
  }
})

/**
 * Named points in a delivery's life, where tests and diagnostics can watch (or, in the crash
 * tests, kill the process). The default probe does nothing; the engine reads the probe once per
 * run (so provide it around `Consumer.run`) and skips the default. The points, in order, for a
 * delivery that commits:
 *
 * - `received`: decoded, about to run the handler;
 * - `before-commit`: inside the idempotent transaction, effects done, `COMMIT` not yet sent;
 * - `after-commit`: the handler returned (transaction committed), the ack not yet sent;
 * - `after-ack`: the broker confirmed the ack.
 *
 * And one on a dead letter's path, hit by the source rather than the engine (the JetStream source
 * when the context has a probe; other sources may not):
 *
 * - `after-dead-letter`: the dead letter is stored, the term of the original not yet sent.
 *
 * @since 0.1.0
 */
import { Context, Effect } from "effect"

/** A named point in a delivery's life. */
export type Point = "received" | "before-commit" | "after-commit" | "after-ack" | "after-dead-letter"

/** The points a committing delivery passes, in order (not `after-dead-letter`: see {@link allPoints}). */
export const points: ReadonlyArray<Point> = ["received", "before-commit", "after-commit", "after-ack"]

/** Every point: those of {@link points}, then `after-dead-letter`. */
export const allPoints: ReadonlyArray<Point> = [...points, "after-dead-letter"]

/** Which delivery reached a point. */
export interface Hit {
  readonly point: Point
  readonly consumer: string
  readonly sequence: number
  readonly eventId: string | undefined
}

/** What a probe does at each point. */
export interface ProbeShape {
  /** Called at each probe point the engine passes (a test may crash the process there). */
  readonly hit: (hit: Hit) => Effect.Effect<void>
}

/** The probe that does nothing: the default, which the engine skips without a call. */
export const noop: ProbeShape = { hit: () => Effect.void }

/** The probe in effect; does nothing unless a test or diagnostic provides one. */
export const Probe = Context.Reference<ProbeShape>("@jetworker/core/Probe", {
  defaultValue: () => noop
})

/** Reports reaching `hit.point` to the current probe. */
export const hit = (hit: Hit): Effect.Effect<void> => Probe.use((probe) => probe.hit(hit))

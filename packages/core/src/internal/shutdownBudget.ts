/**
 * The shutdown budget: its options, the check that its shares fit (`makeBudget`, `InvalidBudget`),
 * and where each share ends from the start of shutdown. Pure arithmetic, apart from the lifecycle
 * that applies it; `Lifecycle` re-exports the public names and documents them.
 */
import { Data, Duration, Result } from "effect"
import * as DurationInput from "../DurationInput.ts"

/** How the shutdown budget is set; every share but the drain is given, the drain gets the rest. */
export interface BudgetOptions {
  /** The whole budget, signal to exit; keep it under the orchestrator's kill deadline. Default: 25 seconds. */
  readonly total?: Duration.Input | undefined
  /** How long the process stays up, unready, so that probes observe it. Default: 1 second. */
  readonly readinessGrace?: Duration.Input | undefined
  /** Closing the resources (NATS drained then closed, SQL pool, HTTP server). Default: 3 seconds. */
  readonly close?: Duration.Input | undefined
  /** Flushing telemetry. Default: 2 seconds. */
  readonly telemetry?: Duration.Input | undefined
  /** Left unused by plan, for the exit itself; must be above zero. Default: 1 second. */
  readonly reserve?: Duration.Input | undefined
}

/** A checked budget, in milliseconds. `drainMillis` is what the other shares leave of the total. */
export interface Budget {
  readonly totalMillis: number
  readonly readinessGraceMillis: number
  readonly drainMillis: number
  readonly closeMillis: number
  readonly telemetryMillis: number
  readonly reserveMillis: number
}

/** A budget whose shares do not fit; says which and why. */
export class InvalidBudget extends Data.TaggedError("InvalidBudget")<{ readonly problems: ReadonlyArray<string> }> {
  override get message(): string {
    return `invalid shutdown budget: ${this.problems.join("; ")}`
  }
}

const toMillis = (
  problems: Array<string>,
  name: string,
  input: Duration.Input | undefined,
  fallback: number
): number => {
  if (input === undefined) return fallback
  // `DurationInput.parse`: a NaN (a `Number(...)` of a bad variable) is refused, not read as 0.
  const duration = DurationInput.parse(input)
  if (duration === undefined || !Duration.isFinite(duration)) {
    problems.push(`${name} must be a finite duration, got ${String(input)}`)
    return fallback
  }
  // Finite but negative is a sign slip, not a duration that does not parse: say so.
  if (Duration.toMillis(duration) < 0) {
    problems.push(`${name} must not be negative, got ${DurationInput.show(input)}`)
    return fallback
  }
  return Duration.toMillis(duration)
}

/** Checks `options` and derives the drain share. */
export const makeBudget = (options: BudgetOptions = {}): Result.Result<Budget, InvalidBudget> => {
  const problems: Array<string> = []
  const totalMillis = toMillis(problems, "total", options.total, 25_000)
  const readinessGraceMillis = toMillis(problems, "readinessGrace", options.readinessGrace, 1_000)
  const closeMillis = toMillis(problems, "close", options.close, 3_000)
  const telemetryMillis = toMillis(problems, "telemetry", options.telemetry, 2_000)
  const reserveMillis = toMillis(problems, "reserve", options.reserve, 1_000)
  if (reserveMillis <= 0) problems.push("reserve must be above zero")
  const drainMillis = totalMillis - readinessGraceMillis - closeMillis - telemetryMillis - reserveMillis
  if (problems.length === 0 && drainMillis <= 0) {
    problems.push(
      `total ${totalMillis} ms leaves no drain share after readinessGrace ${readinessGraceMillis} ms, ` +
        `close ${closeMillis} ms, telemetry ${telemetryMillis} ms and reserve ${reserveMillis} ms`
    )
  }
  return problems.length > 0
    ? Result.fail(new InvalidBudget({ problems }))
    : Result.succeed({ totalMillis, readinessGraceMillis, drainMillis, closeMillis, telemetryMillis, reserveMillis })
}

/** A share of the budget that bounds waits: each ends at a deadline counted from the signal. */
export type Share = "readinessGrace" | "drain" | "close" | "telemetry"

/** Milliseconds from the start of shutdown to the end of `share`. */
export const shareEnd = (budget: Budget, share: Share): number => {
  const grace = budget.readinessGraceMillis
  const drain = grace + budget.drainMillis
  const close = drain + budget.closeMillis
  switch (share) {
    case "readinessGrace":
      return grace
    case "drain":
      return drain
    case "close":
      return close
    case "telemetry":
      return close + budget.telemetryMillis
  }
}

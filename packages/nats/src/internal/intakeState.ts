/**
 * What the parts of a `JetStreamSource` intake share: the environment it was opened with, fixed
 * for its life, and the count and buffer its pulls, watchers, `take` and `close` keep together.
 * One intake, one event loop: the client's callbacks and the engine's `take` never interleave
 * inside a step, so the state is plain mutable fields.
 */
import type { Source } from "@jetworker/core"
import type * as DeadLetter from "../DeadLetter.ts"
import type { Shape } from "../NatsConnection.ts"
import type { Pulled } from "./delivery.ts"

/** What the intake works with, the same for its whole life. */
export interface IntakeEnv {
  /** `<stream>/<durable>`, as the intake's lines name it. */
  readonly name: string
  readonly stream: string
  readonly durable: string
  readonly connection: Shape
  /** At most this many messages buffered or on their way. */
  readonly prefetch: number
  /** Lifetime of one pull request on the server. */
  readonly expiresMillis: number
  /** Bound on each settle confirmation, and on each step of the checks and of `close`. */
  readonly settleTimeoutMillis: number
  readonly destination: DeadLetter.Destination
  /** The server sends an idle heartbeat at this interval for each waiting pull. */
  readonly heartbeatMillis: number
  /** Now, on the monotonic time of the clock the intake was opened with (`Delivery.receivedAt`). */
  readonly receivedNow: () => number
  /** A WARN line through the services the intake was opened with. */
  readonly logWarning: (message: string) => void
  /** One of the intake's events an operator watches for, annotated with `event` and the consumer's name. */
  readonly logEvent: (level: "Info" | "Warning", event: string, message: string, fields?: Record<string, unknown>) => void
  /** Tells the engine how the intake stands (`OpenOptions.onHealth`), for the readiness probe. */
  readonly reportHealth: (health: Source.Health) => void
}

/** An open pull: the server fills them in order, so arrivals are counted against the oldest. */
export interface Pull {
  readonly id: string
  readonly batch: number
  readonly sentAt: number
  received: number
}

/** The intake's count and buffer, and how it stands. */
export interface IntakeState {
  /** Arrived and waiting for `take`, in the server's order. */
  readonly buffered: Array<Pulled>
  /** What open pulls still ask for; `buffered.length + requested` never exceeds `prefetch`. */
  requested: number
  /** Open pulls, oldest first (only used to end a pull; `requested` is kept exactly by the statuses). */
  readonly waiting: Array<Pull>
  /** The last word from the server, on the monotonic clock (a wall clock step would fake or hide silence). */
  lastHeard: number
  /** What ended the intake for good; surfaces once `buffered` is drained. */
  failure: Source.SourceError | undefined
  /**
   * A settling command the server refused for lack of permission (`refusedSettling`): the intake
   * ends at once, its buffer dropped, since nothing it hands out could be settled.
   */
  refused: Source.SourceError | undefined
  /** After a failed pull: a growing pause, then a consumer info check, before pulling again. */
  pausing: boolean
  pauseMillis: number
  closed: boolean
  /** Resumes the `take` that waits for a message (never more than one). */
  wake: (() => void) | undefined
  /**
   * When the silence watchdog wrote the pulls off (the last word heard before it), until the
   * consumer answers again and the room is pulled (`intake.resumed`).
   */
  stalledSince: number | undefined
  /** Whether the client's link is down (disconnected, stale or closed) since its last reconnect. */
  linkDown: boolean
  /** Called once when the link goes down: what waits on the server over it stops waiting. */
  readonly onLinkLost: Set<() => void>
}

/** A fresh intake's state: nothing pulled yet. */
export const initialState = (): IntakeState => ({
  buffered: [],
  requested: 0,
  waiting: [],
  lastHeard: performance.now(),
  failure: undefined,
  refused: undefined,
  pausing: false,
  pauseMillis: 0,
  closed: false,
  wake: undefined,
  stalledSince: undefined,
  // It opens over a live link: the consumer was just checked.
  linkDown: false,
  onLinkLost: new Set()
})

/** Resumes the waiting `take`, if any. */
export const signal = (state: IntakeState): void => {
  const resume = state.wake
  state.wake = undefined
  resume?.()
}

/** Ends the intake for good with `error` (the first one stays), once `buffered` is drained. */
export const fail = (state: IntakeState, error: Source.SourceError): void => {
  state.failure ??= error
  signal(state)
}

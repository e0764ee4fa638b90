/**
 * Measures how late the event loop runs a timer: a timer every `intervalMillis` notes how much
 * later than planned it fired. `worst()` is the largest lag seen in the last `windowMillis`, so a
 * loop that was blocked for seconds shows it on the next probe. The timer is unref'd (it never
 * keeps the process alive) and stops with `stop()`.
 *
 * Every reading is on the monotonic clock (`performance.now()`), as Node's timers are: a step of
 * the wall clock (NTP, a resumed VM, `date -s`) is not lag, and must not fail `/healthz/live`.
 */
import { performance } from "node:perf_hooks"

export interface EventLoopLag {
  readonly worst: () => number
  readonly stop: () => void
}

export const start = (intervalMillis = 100, windowMillis = 10_000): EventLoopLag => {
  const samples: Array<{ readonly at: number; readonly lag: number }> = []
  let expected = performance.now() + intervalMillis
  const timer = setInterval(() => {
    const now = performance.now()
    samples.push({ at: now, lag: Math.max(0, now - expected) })
    expected = now + intervalMillis
    while (samples.length > 0 && samples[0]!.at < now - windowMillis) samples.shift()
  }, intervalMillis)
  timer.unref()
  return {
    worst: () => {
      // A loop blocked right now has no sample yet: count the time since the timer was due.
      let worst = Math.max(0, performance.now() - expected)
      for (const sample of samples) worst = Math.max(worst, sample.lag)
      return worst
    },
    stop: () => clearInterval(timer)
  }
}

/**
 * The engine's concurrency slots: a counting gate whose waiters, first come first served, are
 * resumed inline by the release that frees a slot. (`Semaphore` resumes them through the
 * scheduler, an event-loop turn later: with one release per delivery, that turn was a hop on
 * every message between a settled delivery and the next one the intake starts.) Internal.
 */
import { Effect } from "effect"

/** At most `size` holders at once. */
export interface Slots {
  /** Waits for a free slot and takes it; an interrupted wait takes none. */
  readonly take: Effect.Effect<void>
  /** Gives a slot back, handing it to the oldest waiter if there is one. */
  readonly release: () => void
  /** Slots free now. */
  readonly free: () => number
}

/** `size` free slots. */
export const make = (size: number): Slots => {
  let free = size
  const waiters: Array<{ resumed: boolean; readonly resume: () => void }> = []
  const take = Effect.callback<void>((resume) => {
    if (free > 0 && waiters.length === 0) {
      free--
      resume(Effect.void)
      return
    }
    const waiter = { resumed: false, resume: () => resume(Effect.void) }
    waiters.push(waiter)
    return Effect.sync(() => {
      const index = waiters.indexOf(waiter)
      if (index >= 0) waiters.splice(index, 1)
      // Handed a slot as it was interrupted: give it on.
      else if (waiter.resumed) release()
    })
  })
  const release = () => {
    const waiter = waiters.shift()
    if (waiter === undefined) {
      free++
      return
    }
    waiter.resumed = true
    waiter.resume()
  }
  return { take, release, free: () => free }
}

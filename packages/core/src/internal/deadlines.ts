/**
 * The deadlines of running handler runs: one watcher fiber per consumer, not a timer per run.
 * Every run of a consumer has the same bound (`handlerTimeout`), so runs expire in the order
 * they started and one queue, oldest first, holds them all; the watcher sleeps until the oldest
 * live deadline. A run that ends withdraws its entry (it is skipped, and dropped from the front
 * as newer runs start, so the queue holds about what is running). Sleeps go through the
 * `Clock`, so the test clock drives them, and deadlines are on its monotonic time, so a step of
 * the wall clock neither cuts a run early nor lets it run on. Internal: the engine's runs use it.
 */
import { type Clock, Duration, Effect, type Scope } from "effect"
import * as Monotonic from "./monotonic.ts"

/** One run's deadline. */
export interface Entry {
  readonly deadline: number
  done: boolean
  /**
   * Called once, at the deadline, unless the entry was withdrawn first. Dropped once done: a
   * done entry can wait in the queue until newer ones pass it, and its callback holds the run.
   */
  onExpiry: () => void
}

const noop = (): void => undefined

/** The watched deadlines of one consumer's runs. */
export interface Deadlines {
  /** Watches a run that started at `startedAt` (the clock's monotonic millis, see `monotonic.ts`); `onExpiry` cuts it. */
  readonly add: (startedAt: number, onExpiry: () => void) => Entry | undefined
  /** Stops watching: the run ended. */
  readonly withdraw: (entry: Entry | undefined) => void
}

/** Deadlines that never come (an infinite bound). */
export const none: Deadlines = { add: () => undefined, withdraw: () => undefined }

/** Starts the watcher for runs bounded by `timeout`, in the current scope. */
export const make = (timeout: Duration.Duration, clock: Clock.Clock): Effect.Effect<Deadlines, never, Scope.Scope> =>
  Effect.gen(function*() {
    const millis = Duration.toMillis(timeout)
    if (!Number.isFinite(millis)) return none
    let entries: Array<Entry> = []
    let head = 0
    // Resumes the watcher when it waits for a first entry (never more than one waiter).
    let wake: (() => void) | undefined

    // Forgets the entries before `head`: all of them once none is left, or by copying the rest
    // once the forgotten ones are most of the array.
    const forgetBefore = (at: number) => {
      if (at === entries.length) {
        entries = []
        head = 0
      } else if (at >= 1024 && at * 2 >= entries.length) {
        entries = entries.slice(at)
        head = 0
      } else {
        head = at
      }
    }
    const dropDone = () => {
      let at = head
      while (at < entries.length && entries[at]!.done) at++
      forgetBefore(at)
    }

    const idle = Effect.callback<void>((resume) => {
      if (head < entries.length) return resume(Effect.void)
      const resumeWatcher = () => resume(Effect.void)
      wake = resumeWatcher
      return Effect.sync(() => {
        if (wake === resumeWatcher) wake = undefined
      })
    })

    // Expires what is due, then sleeps until the oldest live deadline (or waits for an entry).
    const step = Effect.suspend(() => {
      const now = Monotonic.millis(clock)
      while (head < entries.length) {
        const entry = entries[head]!
        if (!entry.done) {
          if (entry.deadline > now) break
          const onExpiry = entry.onExpiry
          entry.done = true
          entry.onExpiry = noop
          onExpiry()
        }
        head++
      }
      forgetBefore(head)
      return head < entries.length ? Effect.sleep(Duration.millis(entries[head]!.deadline - now)) : idle
    })
    yield* Effect.forkScoped(Effect.forever(step, { disableYield: true }))

    return {
      add: (startedAt, onExpiry) => {
        dropDone()
        const entry: Entry = { deadline: startedAt + millis, done: false, onExpiry }
        entries.push(entry)
        const resume = wake
        wake = undefined
        resume?.()
        return entry
      },
      withdraw: (entry) => {
        if (entry === undefined) return
        entry.done = true
        entry.onExpiry = noop
      }
    }
  })

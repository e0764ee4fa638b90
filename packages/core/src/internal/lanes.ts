/**
 * Key lanes for per-key ordering: one FIFO lane per key of the deliveries the engine holds, and
 * the limits on what it holds (deliveries in all, keys, deliveries per key). Every wait here is
 * for a change made by another delivery finishing, so it ends as work drains. Internal: the
 * engine holds one delivery per `hold`, joins its key's lane, waits for its turn, and leaves.
 */
import { Deferred, Effect } from "effect"

/** The limits, all finite. */
export interface Limits {
  /** Deliveries held at once: running plus waiting. */
  readonly maxHeld: number
  /** Distinct keys with a lane. */
  readonly maxKeys: number
  /** Deliveries in one lane, the running one included. */
  readonly maxPerLane: number
}

interface Lane {
  size: number
  /** Completed when the lane's last delivery so far leaves. */
  tail: Deferred.Deferred<void>
}

/** A delivery's place in its lane. */
export interface Place {
  readonly key: string
  /** The delivery ahead of this one, or undefined for the lane's first. */
  readonly ahead: Deferred.Deferred<void> | undefined
  readonly mine: Deferred.Deferred<void>
}

/** The lanes of one running consumer. */
export interface Lanes {
  /** Waits until one more delivery may be held; the intake calls it before taking one. */
  readonly awaitRoom: Effect.Effect<void>
  /** Counts a delivery as held (synchronous; pair with `unhold`). */
  readonly hold: () => void
  /** Stops counting a delivery and wakes the waiters. */
  readonly unhold: () => void
  /**
   * Waits until `key`'s lane has room (or a new lane may open), then joins it at the end and hands
   * the place to `joined` in the same step, so an interruption cannot lose it.
   */
  readonly join: (key: string, joined: (place: Place) => void) => Effect.Effect<void>
  /** Waits until every delivery ahead in the lane has left. */
  readonly turn: (place: Place) => Effect.Effect<void>
  /** Leaves the lane (synchronous): the next delivery of the key may run once those ahead left. */
  readonly leave: (place: Place) => void
  /** Deliveries held and lanes open now (for tests and gauges). */
  readonly size: () => { readonly held: number; readonly keys: number }
}

/** Empty lanes with `limits`. */
export const make = (limits: Limits): Lanes => {
  const lanes = new Map<string, Lane>()
  let held = 0
  // Completed and replaced on every change that can make room.
  let changed = Deferred.makeUnsafe<void>()
  const signal = () => {
    const current = changed
    changed = Deferred.makeUnsafe<void>()
    Deferred.doneUnsafe(current, Effect.void)
  }
  const until = (room: () => boolean): Effect.Effect<void> =>
    Effect.suspend(function loop(): Effect.Effect<void> {
      return room() ? Effect.void : Effect.andThen(Deferred.await(changed), Effect.suspend(loop))
    })

  return {
    awaitRoom: until(() => held < limits.maxHeld),
    hold: () => {
      held++
    },
    unhold: () => {
      held--
      signal()
    },
    join: (key, joined) =>
      Effect.andThen(
        until(() => {
          const lane = lanes.get(key)
          return lane === undefined ? lanes.size < limits.maxKeys : lane.size < limits.maxPerLane
        }),
        Effect.sync(() => {
          const mine = Deferred.makeUnsafe<void>()
          const lane = lanes.get(key)
          if (lane === undefined) {
            lanes.set(key, { size: 1, tail: mine })
            joined({ key, ahead: undefined, mine })
            return
          }
          const ahead = lane.tail
          lane.size++
          lane.tail = mine
          joined({ key, ahead, mine })
        })
      ),
    turn: (place) => (place.ahead === undefined ? Effect.void : Deferred.await(place.ahead)),
    leave: (place) => {
      // A delivery that leaves before its turn (interrupted while waiting) passes the wait for
      // the one ahead on to the one behind, so two of a key never run at once.
      Deferred.doneUnsafe(place.mine, place.ahead === undefined ? Effect.void : Deferred.await(place.ahead))
      const lane = lanes.get(place.key)
      if (lane !== undefined && --lane.size === 0) lanes.delete(place.key)
      signal()
    },
    size: () => ({ held, keys: lanes.size })
  }
}

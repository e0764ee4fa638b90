/**
 * A set whose members come and go at the rate of messages (the leases under watch), kept in an
 * array of slots with a free list instead of a `Set`. A long-lived `Set` or `Map` (one in V8's old
 * space) that adds and deletes young members at that rate keeps them alive through scavenges until
 * the next full collection, with everything they reference: a batch consumer promoted about 5 MB
 * per scavenge that way, a third of its CPU going to the collector (see docs/performance-log.md). An
 * array slot set back to `undefined` holds nothing. Internal.
 */

/** The live members; `add` gives the slot that `remove` takes back. */
export interface LiveSet<A extends object> {
  readonly add: (member: A) => number
  /** Removes `member` from `slot`; nothing if the slot holds another member (or none) by now. */
  readonly remove: (slot: number, member: A) => void
  /** Whether `slot` still holds `member`. */
  readonly has: (slot: number, member: A) => boolean
  /** The members now, in no particular order. */
  readonly members: () => Array<A>
  readonly size: () => number
}

export const make = <A extends object>(): LiveSet<A> => {
  const slots: Array<A | undefined> = []
  const free: Array<number> = []
  let size = 0
  return {
    add: (member) => {
      const slot = free.pop() ?? slots.length
      slots[slot] = member
      size++
      return slot
    },
    remove: (slot, member) => {
      if (slots[slot] !== member) return
      slots[slot] = undefined
      free.push(slot)
      size--
    },
    has: (slot, member) => slots[slot] === member,
    members: () => {
      const members: Array<A> = []
      for (const member of slots) if (member !== undefined) members.push(member)
      return members
    },
    size: () => size
  }
}

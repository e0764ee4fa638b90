import { assert, describe, it } from "@effect/vitest"
import * as LiveSet from "../src/internal/liveSet.ts"

describe("the live set of leases under watch", () => {
  it("holds what was added and not removed; a freed slot is reused", () => {
    const set = LiveSet.make<{ readonly name: string }>()
    const a = { name: "a" }
    const b = { name: "b" }
    const c = { name: "c" }
    const slotA = set.add(a)
    const slotB = set.add(b)
    set.remove(slotA, a)
    const slotC = set.add(c)
    assert.strictEqual(slotC, slotA, "the freed slot is taken again")
    assert.deepStrictEqual(set.members().map((m) => m.name).sort(), ["b", "c"])
    assert.strictEqual(set.size(), 2)
    set.remove(slotB, b)
    assert.deepStrictEqual(set.members().map((m) => m.name), ["c"])
  })

  it("removing twice, or with a slot another member holds by now, removes nothing else", () => {
    const set = LiveSet.make<{ readonly name: string }>()
    const a = { name: "a" }
    const b = { name: "b" }
    const slotA = set.add(a)
    set.remove(slotA, a)
    const slotB = set.add(b)
    assert.strictEqual(slotB, slotA)
    set.remove(slotA, a) // a late second removal of a: the slot is b's now
    assert.deepStrictEqual(set.members(), [b])
    assert.strictEqual(set.size(), 1)
  })

  it("a member removed while the members are walked is not lost for the others", () => {
    const set = LiveSet.make<{ readonly n: number; slot: number }>()
    const all = Array.from({ length: 10 }, (_, n) => ({ n, slot: -1 }))
    for (const member of all) member.slot = set.add(member)
    const seen: Array<number> = []
    for (const member of set.members()) {
      seen.push(member.n)
      if (member.n % 2 === 0) set.remove(member.slot, member)
    }
    assert.deepStrictEqual(seen, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert.deepStrictEqual(set.members().map((m) => m.n), [1, 3, 5, 7, 9])
  })
})

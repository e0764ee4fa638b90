/**
 * The benchmarks' garbage-collector figures (`bench/gcStats.ts`): allocation counted across
 * scavenges, and objects that stay alive counted as promoted. Pure logic over V8's own profiler;
 * no server involved.
 */
import { assert, describe, it } from "@effect/vitest"
import v8 from "node:v8"
import * as GcStats from "../bench/gcStats.ts"

/** Allocates `count` arrays of 16 numbers, each reachable until 64 more have been allocated. */
const churn = (count: number): number => {
  const ring: Array<Array<number>> = []
  let sum = 0
  for (let i = 0; i < count; i++) {
    const array = new Array<number>(16).fill(i)
    ring[i % 64] = array
    sum += array.length
  }
  return sum + ring.length
}

const youngUsed = () => v8.getHeapSpaceStatistics().find((space) => space.space_name === "new_space")!.space_used_size

/**
 * Churns, 50 000 arrays at a time, until the young generation has been collected at least
 * `scavenges` times (its use fell): how many allocations that takes depends on the size V8 has
 * grown it to in this process, up to 64 MiB per semi-space. Bounded: at most 400 rounds (over 4 GB).
 * Returns the arrays allocated.
 */
const churnThroughScavenges = (scavenges: number): number => {
  let seen = 0
  let rounds = 0
  let before = youngUsed()
  while (seen < scavenges && rounds < 400) {
    churn(50_000)
    rounds++
    const after = youngUsed()
    if (after < before) seen++
    before = after
  }
  assert.isAtLeast(seen, scavenges, `${scavenges} scavenges within ${rounds} rounds of churn`)
  return rounds * 50_000
}

describe("bench gcStats", () => {
  it("counts what the work allocated in the young generation, across the scavenges it caused", () => {
    const stop = GcStats.start()
    const arrays = churnThroughScavenges(2)
    const stats = stop()
    // Each array is at least its 16 elements of 8 bytes. The young generation was emptied at least
    // twice, by scavenges or, when V8 chose them (a CI run under load did), full collections.
    assert.isAtLeast(stats.scavenges + stats.fullCollections, 2, JSON.stringify(stats))
    assert.isAtLeast(stats.allocated, arrays * 16 * 8)
    assert.isAbove(stats.pauseMicros, 0)
  })

  it("counts what survives the scavenges as promoted, and little when nothing survives", () => {
    const kept: Array<{ readonly n: number; readonly label: string }> = []
    const stop = GcStats.start()
    for (let i = 0; i < 200_000; i++) kept.push({ n: i, label: `kept ${i}` })
    // An object surviving its second scavenge moves to the old generation.
    churnThroughScavenges(3)
    const stats = stop()
    // 200 000 objects and strings alive throughout: well over 4 MB moved to the old generation.
    assert.isAbove(stats.promoted, 4 * 1024 * 1024)
    assert.strictEqual(kept.length, 200_000)
    // However V8 placed them (moved by scavenges, or allocated in the old space once it sees that
    // their allocation site's objects survive), they all ended in the old generation.
    assert.isAbove(stats.promoted + stats.tenured, 200_000 * 16)

    const stopQuiet = GcStats.start()
    churnThroughScavenges(3)
    const quiet = stopQuiet()
    assert.isBelow(quiet.promoted, stats.promoted / 4)
    assert.isBelow(quiet.promoted + quiet.tenured, (stats.promoted + stats.tenured) / 4)
  })
})

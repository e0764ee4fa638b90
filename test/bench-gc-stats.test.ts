/**
 * The benchmarks' garbage-collector figures (`bench/gcStats.ts`): allocation counted across
 * scavenges, and objects that stay alive counted as promoted. Pure logic over V8's own profiler;
 * no server involved.
 */
import { assert, describe, it } from "@effect/vitest"
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

describe("bench gcStats", () => {
  it("counts what the work allocated in the young generation, across the scavenges it caused", () => {
    const stop = GcStats.start()
    churn(500_000)
    const stats = stop()
    // Each array is at least its 16 elements of 8 bytes: 64 MB in all, more than any young
    // generation V8 sizes by default, so scavenges ran in between.
    assert.isAbove(stats.scavenges, 0)
    assert.isAtLeast(stats.allocated, 500_000 * 16 * 8)
    assert.isAbove(stats.pauseMicros, 0)
  })

  it("counts what survives the scavenges as promoted, and little when nothing survives", () => {
    const kept: Array<{ readonly n: number; readonly label: string }> = []
    const stop = GcStats.start()
    for (let i = 0; i < 200_000; i++) kept.push({ n: i, label: `kept ${i}` })
    churn(500_000)
    const stats = stop()
    // 200 000 objects and strings alive throughout: well over 4 MB moved to the old generation.
    assert.isAbove(stats.promoted, 4 * 1024 * 1024)
    assert.strictEqual(kept.length, 200_000)

    const stopQuiet = GcStats.start()
    churn(500_000)
    const quiet = stopQuiet()
    assert.isBelow(quiet.promoted, stats.promoted / 4)
  })
})

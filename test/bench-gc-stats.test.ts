/**
 * The benchmarks' garbage-collector figures (`bench/gcStats.ts`): allocation counted across
 * scavenges, and objects that stay alive counted as promoted. Pure logic over V8's own profiler;
 * no server involved. The work runs in a child process (`fixtures/gc-stats-probe.ts`) whose young
 * generation is pinned to 1 MiB per semi-space, with the collector's background threads and
 * memory reducer off: V8 then scavenges as the work asks, whatever the machine's load.
 */
import { assert, describe, it } from "@effect/vitest"
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import type * as GcStats from "../bench/gcStats.ts"

const probe = fileURLToPath(new URL("fixtures/gc-stats-probe.ts", import.meta.url))

interface Probed {
  readonly churning: { readonly arrays: number; readonly seen: number; readonly stats: GcStats.GcStats }
  readonly keeping: {
    readonly kept: number
    readonly seen: number
    readonly stats: GcStats.GcStats
    readonly quietSeen: number
    readonly quiet: GcStats.GcStats
  }
}

const run = (): Probed => {
  const out = execFileSync(process.execPath, [
    "--min-semi-space-size=1",
    "--max-semi-space-size=1",
    "--single-threaded-gc",
    "--no-memory-reducer",
    probe
  ], { encoding: "utf8", timeout: 60_000 })
  return JSON.parse(out) as Probed
}

describe("bench gcStats", () => {
  const probed = run()

  it("counts what the work allocated in the young generation, across the scavenges it caused", () => {
    const { arrays, seen, stats } = probed.churning
    const shown = JSON.stringify(probed.churning)
    assert.strictEqual(seen, 2, shown)
    assert.isAtLeast(stats.scavenges, 2, shown)
    // Each array is at least its 16 elements of 8 bytes.
    assert.isAtLeast(stats.allocated, arrays * 16 * 8, shown)
    assert.isAbove(stats.pauseMicros, 0, shown)
  })

  it("counts what survives the scavenges as promoted, and little when nothing survives", () => {
    const { kept, quiet, quietSeen, seen, stats } = probed.keeping
    const shown = JSON.stringify(probed.keeping)
    assert.strictEqual(kept, 200_000)
    assert.strictEqual(seen, 3, shown)
    assert.strictEqual(quietSeen, 3, shown)
    // 200 000 objects and strings alive throughout: well over 4 MB moved to the old generation.
    // However V8 placed them (moved by scavenges, or allocated in the old space once it sees that
    // their allocation site's objects survive), they all ended in the old generation.
    assert.isAbove(stats.promoted + stats.tenured, 4 * 1024 * 1024, shown)
    assert.isAbove(stats.promoted, 200_000 * 16 / 4, shown)
    assert.isBelow(quiet.promoted, stats.promoted / 4, shown)
    assert.isBelow(quiet.promoted + quiet.tenured, (stats.promoted + stats.tenured) / 4, shown)
  })
})

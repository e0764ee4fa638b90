/**
 * What a stretch of work cost V8's garbage collector, from its GC profiler (`v8.GCProfiler`):
 * bytes allocated in the young generation, scavenges, bytes promoted by them, full collections,
 * and the collector's time on the main thread. Process-wide: measure one side at a time.
 *
 * Allocation is counted in the young generation (what each collection found there, less what the
 * previous one left) and, apart, straight into the old space (how much its use grew between
 * collections: allocation sites V8 pretenures because their objects tend to survive, and V8's own
 * data). Large objects are in neither, so the two are a lower bound of what the work allocated.
 */
import v8 from "node:v8"

export interface GcStats {
  /** Bytes allocated in the young generation. */
  readonly allocated: number
  /** Scavenges (minor collections). */
  readonly scavenges: number
  /** Bytes that scavenges moved to the old generation. */
  readonly promoted: number
  /**
   * Bytes allocated straight into the old space, between collections: what reaches the old
   * generation without a scavenge. With `promoted`, what the next full collections must deal with.
   */
  readonly tenured: number
  /** Full (mark-compact) collections. */
  readonly fullCollections: number
  /** The collector's time on the main thread, in microseconds (each event's `cost`). */
  readonly pauseMicros: number
}

const youngSpaces = new Set(["new_space", "new_large_object_space"])

type SpaceStatistics = Pick<v8.HeapSpaceStatistics, "spaceName" | "spaceUsedSize">

const youngUsed = (spaces: ReadonlyArray<SpaceStatistics>): number =>
  spaces.reduce((sum, space) => youngSpaces.has(space.spaceName) ? sum + space.spaceUsedSize : sum, 0)

const oldUsed = (spaces: ReadonlyArray<SpaceStatistics>): number =>
  spaces.reduce((sum, space) => space.spaceName === "old_space" ? sum + space.spaceUsedSize : sum, 0)

/** The heap's spaces now, in the shape the profiler reports them. */
const spacesNow = (): ReadonlyArray<SpaceStatistics> =>
  v8.getHeapSpaceStatistics().map((space) => ({ spaceName: space.space_name, spaceUsedSize: space.space_used_size }))

/** Starts counting; the returned function stops and reports what happened in between. */
export const start = (): () => GcStats => {
  const profiler = new v8.GCProfiler()
  const atStart = spacesNow()
  profiler.start()
  return () => {
    const events = profiler.stop().statistics
    const atEnd = spacesNow()
    let allocated = 0
    let leftBefore = youngUsed(atStart)
    let tenured = 0
    let oldBefore = oldUsed(atStart)
    let scavenges = 0
    let promoted = 0
    let fullCollections = 0
    let pauseMicros = 0
    for (const event of events) {
      allocated += Math.max(0, youngUsed(event.beforeGC.heapSpaceStatistics) - leftBefore)
      leftBefore = youngUsed(event.afterGC.heapSpaceStatistics)
      tenured += Math.max(0, oldUsed(event.beforeGC.heapSpaceStatistics) - oldBefore)
      oldBefore = oldUsed(event.afterGC.heapSpaceStatistics)
      pauseMicros += event.cost
      if (event.gcType === "Scavenge" || event.gcType === "MinorMarkSweep") {
        scavenges++
        promoted += Math.max(0, oldUsed(event.afterGC.heapSpaceStatistics) - oldUsed(event.beforeGC.heapSpaceStatistics))
      } else if (event.gcType === "MarkSweepCompact") {
        fullCollections++
      }
    }
    allocated += Math.max(0, youngUsed(atEnd) - leftBefore)
    tenured += Math.max(0, oldUsed(atEnd) - oldBefore)
    return { allocated, scavenges, promoted, tenured, fullCollections, pauseMicros }
  }
}

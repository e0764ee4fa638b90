/**
 * What a stretch of work took in this process, measured the same way by every benchmark: wall
 * seconds, CPU seconds (user + system, all threads), the event loop's utilization (0..1), the
 * socket writes to each server with the time spent in them (`socketWrites.ts`, zero unless
 * installed), and what it cost the garbage collector (`gcStats.ts`).
 */
import * as GcStats from "./gcStats.ts"
import * as SocketWrites from "./socketWrites.ts"

export interface Measured {
  readonly seconds: number
  readonly cpuSeconds: number
  readonly loopBusy: number
  readonly writes: SocketWrites.Writes
  readonly gc: GcStats.GcStats
}

/** Starts the clock; the returned function stops it and gives what was measured in between. */
export const start = (): () => Measured => {
  const wall = performance.now()
  const cpu = process.cpuUsage()
  const loop = performance.eventLoopUtilization()
  const writes = SocketWrites.read()
  const gc = GcStats.start()
  return () => {
    const seconds = (performance.now() - wall) / 1000
    const used = process.cpuUsage(cpu)
    return {
      seconds,
      cpuSeconds: (used.user + used.system) / 1e6,
      loopBusy: performance.eventLoopUtilization(loop).utilization,
      writes: SocketWrites.between(writes, SocketWrites.read()),
      gc: gc()
    }
  }
}

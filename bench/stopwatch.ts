/**
 * What a stretch of work took in this process, measured the same way by every benchmark: wall
 * seconds, CPU seconds (user + system, all threads), the event loop's utilization (0..1), the
 * socket writes to each server with the time spent in them (`socketWrites.ts`, zero unless
 * installed), and what it cost the garbage collector (`gcStats.ts`); `perMessage` gives the same
 * per message.
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

/** What a stretch of work that handled `count` messages took, per message. */
export interface PerMessage {
  readonly rate: number
  /** CPU microseconds (user + system). */
  readonly cpuMicros: number
  /** Socket writes to PostgreSQL and to NATS, and the wall time spent inside writes (µs). */
  readonly writesPostgres: number
  readonly writesNats: number
  readonly inWritesMicros: number
  /** Bytes allocated in the young generation, promoted, and allocated straight into the old space (`gcStats.ts`). */
  readonly allocatedBytes: number
  readonly promotedBytes: number
  readonly tenuredBytes: number
  /** The collector's main-thread microseconds. */
  readonly gcMicros: number
}

/** `measured`, over `count` messages. */
export const perMessage = ({ cpuSeconds, gc, seconds, writes }: Measured, count: number): PerMessage => ({
  rate: count / seconds,
  cpuMicros: cpuSeconds * 1e6 / count,
  writesPostgres: writes.postgres / count,
  writesNats: writes.nats / count,
  inWritesMicros: writes.micros / count,
  allocatedBytes: gc.allocated / count,
  promotedBytes: gc.promoted / count,
  tenuredBytes: gc.tenured / count,
  gcMicros: gc.pauseMicros / count
})

/**
 * Profiles of benchmark rounds: with BENCH_CPU_PROFILE=dir, `profiled` runs its work under the
 * inspector's CPU profiler and writes `dir/<name>.cpuprofile`; with BENCH_HEAP_PROFILE=dir, under
 * the sampling heap profiler (a sample every 256 bytes allocated, the collected ones kept: what
 * was allocated, not what lived) and writes `dir/<name>.heapprofile`; without either it only runs
 * the work.
 */
import { mkdir, writeFile } from "node:fs/promises"
import { Session } from "node:inspector/promises"

const cpuDir = process.env.BENCH_CPU_PROFILE
const heapDir = process.env.BENCH_HEAP_PROFILE

/** Runs `f`, under the CPU profiler or the sampling heap profiler when asked (see the module doc). */
export const profiled = async <A>(name: string, f: () => Promise<A>): Promise<A> => {
  const cpu = cpuDir !== undefined && cpuDir !== ""
  const heap = heapDir !== undefined && heapDir !== ""
  if (!cpu && !heap) return f()
  const session = new Session()
  session.connect()
  if (cpu) {
    await session.post("Profiler.enable")
    await session.post("Profiler.start")
  }
  if (heap) {
    await session.post("HeapProfiler.enable")
    await session.post("HeapProfiler.startSampling", {
      samplingInterval: 256,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true
    })
  }
  try {
    return await f()
  } finally {
    if (cpu) {
      const { profile } = await session.post("Profiler.stop")
      await mkdir(cpuDir, { recursive: true })
      await writeFile(`${cpuDir}/${name}.cpuprofile`, JSON.stringify(profile))
    }
    if (heap) {
      const { profile } = await session.post("HeapProfiler.stopSampling")
      await mkdir(heapDir, { recursive: true })
      await writeFile(`${heapDir}/${name}.heapprofile`, JSON.stringify(profile))
    }
    session.disconnect()
  }
}

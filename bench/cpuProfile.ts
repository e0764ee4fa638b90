/**
 * CPU profiles of benchmark rounds: with BENCH_CPU_PROFILE=dir, `profiled` runs its work under
 * the inspector's profiler and writes `dir/<name>.cpuprofile`; without it, it only runs the work.
 */
import { mkdir, writeFile } from "node:fs/promises"
import { Session } from "node:inspector/promises"

const profileDir = process.env.BENCH_CPU_PROFILE

/** Runs `f`, under the CPU profiler when BENCH_CPU_PROFILE names a directory. */
export const profiled = async <A>(name: string, f: () => Promise<A>): Promise<A> => {
  if (profileDir === undefined || profileDir === "") return f()
  const session = new Session()
  session.connect()
  await session.post("Profiler.enable")
  await session.post("Profiler.start")
  try {
    return await f()
  } finally {
    const { profile } = await session.post("Profiler.stop")
    session.disconnect()
    await mkdir(profileDir, { recursive: true })
    await writeFile(`${profileDir}/${name}.cpuprofile`, JSON.stringify(profile))
  }
}

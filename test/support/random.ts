/**
 * A small seedable random generator (mulberry32) for tests that draw workloads or fault
 * schedules: the same seed replays the same run.
 */

/** Numbers in [0, 1) from `seed`, the same sequence every time. */
export const generator = (seed: number): (() => number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6D2B79F5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

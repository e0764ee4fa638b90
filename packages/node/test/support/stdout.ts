/**
 * `process.stdout.write` captured while an effect runs, for tests of `Worker.run` in this process:
 * what it wrote, as JSON lines, both while it runs (`linesSoFar`) and once it has returned.
 */
import { Effect } from "effect"

/** The complete JSON lines in `chunks` (a line still being written is left out). */
const parse = (chunks: ReadonlyArray<string>) => {
  const text = chunks.join("")
  return text.slice(0, text.lastIndexOf("\n") + 1).split("\n").filter((line) => line !== "").map((line) =>
    JSON.parse(line) as Record<string, unknown>
  )
}

/**
 * Runs `effect(linesSoFar)` with `process.stdout.write` captured; returns its result and the JSON
 * lines written. `linesSoFar` reads the lines written until then (a complete line only).
 */
export const capturingStdoutWith = <A, E>(
  effect: (linesSoFar: Effect.Effect<ReadonlyArray<Record<string, unknown>>>) => Effect.Effect<A, E>
) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const original = process.stdout.write
      const chunks: Array<string> = []
      process.stdout.write = ((chunk: string | Uint8Array, ...rest: Array<unknown>) => {
        chunks.push(typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8"))
        const callback = rest.find((arg) => typeof arg === "function") as (() => void) | undefined
        if (callback !== undefined) queueMicrotask(callback)
        return true
      }) as typeof process.stdout.write
      return { original, chunks }
    }),
    ({ chunks }) =>
      Effect.map(
        effect(Effect.sync(() => parse(chunks))),
        (result) => ({ result, lines: parse(chunks) })
      ),
    ({ original }) => Effect.sync(() => void (process.stdout.write = original))
  )

/** Runs `effect` with `process.stdout.write` captured; returns its result and the JSON lines written. */
export const capturingStdout = <A, E>(effect: Effect.Effect<A, E>) => capturingStdoutWith(() => effect)

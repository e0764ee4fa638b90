/**
 * The `@since` tags a user reads in the shipped declarations (hover docs, the TypeDoc reference)
 * name versions the package has reached.
 *
 * The declarations in each tarball carry the doc comments of `packages/<name>/src`. Every
 * package is at 0.1.0 ("The first version, not yet published", its CHANGELOG says; the pending
 * changesets make the first release 0.2.0), yet many exports say `@since 0.3.0`, `0.4.0` or
 * `0.5.0`: left over from versions written into the source, as `jetworker --version` printed
 * 0.4.0 before it read its package.json. They say 0.1.0 now, the first version.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { readdirSync, readFileSync } from "node:fs"
import { join, relative } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const packages = ["core", "nats", "sql-pg", "node", "opentelemetry", "testing", "cli"]

const compare = (a: string, b: string): number => {
  const [x, y] = [a.split(".").map(Number), b.split(".").map(Number)]
  for (let i = 0; i < 3; i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0)
  return 0
}

const sources = (directory: string): Array<string> =>
  readdirSync(directory, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory()
      ? sources(join(directory, entry.name))
      : entry.name.endsWith(".ts") ? [join(directory, entry.name)] : []
  )

describe("the packages' @since tags", () => {
  it.effect("name no version past the package's own", () =>
    Effect.sync(() => {
      const problems = packages.flatMap((name) => {
        const directory = join(root, "packages", name)
        const { version } = JSON.parse(readFileSync(join(directory, "package.json"), "utf8")) as { readonly version: string }
        return sources(join(directory, "src")).flatMap((file) =>
          readFileSync(file, "utf8").split("\n").flatMap((line, index) => {
            const since = /@since\s+(\d+\.\d+\.\d+)/.exec(line)?.[1]
            return since !== undefined && compare(since, version) > 0
              ? [`${relative(root, file)}:${index + 1} @since ${since} (package ${version})`]
              : []
          })
        )
      })
      assert.deepStrictEqual(problems, [])
    }))
})

import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { readFileSync } from "node:fs"

const root = new URL("..", import.meta.url)
const read = (path: string) => readFileSync(new URL(path, root), "utf8")

/** The fenced code blocks under a heading of the README. */
const blocksUnder = (readme: string, heading: string): Array<string> => {
  const start = readme.indexOf(`## ${heading}`)
  const end = readme.indexOf("\n## ", start + 1)
  const section = readme.slice(start, end === -1 ? undefined : end)
  return [...section.matchAll(/```[a-z]*\n([\s\S]*?)```/g)].map((m) => m[1]!)
}

describe("README", () => {
  it.effect("the Quick start's first code block holds exactly two commands: the demo, then every test", () =>
    Effect.sync(() => {
      const [first] = blocksUnder(read("README.md"), "Quick start")
      const commands = first!.split("\n").map((l) => l.trim()).filter((l) => l !== "" && !l.startsWith("#"))
      assert.deepStrictEqual(commands, ["./scripts/jw demo", "./scripts/jw test"])
    }))

  it.effect("the consumer snippets are the reference worker's code, line for line", () =>
    Effect.sync(() => {
      const [snippet, classify] = blocksUnder(read("README.md"), "What a consumer looks like")
      const source = read("examples/ledger/src/LedgerWorker.ts").split("\n").map((l) => l.trim())
      for (const block of [snippet!, classify!]) {
        let at = 0
        for (const line of block.split("\n").map((l) => l.trim()).filter((l) => l !== "")) {
          // A line may stand at the end of a longer one (`return Consumer.make({`).
          const found = source.findIndex((candidate, i) => i >= at && candidate.endsWith(line))
          assert.isAtLeast(found, 0, `README line not in LedgerWorker.ts (in order): ${line}`)
          at = found + 1
        }
      }
    }))

  it.effect("the first consumer's snippet is the example's code, line for line, and its command runs its main file", () =>
    Effect.sync(() => {
      const blocks = blocksUnder(read("README.md"), "Your first consumer")
      const source = read("examples/first-consumer/src/OrderShipping.ts")
      const snippet = blocks.find((block) => block.includes("Consumer.make"))!
      for (const line of snippet.split("\n").map((l) => l.trim()).filter((l) => l !== "")) {
        assert.include(source, line)
      }
      assert.include(blocks.find((block) => block.includes("node "))!, "node examples/first-consumer/src/main.ts")
    }))

  it.effect("the unit-test snippet is the example's unit test, line for line (but for the elided options)", () =>
    Effect.sync(() => {
      const snippet = blocksUnder(read("README.md"), "Testing your consumer").find((block) => block.includes("InMemoryBroker.make"))
      const source = read("examples/first-consumer/test/OrderShipping.unit.test.ts")
      for (const line of snippet!.split("\n").map((l) => l.trim()).filter((l) => l !== "")) {
        if (!line.includes("/*")) {
          assert.include(source, line)
          continue
        }
        // The one line that folds the consumer's options: each option it shows is in the file.
        for (const part of ["const consumer = Consumer.make({", `name: "order-shipping",`, "source: broker.source,"]) {
          assert.include(line, part)
          assert.include(source, part)
        }
      }
    }))

  it.effect("the entry-point snippet is the reference worker's main.ts, line for line", () =>
    Effect.sync(() => {
      const entry = blocksUnder(read("README.md"), "What a consumer looks like").find((block) => block.includes("Worker.runMain"))
      const source = read("examples/ledger/src/main.ts")
      for (const line of entry!.split("\n").map((l) => l.trim()).filter((l) => l !== "")) {
        assert.include(source, line)
      }
    }))

  it.effect("the configuration-check command in the README is the one CI runs", () =>
    Effect.sync(() => {
      const command = "pnpm exec jetworker config check --manifest examples/ledger/deploy/deployment.yaml --ack-wait-env LEDGER_ACK_WAIT"
      assert.include(read("README.md"), command)
      assert.include(read(".ci/run"), command)
    }))
})

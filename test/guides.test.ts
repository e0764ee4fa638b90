/**
 * The getting-started guide (`docs/getting-started.md`) shows the code that CI builds and runs
 * from the packed tarballs (`test/fixtures/packed-app`, run by `test/packages.test.ts`): its
 * blocks must stay those files, and what it installs must be what that test installs. The doc
 * comments' examples compile (`scripts/doc-examples.ts`, which `pnpm run docs` runs in CI); here, the
 * extraction they rely on.
 */
import { assert, describe, it } from "@effect/vitest"
import { Envelope } from "@jetworker/core"
import { Effect, Schema } from "effect"
import { readFileSync } from "node:fs"
import { examplesOf } from "../scripts/doc-examples.ts"

const read = (path: string) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8")
const blocks = (markdown: string, language: string): Array<string> =>
  [...markdown.matchAll(new RegExp("```" + language + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]!)

describe("the getting-started guide", () => {
  it.effect("its tsconfig and main.ts are the packed application's files, whole", () =>
    Effect.sync(() => {
      const guide = read("docs/getting-started.md")
      assert.deepStrictEqual(
        blocks(guide, "json"),
        [read("test/fixtures/packed-app/tsconfig.json")],
        "the guide's one json block is test/fixtures/packed-app/tsconfig.json, whole: change both together"
      )
      assert.deepStrictEqual(blocks(guide, "ts"), [read("test/fixtures/packed-app/src/main.ts")])
    }))

  it.effect("it installs what the packed application depends on, and runs what it runs", () =>
    Effect.sync(() => {
      const guide = read("docs/getting-started.md")
      const script = read("scripts/packed-app.ts")
      const add = guide.split("\n").find((line) => line.startsWith("pnpm add @jetworker"))!.split(" ").slice(2)
      for (const name of ["@jetworker/core", "@jetworker/nats", "@jetworker/sql-pg", "@jetworker/node"]) assert.include(add, name)
      for (const name of ["effect", "@effect/platform-node", "@effect/sql-pg"]) {
        assert.include(add, name)
        assert.include(script, `"${name}":`)
      }
      assert.include(guide, "pnpm exec tsc -p tsconfig.json")
      assert.include(script, `["exec", "tsc", "-p", "tsconfig.json"]`)
      assert.include(guide, "node dist/main.js")
      assert.include(script, `["dist/main.js"]`)
      // Before the packages are published: the command the guide gives is the script's.
      assert.include(guide, "node scripts/packed-app.ts --pack-only ")
      assert.include(script, `"--pack-only"`)
    }))

  it.effect("its message on the wire decodes with the guide's schema", () =>
    Effect.sync(() => {
      const guide = read("docs/getting-started.md")
      const [wire] = blocks(guide, "jsonc")
      assert.include(guide, `Envelope.schema("greeting", Schema.Struct({ name: Schema.String }))`)
      const Greeting = Envelope.schema("greeting", Schema.Struct({ name: Schema.String }))
      const decoded = Schema.decodeUnknownSync(Greeting)(JSON.parse(wire!))
      assert.deepStrictEqual([decoded.id, decoded.type, decoded.data], ["greeting-1", "greeting", { name: "Ada" }])
    }))
})

describe("doc comment examples", () => {
  it.effect("each ```ts block of a doc comment is one example, with the line it starts on; other blocks are prose", () =>
    Effect.sync(() => {
      const source = [
        "/**",
        " * Text.",
        " *",
        " * ```ts",
        " * import { Effect } from \"effect\"",
        " *",
        " * const program = Effect.gen(function*() {",
        " *   yield* Effect.log(\"indented\")",
        " * })",
        " * ```",
        " *",
        " * ```json",
        " * { \"not\": \"compiled\" }",
        " * ```",
        " */",
        "// ```ts outside a doc comment is not an example",
        "export const x = 1"
      ].join("\n")
      const examples = examplesOf("a.ts", source)
      assert.strictEqual(examples.length, 1)
      assert.strictEqual(examples[0]!.line, 5)
      assert.strictEqual(
        examples[0]!.code,
        "import { Effect } from \"effect\"\n\nconst program = Effect.gen(function*() {\n  yield* Effect.log(\"indented\")\n})\n"
      )
    }))

  it.effect("an example left open at the end of its comment is an error that names the line", () =>
    Effect.sync(() => {
      assert.throws(() => examplesOf("b.ts", "/**\n * ```ts\n * const a = 1\n */"), /b\.ts:2: a ```ts block is not closed/)
    }))
})

/**
 * A newcomer's first compile: the getting-started guide's compiler settings (its one ```json
 * block, taken from the guide itself) compile both the guide's program (its ```ts block) and the
 * README's first consumer (`examples/first-consumer/src`, whose `main.ts` imports
 * `./OrderShipping.ts` so that `node src/main.ts` runs it as it is), with `tsc --noEmit` and with
 * the guide's own build command; the build's `dist/` then loads under Node (a `.ts` import left
 * as it was would not). The guide's program with the attempt store its prose advises
 * (`PgAttemptStore`) compiles too. The application sits in a scratch directory inside the workspace
 * (`.tmp/`, git-ignored), so `@jetworker/*`, `effect` and `@types/node` resolve as they do here.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const tsc = join(root, "node_modules/typescript/bin/tsc")
const blocks = (markdown: string, language: string): Array<string> =>
  [...markdown.matchAll(new RegExp("```" + language + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]!)

/** Runs `node args` in `cwd`, at most 120 s; its exit code and output (never fails). */
const run = (args: ReadonlyArray<string>, cwd: string) =>
  Effect.callback<{ readonly code: number; readonly output: string }>((resume) => {
    const child = execFile(process.execPath, [...args], { cwd, timeout: 120_000, encoding: "utf8" }, (error, stdout, stderr) =>
      resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, output: `${stdout}${stderr}` })))
    return Effect.sync(() => void child.kill())
  })

/** A scratch application: the guide's tsconfig, and `files` (name -> text) in its `src/`. */
const scratchApp = (tsconfig: string, files: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      mkdirSync(join(root, ".tmp"), { recursive: true })
      const app = mkdtempSync(join(root, ".tmp", "newcomer-app-"))
      mkdirSync(join(app, "src"))
      writeFileSync(join(app, "tsconfig.json"), tsconfig)
      writeFileSync(join(app, "package.json"), JSON.stringify({ name: "newcomer-app", private: true, type: "module" }))
      for (const [name, text] of Object.entries(files)) writeFileSync(join(app, "src", name), text)
      return app
    }),
    (app) => Effect.sync(() => rmSync(app, { recursive: true, force: true }))
  )

describe("the getting-started guide's compiler settings", () => {
  it.live("compile the guide's program (also with the PgAttemptStore it advises) and the first consumer (which imports ./OrderShipping.ts), with --noEmit and with the guide's build; the build loads under Node", () =>
    Effect.gen(function*() {
      const guide = readFileSync(join(root, "docs/getting-started.md"), "utf8")
      const json = blocks(guide, "json")
      assert.strictEqual(json.length, 1, "the guide has one ```json block, its tsconfig")
      const [program] = blocks(guide, "ts")
      const example = join(root, "examples/first-consumer/src")
      // The guide's advice for an attempt store (a paragraph, not a block), put in its program.
      const wiring = /`(Layer\.mergeAll\(PgIdempotencyStore\.layer\(\), PgAttemptStore\.layer\(\)\)[^`]*)`/.exec(guide)?.[1]
      assert.isDefined(wiring, "the guide says how to add PgAttemptStore")
      const withAttempts = program!
        .replace("PgIdempotencyStore.layer().pipe(Layer.provide(Migrations.layer), Layer.provideMerge(Database))", wiring!)
        .replace("import { Migrations, PgIdempotencyStore }", "import { Migrations, PgAttemptStore, PgIdempotencyStore }")
      assert.include(withAttempts, `PgAttemptStore.layer()).pipe(Layer.provide(Migrations.layer), Layer.provideMerge(Database))`)
      assert.include(withAttempts, "import { Migrations, PgAttemptStore, PgIdempotencyStore }")
      const files: Record<string, string> = { "guide-main.ts": program!, "guide-with-attempts.ts": withAttempts }
      for (const name of readdirSync(example)) files[name] = readFileSync(join(example, name), "utf8")
      assert.include(files["main.ts"], `from "./OrderShipping.ts"`)
      const app = yield* scratchApp(json[0]!, files)

      const checked = yield* run([tsc, "-p", "tsconfig.json", "--noEmit"], app)
      assert.deepStrictEqual(checked, { code: 0, output: "" })

      // The guide's build (`pnpm exec tsc -p tsconfig.json`), without the guide's own program:
      // run, it would start a worker; the first consumer's module is loaded instead.
      for (const name of ["guide-main.ts", "guide-with-attempts.ts"]) rmSync(join(app, "src", name))
      const built = yield* run([tsc, "-p", "tsconfig.json"], app)
      assert.deepStrictEqual(built, { code: 0, output: "" })
      assert.include(readFileSync(join(app, "dist/main.js"), "utf8"), `from "./OrderShipping.js"`)
      const loaded = yield* run(
        ["--input-type=module", "-e", `const m = await import("./dist/OrderShipping.js"); console.log(typeof m.shipping)`],
        app
      )
      assert.deepStrictEqual(loaded, { code: 0, output: "function\n" })
    }).pipe(Effect.scoped), 300_000)
})

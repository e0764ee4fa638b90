/**
 * Compiles the examples in the packages' doc comments, so that the API reference never shows code
 * that does not build. Every fenced ```ts block inside a `/** … *\/` comment under
 * `packages/*\/src` is a complete module (its own imports, from the package names a user
 * imports), written to `.tmp/doc-examples/` and type-checked there with the repository's strict
 * settings (unused names allowed: an example may declare what it only shows).
 *
 *   node scripts/doc-examples.ts        # exit 0: every example compiles; 1: the errors, by source line
 *
 * Blocks fenced as anything else (```text, ```json, ```sh) are prose and are not compiled.
 */
import { execFileSync } from "node:child_process"
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { join, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const out = join(root, ".tmp/doc-examples")

/** One example: where it is in the sources, and its code. */
interface Example {
  readonly file: string
  readonly line: number
  readonly code: string
}

const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return sourceFiles(path)
    return name.endsWith(".ts") ? [path] : []
  })

/** The ```ts blocks of the doc comments of one file, with the line each starts on. */
export const examplesOf = (file: string, text: string): Array<Example> => {
  const examples: Array<Example> = []
  const lines = text.split("\n")
  let inComment = false
  let block: Array<string> | undefined
  let start = 0
  lines.forEach((raw, index) => {
    const line = raw.trim()
    if (!inComment && line.startsWith("/**")) inComment = true
    if (inComment) {
      const body = line.replace(/^\/\*\*\s?/, "").replace(/\*\/$/, "").replace(/^\*\s?/, "")
      // The comment's own indentation after "* " is kept, so an example reads as written.
      const content = raw.replace(/^\s*\/?\*+\s?/, "").replace(/\s*\*\/\s*$/, "")
      if (block === undefined && /^```ts\s*$/.test(body)) {
        block = []
        start = index + 2
      } else if (block !== undefined && /^```\s*$/.test(body)) {
        examples.push({ file, line: start, code: block.join("\n") + "\n" })
        block = undefined
      } else if (block !== undefined) {
        block.push(content)
      }
    }
    if (inComment && line.endsWith("*/")) {
      if (block !== undefined) throw new Error(`${file}:${start - 1}: a \`\`\`ts block is not closed in its comment`)
      inComment = false
    }
  })
  return examples
}

const main = () => {
  const files = readdirSync(join(root, "packages")).flatMap((pkg) => {
    const src = join(root, "packages", pkg, "src")
    try {
      return sourceFiles(src)
    } catch {
      return []
    }
  })
  const examples = files.flatMap((file) => examplesOf(relative(root, file), readFileSync(file, "utf8")))
  rmSync(out, { recursive: true, force: true })
  mkdirSync(out, { recursive: true })
  const names = new Map<string, Example>()
  examples.forEach((example, index) => {
    const name = `example${String(index).padStart(3, "0")}.ts`
    names.set(name, example)
    writeFileSync(join(out, name), `// ${example.file}:${example.line}\n${example.code}`)
  })
  writeFileSync(
    join(out, "tsconfig.json"),
    JSON.stringify({
      extends: "../../tsconfig.base.json",
      compilerOptions: { noUnusedLocals: false, noUnusedParameters: false },
      include: ["*.ts"]
    }, null, 2)
  )
  try {
    execFileSync(join(root, "node_modules/.bin/tsc"), ["-p", join(out, "tsconfig.json"), "--pretty", "false"], {
      cwd: root,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"]
    })
  } catch (error) {
    const output = String((error as { readonly stdout?: string }).stdout ?? error)
    // Errors name the example file and line: say where that line is in the sources instead.
    const mapped = output.replace(/(?:\.tmp\/doc-examples\/)?(example\d{3}\.ts)\((\d+),(\d+)\)/g, (whole, name: string, line: string, column: string) => {
      const example = names.get(name)
      return example === undefined ? whole : `${example.file}:${example.line + Number(line) - 2}:${column}`
    })
    console.error(`doc examples: ${examples.length} found; these do not compile:\n${mapped}`)
    process.exit(1)
  }
  console.log(`doc examples: ${examples.length} examples in ${new Set(examples.map((e) => e.file)).size} files compile`)
}

// Run as a script (not when a test imports `examplesOf`); compared as paths, so that a checkout
// whose path needs URL escaping still runs the check instead of passing it silently.
if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === resolve(process.argv[1])) main()

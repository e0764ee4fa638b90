/**
 * The packages as a user gets them: builds every package (`tsc -b tsconfig.build.json`), packs
 * each one (`pnpm pack`, which applies `publishConfig`: `exports` and `bin` point at `dist/`),
 * checks what each tarball holds (code, declarations, license, README, changelog; no tests),
 * installs the tarballs into a scratch application outside the workspace (every `@jetworker/*`
 * dependency overridden to its tarball, so nothing comes from the workspace or the registry),
 * compiles the consumer in `test/fixtures/packed-app` there with strict TypeScript (NodeNext), checks
 * the shipped declarations (`skipLibCheck` off) and that each package's `package.json` resolves
 * through its `exports` while its `internal/` modules do not, runs the consumer against the real
 * NATS and PostgreSQL, and runs the installed `jetworker --help`.
 *
 *   node scripts/packed-app.ts            # NATS_URL, DATABASE_URL (schema in its options), APP_STREAM
 *   node scripts/packed-app.ts --pack-only <directory>
 *
 * `--pack-only` builds, packs and checks the tarballs into `<directory>` and prints what an
 * application adds to install them (docs/getting-started.md, until the packages are published);
 * the full run prints the same lines for the tarballs it installs.
 *
 * Prints one `step <name> ok (<ms> ms)` line per step and the application's output; exits 1 at
 * the first failed step, with its output. The scratch directory is removed unless
 * `JW_KEEP_PACKED_APP=1`.
 */
import { execFileSync } from "node:child_process"
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const packages = ["core", "nats", "sql-pg", "node", "opentelemetry", "testing", "cli"]
const packOnly = process.argv[2] === "--pack-only" ? resolve(process.argv[3] ?? "") : undefined
if (process.argv[2] !== undefined && (packOnly === undefined || process.argv[3] === undefined || process.argv[3] === "")) {
  console.log("usage: node scripts/packed-app.ts [--pack-only <directory>]")
  process.exit(2)
}
const scratch = mkdtempSync(join(tmpdir(), "jw-packed-"))
const packs = packOnly ?? join(scratch, "packs")
const app = join(scratch, "app")

const run = (name: string, command: string, args: ReadonlyArray<string>, cwd: string, env: NodeJS.ProcessEnv = process.env): string => {
  const started = Date.now()
  try {
    const output = execFileSync(command, [...args], { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 180_000 })
    console.log(`step ${name} ok (${Date.now() - started} ms)`)
    return output
  } catch (error) {
    const failed = error as { readonly stdout?: string; readonly stderr?: string; readonly message: string }
    console.log(`step ${name} FAILED: ${failed.message}\n${failed.stdout ?? ""}\n${failed.stderr ?? ""}`)
    process.exit(1)
  }
}

/**
 * What a user gets in each tarball: the compiled code with its declarations, the license, the
 * README and the changelog, and `exports` that point at `dist/`; no tests, and no compiled module
 * whose source is gone (a stale `dist/` file, importable and typed in the package).
 */
const checkContents = (file: string, listing: string): void => {
  const entries = new Set(listing.split("\n").filter((line) => line !== ""))
  const source = join(root, "packages", file.replace(/^jetworker-/, "").replace(/-\d+\.\d+\.\d+\.tgz$/, ""), "src")
  const stale = [...entries].filter((entry) =>
    /^package\/dist\/.+\.js$/.test(entry) && !existsSync(join(source, entry.slice("package/dist/".length).replace(/\.js$/, ".ts")))
  )
  const missing = ["package/LICENSE", "package/README.md", "package/CHANGELOG.md", "package/dist/index.js", "package/dist/index.d.ts"]
    .filter((entry) => !entries.has(entry))
  const tests = [...entries].filter((entry) => entry.startsWith("package/test/"))
  const manifest = JSON.parse(execFileSync("tar", ["xzOf", join(packs, file), "package/package.json"], { encoding: "utf8" })) as {
    readonly exports: { readonly ".": { readonly types?: string; readonly default?: string }; readonly [path: string]: unknown }
  }
  const exported = manifest.exports["."]
  const problems = [
    ...missing.map((entry) => `${entry} is missing`),
    ...tests.map((entry) => `${entry} is shipped`),
    ...stale.map((entry) => `${entry} is shipped, but its source is gone (a stale build)`),
    ...(exported.types === "./dist/index.d.ts" && exported.default === "./dist/index.js" ? [] : [`exports "." is ${JSON.stringify(exported)}`]),
    // Tools read a dependency's package.json through its exports; internal modules stay private.
    ...(manifest.exports["./package.json"] === "./package.json" ? [] : [`exports "./package.json" is ${JSON.stringify(manifest.exports["./package.json"])}`]),
    ...(manifest.exports["./internal/*"] === null ? [] : [`exports "./internal/*" is ${JSON.stringify(manifest.exports["./internal/*"])}, not null`])
  ]
  if (problems.length > 0) {
    console.log(`step contents ${file} FAILED: ${problems.join("; ")}`)
    process.exit(1)
  }
  console.log(`step contents ${file} ok`)
}

try {
  // From scratch: `tsc -b` never deletes the output of a module that was removed or renamed (its
  // build info lives in `dist/` too, so this also makes the build a full one).
  for (const name of packages) rmSync(join(root, "packages", name, "dist"), { recursive: true, force: true })
  run("build", "pnpm", ["exec", "tsc", "-b", "tsconfig.build.json"], root)
  mkdirSync(packs, { recursive: true })
  for (const name of packages) run(`pack ${name}`, "pnpm", ["pack", "--pack-destination", packs], join(root, "packages", name))
  for (const file of readdirSync(packs)) checkContents(file, run(`list ${file}`, "tar", ["tzf", join(packs, file)], packs))
  const tarballs = Object.fromEntries(
    readdirSync(packs).map((file) => [`@jetworker/${file.replace(/^jetworker-/, "").replace(/-\d+\.\d+\.\d+\.tgz$/, "")}`, `file:${join(packs, file)}`])
  )
  const overrides = `overrides:\n${Object.entries(tarballs).map(([name, spec]) => `  "${name}": "${spec}"`).join("\n")}\n`
  console.log(
    `to install these tarballs in an application: its package.json "dependencies" take\n` +
      Object.entries(tarballs).map(([name, spec]) => `  "${name}": "${spec}",`).join("\n") +
      `\nand its pnpm-workspace.yaml (their dependencies on each other point at the tarballs too)\n${overrides}`
  )
  if (packOnly === undefined) runApp(tarballs, overrides)
} finally {
  if (process.env.JW_KEEP_PACKED_APP !== "1") rmSync(scratch, { recursive: true, force: true })
}

/**
 * The declarations as shipped, checked with the application's strict settings (the fixture's own
 * settings skip them): only errors in `@jetworker/*` count, since some of our dependencies'
 * declarations fail under them (`@nats-io`'s with `exactOptionalPropertyTypes`, `effect`'s crypto
 * modules without the DOM lib).
 */
function checkDeclarations(): void {
  const started = Date.now()
  let output = ""
  try {
    output = execFileSync("pnpm", ["exec", "tsc", "-p", "tsconfig.json", "--noEmit", "--skipLibCheck", "false"], {
      cwd: app,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 180_000
    })
  } catch (error) {
    output = (error as { readonly stdout?: string }).stdout ?? ""
  }
  const ours = output.split("\n").filter((line) => / error TS\d+/.test(line) && line.includes("@jetworker"))
  if (ours.length > 0) {
    console.log(`step check declarations FAILED:\n${ours.join("\n")}`)
    process.exit(1)
  }
  console.log(`step check declarations ok (${Date.now() - started} ms)`)
}

/** Run in the application: exits 1 naming each package whose exports do not behave. */
function resolveExports(): string {
  return `
import { createRequire } from "node:module"
const require = createRequire(process.cwd() + "/index.js")
const problems = []
for (const name of ${JSON.stringify(packages)}) {
  try { require.resolve("@jetworker/" + name + "/package.json") } catch (error) { problems.push(name + "/package.json: " + error.code) }
  try {
    await import("@jetworker/" + name + "/internal/anything")
    problems.push(name + "/internal/anything resolved")
  } catch (error) {
    if (error.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") problems.push(name + "/internal/anything: " + error.code)
  }
}
if (problems.length > 0) { console.log(problems.join("\\n")); process.exit(1) }
`
}

/** Installs the tarballs in a scratch application, compiles the fixture, runs it and `jetworker --help`. */
function runApp(tarballs: Record<string, string>, overrides: string): void {
  cpSync(join(root, "test/fixtures/packed-app"), app, { recursive: true })
  writeFileSync(join(app, "package.json"), JSON.stringify({
    name: "packed-app",
    private: true,
    type: "module",
    dependencies: {
      ...tarballs,
      "effect": "4.1.0",
      "@effect/platform-node": "4.1.0",
      "@effect/sql-pg": "4.0.5",
      "@effect/opentelemetry": "4.1.0"
    },
    devDependencies: { "typescript": "5.9.3", "@types/node": "24.19.4" }
  }, null, 2))
  // The tarballs' dependencies on each other are versions (`workspace:*` packed): point them at the tarballs too.
  writeFileSync(join(app, "pnpm-workspace.yaml"), overrides)
  run("install", "pnpm", ["install", "--prefer-offline", "--reporter=silent"], app, { ...process.env, CI: "true" })
  run("compile", "pnpm", ["exec", "tsc", "-p", "tsconfig.json"], app)
  checkDeclarations()
  // As installed: each package's package.json resolves through its exports, its internals do not.
  run("resolve exports", process.execPath, ["--input-type=module", "-e", resolveExports()], app)
  const output = run("run", process.execPath, ["dist/main.js"], app, { ...process.env, HEALTH_PORT: "0", HEALTH_HOST: "127.0.0.1" })
  process.stdout.write(output)
  const help = run("jetworker --help", join(app, "node_modules/.bin/jetworker"), ["--help"], app)
  process.stdout.write(help)
}

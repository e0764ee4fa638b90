/**
 * `jetworker --version` prints the version of the package it is, read from its `package.json`.
 *
 * Before: it printed a version written into the source ("0.4.0") while the package was 0.1.0.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"

const bin = fileURLToPath(new URL("../src/bin/jetworker.ts", import.meta.url))
const packageVersion = (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version

describe("jetworker --version", () => {
  it.live("prints the package's version", () =>
    Effect.callback<{ readonly code: number; readonly stdout: string }>((resume) => {
      const child = execFile(process.execPath, [bin, "--version"], { timeout: 20_000 }, (error, stdout) =>
        resume(Effect.succeed({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout })))
      return Effect.sync(() => child.kill())
    }).pipe(Effect.map(({ code, stdout }) => {
      assert.strictEqual(code, 0)
      assert.strictEqual(stdout.trim(), `jetworker v${packageVersion}`)
    })))
})

/**
 * Packing or publishing with npm would ship `exports` pointing at `src/` and `workspace:*`
 * dependencies (only pnpm applies `publishConfig` and rewrites them): each package's `prepack`
 * runs `scripts/pack-guard.ts`, which refuses any tool but pnpm, naming what to use.
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const guard = fileURLToPath(new URL("../scripts/pack-guard.ts", import.meta.url))

/** The guard run as a package's `prepack` is, by the tool whose user agent is `agent`. */
const run = (agent: string | undefined) => {
  const env: Record<string, string | undefined> = { ...process.env, npm_package_name: "@jetworker/core" }
  if (agent === undefined) delete env.npm_config_user_agent
  else env.npm_config_user_agent = agent
  return spawnSync(process.execPath, [guard], { env, encoding: "utf8", timeout: 20_000 })
}

describe("pack guard", () => {
  it("every package's prepack runs the guard first", () => {
    for (const name of readdirSync(`${root}/packages`)) {
      const manifest = JSON.parse(readFileSync(`${root}/packages/${name}/package.json`, "utf8")) as { readonly scripts?: Record<string, string> }
      assert.match(manifest.scripts?.prepack ?? "", /^node \.\.\/\.\.\/scripts\/pack-guard\.ts && /, name)
    }
  })

  it("refuses npm (and an unknown tool), naming the package and what to use; lets pnpm through", () => {
    for (const agent of ["npm/11.19.1 node/v24.22.3 linux x64 workspaces/false", "yarn/1.22.22 npm/? node/v24.22.3 linux x64", undefined]) {
      const refused = run(agent)
      assert.strictEqual(refused.status, 1, String(agent))
      assert.include(refused.stderr, "refusing to pack @jetworker/core with ")
      assert.include(refused.stderr, "pack and publish with pnpm")
    }
    assert.include(run("npm/11.19.1 node/v24.22.3").stderr, "with npm/11.19.1:")
    const allowed = run("pnpm/10.34.9 npm/? node/v24.22.3 linux x64")
    assert.strictEqual(allowed.status, 0, allowed.stderr)
    assert.strictEqual(allowed.stderr, "")
  })
})

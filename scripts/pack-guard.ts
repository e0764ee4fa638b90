/**
 * Run by each package's `prepack`: refuses to pack or publish with anything but pnpm. The packages'
 * `publishConfig` (`exports` and `bin` pointing at `dist/`) and their `workspace:*` dependencies
 * are rewritten by pnpm only: `npm pack` or `npm publish` would ship `exports` pointing at `src/`
 * (not in the tarball) and dependencies no registry can resolve. Changesets publishes with pnpm.
 */
const agent = process.env.npm_config_user_agent ?? ""
if (!agent.startsWith("pnpm/")) {
  console.error(
    `refusing to pack ${process.env.npm_package_name ?? "this package"} with ${agent.split(" ")[0] || "an unknown tool"}: ` +
      `pack and publish with pnpm (pnpm pack, pnpm publish, or pnpm changeset publish), which applies publishConfig ` +
      `(exports at dist/) and replaces workspace:* dependencies with versions`
  )
  process.exit(1)
}

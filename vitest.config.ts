import { defineConfig } from "vitest/config"

// One run for the whole workspace. Tests talk to the real NATS and PostgreSQL; each test file
// isolates itself (throw-away streams, consumers and database schemas), so files run in parallel.
export default defineConfig({
  test: {
    include: [
      "packages/*/test/**/*.test.ts",
      "examples/*/test/**/*.test.ts",
      "test/**/*.test.ts"
    ],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    maxWorkers: 3,
    reporters: ["default"],
    sequence: { shuffle: false }
  }
})

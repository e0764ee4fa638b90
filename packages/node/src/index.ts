/**
 * `@jetworker/node`: the process around the engine on Node.js — `Worker.runMain` (signals, one
 * budgeted shutdown, exit codes), the health and metrics server, and the JSON log format.
 *
 * @since 0.1.0
 */
export * as HealthServer from "./HealthServer.ts"
export * as JsonLogger from "./JsonLogger.ts"
export * as Worker from "./Worker.ts"

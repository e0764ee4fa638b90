/**
 * `@jetworker/cli`: the `jetworker` command and the checks behind it.
 *
 * @since 0.1.0
 */
export * as ConfigCheck from "./ConfigCheck.ts"
export * as DeadLetters from "./DeadLetters.ts"
export * as Contracts from "./Contracts.ts"

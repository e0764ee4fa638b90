/**
 * `@jetworker/testing`: scoped test harness for jetworker. Import modules as namespaces, e.g.
 * `import { FaultProxy } from "@jetworker/testing"`.
 *
 * @since 0.1.0
 */
export * as FaultProxy from "./FaultProxy.ts"
export * as ChildWorker from "./ChildWorker.ts"
export * as OutcomeLog from "./OutcomeLog.ts"
export * as SpanLog from "./SpanLog.ts"
export * as TestStream from "./TestStream.ts"
export * as TestDatabase from "./TestDatabase.ts"
export * as Eventually from "./Eventually.ts"
export * as InMemoryBroker from "./InMemoryBroker.ts"
export * as InMemoryIdempotencyStore from "./InMemoryIdempotencyStore.ts"
export * as NatsServer from "./NatsServer.ts"

/**
 * `@jetworker/core`: the engine and domain of jetworker, with no I/O library. Import modules as
 * namespaces, e.g. `import { Consumer, Outcome } from "@jetworker/core"`.
 *
 * @since 0.1.0
 */
export * as AttemptStore from "./AttemptStore.ts"
export * as Classification from "./Classification.ts"
export * as Consumer from "./Consumer.ts"
export * as CurrentDelivery from "./CurrentDelivery.ts"
export * as Delivery from "./Delivery.ts"
export * as DurationInput from "./DurationInput.ts"
export * as Envelope from "./Envelope.ts"
export * as ErrorSummary from "./ErrorSummary.ts"
export * as Expiry from "./Expiry.ts"
export * as IdempotencyStore from "./IdempotencyStore.ts"
export * as Lease from "./Lease.ts"
export * as Lifecycle from "./Lifecycle.ts"
export * as Ordering from "./Ordering.ts"
export * as Outbox from "./Outbox.ts"
export * as Outcome from "./Outcome.ts"
export * as Probe from "./Probe.ts"
export * as Retry from "./Retry.ts"
export * as Source from "./Source.ts"
export * as Telemetry from "./Telemetry.ts"

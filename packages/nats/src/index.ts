/**
 * `@jetworker/nats`: JetStream for jetworker — the connection Layer, the pull `Source` with
 * confirmed settlement, the dead-letter stream with replay, stream/consumer declarations and a
 * confirmed publisher.
 *
 * @since 0.1.0
 */
export * as Contract from "./Contract.ts"
export * as DeadLetter from "./DeadLetter.ts"
export * as JetStreamSource from "./JetStreamSource.ts"
export * as MaxDeliveries from "./MaxDeliveries.ts"
export * as NatsConnection from "./NatsConnection.ts"
export * as NatsError from "./NatsError.ts"
export * as Topology from "./Topology.ts"
export * as Publisher from "./Publisher.ts"

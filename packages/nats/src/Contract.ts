/**
 * A service's JetStream contract as code (INT-NATS-002): its stream (the closed list of subjects,
 * storage, replicas, duplicate window, maximum age), its durable consumers, and what the
 * application expects of each (attempts, concurrency, prefetch, instances, ordering), checked
 * against the live server. The compatibility checks jetworker makes live here, once:
 * `JetStreamSource` runs {@link consumerFindings} on the live consumer when it opens, and
 * {@link check} runs every check of a contract (in CI against a live server, or before a deploy).
 *
 * Ownership says who may write: a `service`-owned contract is applied with `Topology` (which
 * creates what is missing and brings mutable settings to the declaration), a `platform`-owned one
 * is only ever checked. This module never writes.
 *
 * It deliberately does not compare settings a contract leaves out (a stream's limits in bytes or
 * messages, a consumer's deliver policy), nor fix anything it finds: each finding says what to do.
 *
 * @since 0.1.0
 */
import { AckPolicy, type ConsumerConfig, type StreamConfig } from "@nats-io/jetstream"
import { Duration, Effect } from "effect"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"
import * as Topology from "./Topology.ts"

/** What the application expects of one consumer: the settings the server's must agree with. */
export interface Expectations {
  /** Deliveries the retry policy plans (`Consumer.make`'s `retry`; default policy: 5). */
  readonly attempts: number
  /** Handlers running at once in one instance. */
  readonly concurrency: number
  /** Deliveries reserved ahead of the handlers in one instance. */
  readonly prefetch: number
  /** Instances (processes) reading the consumer at once. Default: 1. */
  readonly instances?: number | undefined
  /** The ordering model. Default: `"Unordered"`. */
  readonly ordering?: "Unordered" | "PerKey" | "Sequential" | undefined
}

/** One durable consumer of a contract: its declaration and what the application expects of it. */
export interface ConsumerContract extends Omit<Topology.ConsumerOptions, "stream"> {
  readonly expect: Expectations
}

/** A service's contract with its stream. */
export interface Contract {
  /** The contract's own version, for review (e.g. `"2026-12-01"` or `"3"`). */
  readonly version: string
  /** `service`: the service applies it with `Topology`; `platform`: it is only checked. */
  readonly ownership: "service" | "platform"
  /** The stream; its `subjects` are the closed list the live stream must capture, no more. */
  readonly stream: Topology.StreamOptions
  readonly consumers: ReadonlyArray<ConsumerContract>
  /**
   * How long a producer may republish an event after its first attempt (retries, a relay's
   * restart); the stream's duplicate window must cover it. Default: not checked.
   */
  readonly publishHorizon?: Duration.Input | undefined
}

/** Which check a finding comes from. */
export type Check =
  | "exists"
  | "subjects"
  | "storage"
  | "replicas"
  | "duplicate_window"
  | "max_age"
  | "ack_policy"
  | "ack_wait"
  | "max_deliver"
  | "max_ack_pending"
  | "filter_subject"
  | "backoff"
  | "ordering"

/** One incompatibility (`error`: the consumer must not run so) or risk (`warning`). */
export interface Finding {
  readonly severity: "error" | "warning"
  /** `stream ORDERS` or `consumer ORDERS/order-shipping`. */
  readonly target: string
  readonly check: Check
  /** What is wrong and what to do about it. */
  readonly message: string
}

const nanosToMillis = (nanos: number | undefined): number => Math.floor((nanos ?? 0) / 1_000_000)

const formatMillis = (ms: number): string => Duration.format(Duration.millis(ms))

/**
 * The checks of a live consumer's config against what the application expects: explicit acks,
 * MaxDeliver above the planned attempts (so the last attempt dead-letters the message itself),
 * no server BackOff (on NATS 2.9 it replaces the engine's nak delays), MaxAckPending 1 for
 * sequential ordering and at least `instances x (concurrency + prefetch)` otherwise.
 */
export const consumerFindings = (
  target: string,
  live: Partial<ConsumerConfig>,
  expect: Expectations
): ReadonlyArray<Finding> => {
  const findings: Array<Finding> = []
  const add = (severity: Finding["severity"], check: Check, message: string) =>
    findings.push({ severity, target, check, message })
  if (live.ack_policy !== AckPolicy.Explicit) {
    add(
      "error",
      "ack_policy",
      `${target} has ack policy ${live.ack_policy}; jetworker needs explicit acks: an ack policy cannot change in ` +
        `place, so delete the consumer and declare it again (Topology.ensureConsumer, or \`nats consumer add ` +
        `--ack explicit --pull\`)`
    )
  }
  const maxDeliver = live.max_deliver ?? -1
  if (maxDeliver !== -1 && maxDeliver <= expect.attempts) {
    add(
      "error",
      "max_deliver",
      `${target} has max_deliver ${maxDeliver}; it must exceed the retry policy's ${expect.attempts} attempts ` +
        `so that the last attempt can dead-letter the message itself: raise it to at least ${expect.attempts + 1} ` +
        `(Topology.ensureConsumer({ maxDeliver }), or \`nats consumer edit --max-deliver\`), or lower the attempts`
    )
  }
  if (live.backoff !== undefined && live.backoff.length > 0) {
    add(
      "warning",
      "backoff",
      `${target} has a server backoff; on NATS 2.9 it distorts the engine's nak delays: remove it from the consumer ` +
        `(the retry policy sets the delays)`
    )
  }
  const maxAckPending = live.max_ack_pending
  if (expect.ordering === "Sequential") {
    if (maxAckPending !== 1) {
      add(
        "error",
        "ordering",
        `${target} has max_ack_pending ${maxAckPending ?? "unset"}; sequential ordering needs 1, or the server ` +
          `delivers later messages while an earlier one waits for its redelivery (set max_ack_pending 1, ` +
          `or choose Ordering.perKey)`
      )
    }
  } else {
    const wanted = (expect.instances ?? 1) * (expect.concurrency + expect.prefetch)
    if (maxAckPending !== undefined && maxAckPending > 0 && maxAckPending < wanted) {
      add(
        "warning",
        "max_ack_pending",
        `${target} has max_ack_pending ${maxAckPending} below ${wanted} (instances x (concurrency + prefetch)): ` +
          `the server hands out at most ${maxAckPending} at once, so handlers wait; raise max_ack_pending or ` +
          `lower concurrency or prefetch`
      )
    }
  }
  return findings
}

/**
 * The checks of a consumer's declared settings against the live ones (the contract's promises);
 * the declaration stands for the config `Topology` would apply, defaults included.
 */
const declaredConsumerFindings = (
  target: string,
  live: Partial<ConsumerConfig>,
  declared: ConsumerContract,
  stream: string
): ReadonlyArray<Finding> => {
  const wanted = Topology.consumerConfig({ ...declared, stream })
  const findings: Array<Finding> = []
  const differs = (check: Check, liveText: string, wantedText: string) =>
    findings.push({
      severity: "error",
      target,
      check,
      message: `${target} has ${check} ${liveText}, the contract ${wantedText}: apply the contract ` +
        `(Topology.ensureConsumer) or change the contract to what runs`
    })
  if (live.ack_wait !== wanted.ack_wait) {
    differs("ack_wait", formatMillis(nanosToMillis(live.ack_wait)), formatMillis(nanosToMillis(wanted.ack_wait)))
  }
  if ((live.max_deliver ?? -1) !== wanted.max_deliver) differs("max_deliver", `${live.max_deliver ?? -1}`, `${wanted.max_deliver}`)
  if (live.max_ack_pending !== wanted.max_ack_pending) {
    differs("max_ack_pending", `${live.max_ack_pending ?? "unset"}`, `${wanted.max_ack_pending}`)
  }
  if ((live.filter_subject || undefined) !== wanted.filter_subject) {
    differs("filter_subject", live.filter_subject || "none", wanted.filter_subject ?? "none")
  }
  return findings
}

/**
 * The checks of a live stream against its declaration: exactly the contract's subjects (a subject
 * the contract does not list is an error: the list is closed), the same storage, replicas and
 * maximum age, the declared duplicate window, and a duplicate window that covers the producers'
 * republish horizon (outside it a republish is stored twice, which the consumer's dedup row then
 * turns into a `Duplicate`).
 */
export const streamFindings = (
  declared: Topology.StreamOptions,
  live: Partial<StreamConfig>,
  publishHorizon?: Duration.Input
): ReadonlyArray<Finding> => {
  const target = `stream ${declared.name}`
  const findings: Array<Finding> = []
  const add = (check: Check, message: string) => findings.push({ severity: "error", target, check, message })
  const liveSubjects = live.subjects ?? []
  const extra = liveSubjects.filter((subject) => !declared.subjects.includes(subject))
  const missing = declared.subjects.filter((subject) => !liveSubjects.includes(subject))
  if (extra.length > 0) {
    add("subjects", `${target} captures ${extra.join(", ")}, which the contract does not list: add them to the contract, or remove them from the stream`)
  }
  if (missing.length > 0) {
    add("subjects", `${target} does not capture ${missing.join(", ")}, which the contract lists: apply the contract (Topology.ensureStream)`)
  }
  // The declaration stands for the config `Topology` would apply, defaults included.
  const wanted = Topology.streamConfig(declared)
  if (live.storage !== undefined && live.storage !== wanted.storage) {
    add("storage", `${target} has ${live.storage} storage, the contract ${wanted.storage}: storage cannot change in place; create a new stream and move the consumers, or change the contract`)
  }
  if ((live.num_replicas ?? 1) !== wanted.num_replicas) {
    add("replicas", `${target} has ${live.num_replicas ?? 1} replicas, the contract ${wanted.num_replicas}: apply the contract or change it`)
  }
  const liveWindow = nanosToMillis(live.duplicate_window)
  if (live.duplicate_window !== wanted.duplicate_window) {
    add("duplicate_window", `${target} has a duplicate window of ${formatMillis(liveWindow)}, the contract ${formatMillis(nanosToMillis(wanted.duplicate_window))}: apply the contract or change it`)
  }
  if (publishHorizon !== undefined) {
    const horizon = Duration.toMillis(Duration.fromInputUnsafe(publishHorizon))
    if (horizon > liveWindow) {
      findings.push({
        severity: "warning",
        target,
        check: "duplicate_window",
        message: `${target} deduplicates republishes for ${formatMillis(liveWindow)}, but producers may republish for ` +
          `${formatMillis(horizon)}: a later republish is stored a second time (the consumer's dedup row makes it a ` +
          `Duplicate); widen the duplicate window or shorten the producers' retries`
      })
    }
  }
  if ((live.max_age ?? 0) !== wanted.max_age) {
    const keeps = (nanos: number | undefined) => (nanos ?? 0) === 0 ? "for ever" : `for ${formatMillis(nanosToMillis(nanos))}`
    add("max_age", `${target} keeps messages ${keeps(live.max_age)}, the contract ${keeps(wanted.max_age)}: apply the contract or change it`)
  }
  return findings
}

/**
 * Every check of `contract` against the live server: the stream, then each consumer (its
 * declared settings and the application's expectations). A missing stream or consumer is a
 * finding, not a failure; the effect fails only when the server cannot be asked.
 */
export const check = (contract: Contract): Effect.Effect<ReadonlyArray<Finding>, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const name = contract.stream.name
    const missing = (reason: NatsError.NatsError["reason"]) => (error: NatsError.NatsError) => error.reason === reason
    const stream = yield* NatsError.tryPromise(`stream info ${name}`, () => manager.streams.info(name)).pipe(
      Effect.catchIf(missing("StreamNotFound"), () => Effect.succeed(undefined))
    )
    if (stream === undefined) {
      return [{
        severity: "error",
        target: `stream ${name}`,
        check: "exists",
        message: `stream ${name} does not exist: ${contract.ownership === "service" ? "apply the contract (Topology.ensureStream)" : "ask the platform team that owns it"}`
      }] satisfies ReadonlyArray<Finding>
    }
    const findings: Array<Finding> = [...streamFindings(contract.stream, stream.config, contract.publishHorizon)]
    for (const consumer of contract.consumers) {
      const target = `consumer ${name}/${consumer.name}`
      const info = yield* NatsError.tryPromise(`consumer info ${name}/${consumer.name}`, () => manager.consumers.info(name, consumer.name)).pipe(
        Effect.catchIf(missing("ConsumerNotFound"), () => Effect.succeed(undefined))
      )
      if (info === undefined) {
        findings.push({
          severity: "error",
          target,
          check: "exists",
          message: `${target} does not exist: ${contract.ownership === "service" ? "apply the contract (Topology.ensureConsumer)" : "ask the platform team that owns it"}`
        })
        continue
      }
      findings.push(
        ...declaredConsumerFindings(target, info.config, consumer, name),
        ...consumerFindings(target, info.config, consumer.expect)
      )
    }
    return findings
  })

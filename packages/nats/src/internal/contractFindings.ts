/**
 * The checks of a live stream's and consumer's config (`Contract.consumerFindings`,
 * `Contract.streamFindings`, and the declared settings a consumer's live config must keep), each
 * difference a finding that says what to do. Kept apart from the module that gathers them from the
 * server (`Contract.check`) and checks a contract on its own, which re-exports the public names.
 */
import { AckPolicy, type ConsumerConfig, type StreamConfig } from "@nats-io/jetstream"
import { DurationInput } from "@jetworker/core"
import { Duration } from "effect"
import type { Check, ConsumerContract, Expectations, Finding } from "../Contract.ts"
import * as Topology from "../Topology.ts"

const nanosToMillis = (nanos: number | undefined): number => Math.floor((nanos ?? 0) / 1_000_000)

const formatMillis = (ms: number): string => Duration.format(Duration.millis(ms))

/**
 * The milliseconds of a contract's own duration (`option`, e.g. `maxProcessingTime`), or why it
 * is not a finite duration of 0 or more: a string that does not parse, a NaN (which effect would
 * read as 0), a negative or an infinite one, as the file form refuses them.
 */
const contractMillis = (option: string, input: Duration.Input, example: string): number | string => {
  const parsed = DurationInput.parse(input)
  const millis = parsed === undefined || !Duration.isFinite(parsed) ? Number.NaN : Duration.toMillis(parsed)
  return millis >= 0 ? millis : `${option} must be a finite duration such as "${example}", 0 or more, got ${DurationInput.show(input)}`
}

/**
 * The checks of a live consumer's config against what the application expects: explicit acks,
 * MaxDeliver above the planned attempts (so the last attempt dead-letters the message itself),
 * no server BackOff (on NATS 2.9 it replaces the engine's nak delays), full deliveries (not
 * headers only), a durable the server never deletes when idle, MaxAckPending 1 for sequential
 * ordering and at least `instances x (concurrency + prefetch)` otherwise. A `maxProcessingTime`
 * that is not a finite duration of 0 or more is an error finding naming it (and nothing is
 * compared with it).
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
  if (live.headers_only === true) {
    add(
      "error",
      "headers_only",
      `${target} delivers headers only, without the payload: every handler would see an empty message; ` +
        `update the consumer with headers_only false (it keeps its position)`
    )
  }
  if ((live.inactive_threshold ?? 0) > 0) {
    // A durable's position is the only record of what was processed: the server deleting it when
    // no instance pulls for a while (a long deploy, a paused worker) loses or replays work.
    add(
      "error",
      "inactive_threshold",
      `${target} has inactive_threshold ${Topology.formatNanos(live.inactive_threshold)}: the server deletes the ` +
        `durable and its position once no instance pulls for that long; update the consumer with inactive_threshold 0`
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
  const backoff = live.backoff ?? []
  if (backoff.length > 0) {
    // On 2.9 the stored AckWait already is backoff[0]; a nak(delay) at delivery n is redelivered
    // after backoff[n-1] - AckWait + delay instead of after delay.
    add(
      "warning",
      "backoff",
      `${target} has a server backoff (${backoff.map(Topology.formatNanos).join(", ")}); on NATS 2.9 it replaces AckWait ` +
        `by its first delay and distorts the engine's nak delays (a nak after delivery n waits backoff[n] - AckWait + ` +
        `the delay): remove it from the consumer (the retry policy sets the delays), or accept longer retry delays`
    )
    // The server refuses a backoff without a MaxDeliver above its length (newer servers take -1).
    if (maxDeliver !== -1 && maxDeliver <= backoff.length) {
      add(
        "error",
        "backoff",
        `${target} has max_deliver ${maxDeliver} with ${backoff.length} backoff delays; the server requires max_deliver ` +
          `above the number of delays: raise max_deliver or shorten the backoff`
      )
    }
  }
  const ackWait = nanosToMillis(live.ack_wait ?? 30_000_000_000)
  const processing = contractMillis("maxProcessingTime", expect.maxProcessingTime ?? "30 seconds", "30 seconds")
  if (typeof processing === "string") {
    add("error", "processing_time", `${target}: ${processing}`)
  } else if (ackWait < processing) {
    const idempotent = expect.idempotent ?? true
    add(
      idempotent ? "warning" : "error",
      "processing_time",
      `${target} has AckWait ${formatMillis(ackWait)}${backoff.length > 0 ? " (its first backoff delay)" : ""}, shorter ` +
        `than an attempt may run (${formatMillis(processing)}): such an attempt keeps its message only while the ` +
        `engine's extensions arrive, and a pause longer than AckWait (GC, a stopped process, a broker failover) hands ` +
        `it to another instance while it still runs` +
        (idempotent
          ? "; the handler is idempotent, so the second run ends Duplicate: raise AckWait to remove the risk"
          : "; the handler is not idempotent, so both may perform the effect: raise AckWait above the processing time, " +
            "or make the handler idempotent (IdempotencyStore.commit)")
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
 * The checks of a consumer's declared settings against the live ones (the contract's promises):
 * every setting `Topology` would update is an error. The ack policy is left to
 * {@link consumerFindings}, which checks it for every consumer, declared or not.
 */
export const declaredConsumerFindings = (
  target: string,
  live: ConsumerConfig,
  declared: ConsumerContract,
  stream: string
): ReadonlyArray<Finding> =>
  Topology.consumerChanges({ ...declared, stream }, live).flatMap((change): ReadonlyArray<Finding> =>
    change.action === "update"
      ? [{
        severity: "error",
        target,
        check: change.setting as Check,
        message: `${target} has ${change.setting} ${change.live}, the contract ${change.wanted}: apply the contract ` +
          `(jetworker contract apply) or change the contract to what runs`
      }]
      : change.action === "refuse" && change.setting === "filter_subject"
      ? [{ severity: "error", target, check: "filter_subject", message: change.message }]
      : []
  )

/**
 * The checks of a live stream against its declaration: exactly the contract's subjects (a subject
 * the contract does not list is an error: the list is closed), the same storage, replicas and
 * maximum age, the declared limits (bytes, messages, discard policy; only when declared, as
 * `Topology` applies them), the declared duplicate window, and a duplicate window that covers the producers'
 * republish horizon (outside it a republish is stored twice, which the consumer's dedup row then
 * turns into a `Duplicate`). A `publishHorizon` that is not a finite duration of 0 or more is an
 * error finding naming it.
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
  // In "add" mode the stream is shared: other subjects are allowed, and a declared subject is
  // there when a live one captures it (that is all `Topology` ensures).
  const shared = declared.subjectsMode === "add"
  const extra = shared ? [] : liveSubjects.filter((subject) => !declared.subjects.includes(subject))
  const missing = declared.subjects.filter((subject) =>
    shared ? !liveSubjects.some((pattern) => Topology.captures(pattern, subject)) : !liveSubjects.includes(subject)
  )
  if (extra.length > 0) {
    add("subjects", `${target} captures ${extra.join(", ")}, which the contract does not list: add them to the contract, or remove them from the stream`)
  }
  if (missing.length > 0) {
    add("subjects", `${target} does not capture ${missing.join(", ")}, which the contract lists: apply the contract (jetworker contract apply)`)
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
  const horizon = publishHorizon === undefined ? undefined : contractMillis("publishHorizon", publishHorizon, "1 minute")
  if (typeof horizon === "string") {
    add("duplicate_window", `${target}: ${horizon}`)
  } else if (horizon !== undefined && horizon > liveWindow) {
    findings.push({
      severity: "warning",
      target,
      check: "duplicate_window",
      message: `${target} deduplicates republishes for ${formatMillis(liveWindow)}, but producers may republish for ` +
        `${formatMillis(horizon)}: a later republish is stored a second time (the consumer's dedup row makes it a ` +
        `Duplicate); widen the duplicate window or shorten the producers' retries`
    })
  }
  if ((live.max_age ?? 0) !== wanted.max_age) {
    const keeps = (nanos: number | undefined) => (nanos ?? 0) === 0 ? "for ever" : `for ${formatMillis(nanosToMillis(nanos))}`
    add("max_age", `${target} keeps messages ${keeps(live.max_age)}, the contract ${keeps(wanted.max_age)}: apply the contract or change it`)
  }
  // A smaller limit or "old" discard drops unprocessed messages silently.
  const limit = (n: number | undefined) => (n ?? -1) === -1 ? "no limit" : `${n}`
  if (declared.maxBytes !== undefined && (live.max_bytes ?? -1) !== wanted.max_bytes) {
    add("max_bytes", `${target} has max_bytes ${limit(live.max_bytes)}, the contract ${limit(wanted.max_bytes)}: apply the contract or change it`)
  }
  if (declared.maxMessages !== undefined && (live.max_msgs ?? -1) !== wanted.max_msgs) {
    add("max_msgs", `${target} has max_msgs ${limit(live.max_msgs)}, the contract ${limit(wanted.max_msgs)}: apply the contract or change it`)
  }
  if (declared.discard !== undefined && (live.discard ?? "old") !== wanted.discard) {
    add(
      "discard",
      `${target} discards ${live.discard ?? "old"} messages at its limits, the contract ${wanted.discard}: apply the contract or change it`
    )
  }
  return findings
}

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
import { DEFAULT_PULL_EXPIRES_MILLIS, MAX_TIMER_MILLIS, MIN_PULL_EXPIRES_MILLIS } from "./sourceSettings.ts"
import { retentionProblem } from "./topologyDeclarations.ts"

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
 * ordering and at least `instances x (concurrency + prefetch)` otherwise, and limits on pull
 * requests the intake's pulls fit in (`max_batch` at least `prefetch`, `max_expires` at least
 * `pullExpires`, `max_waiting` room for every instance's pulls). A `maxProcessingTime` that is not
 * a finite duration of 0 or more, or a `pullExpires` outside 1 second to 2147483647 ms, is an error
 * finding naming it (and nothing is compared with it).
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
  if ((live.deliver_subject ?? "") !== "") {
    // Checked here, not only by the contract: a source opening on a push consumer would fail at its
    // first pull ("not a pull consumer") instead of saying what to do.
    add(
      "error",
      "deliver_subject",
      `${target} is a push consumer (deliver_subject ${live.deliver_subject}): jetworker pulls, and nats.js cannot ` +
        `pull from a push consumer; it cannot change in place, so delete the consumer and declare it again as a pull ` +
        `consumer (Topology.ensureConsumer, or \`nats consumer add --pull\`)`
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
  pullLimitFindings(target, live, expect, add)
  return findings
}


/**
 * The most pulls one intake keeps waiting on the server at once: a pull asks for the free room once
 * that is a quarter of `prefetch`, and nats-server 2.9 fills waiting pulls in turn, one message each,
 * so several may wait (an exhaustive search of the intake's rule found at most 7 for prefetch 16,
 * 8 up to prefetch 32); never more than `prefetch`, as each asks for one message at least.
 * (The rule is internal/pulls.ts's `pump`: if it changes how it sizes its pulls, this changes with it.)
 */
const pullsWaitingAtMost = (prefetch: number): number => Math.max(1, Math.min(prefetch, 8))

/**
 * The checks of a pull consumer's limits on pull requests against the intake's pulls (`{ batch: up
 * to prefetch, expires: pullExpires }`, no `max_bytes`). nats-server 2.9 answers a pull above
 * `max_batch` or `max_expires` with `409 Exceeded MaxRequestBatch of 4` / `409 Exceeded
 * MaxRequestExpires of 1s`, which ends the intake (`ContractMismatch`): errors. A pull beyond
 * `max_waiting` gets `409 Exceeded MaxWaiting`, after which the intake pauses and pulls again: a
 * warning. `max_bytes` only refuses pulls that set a larger `max_bytes`, which the intake never
 * does: not checked.
 */
const pullLimitFindings = (
  target: string,
  live: Partial<ConsumerConfig>,
  expect: Expectations,
  add: (severity: Finding["severity"], check: Check, message: string) => void
): void => {
  const maxBatch = live.max_batch ?? 0
  if (maxBatch > 0 && maxBatch < expect.prefetch) {
    add(
      "error",
      "max_batch",
      `${target} has max_batch ${maxBatch}, below the intake's largest pull (prefetch ${expect.prefetch}): the server ` +
        `refuses such a pull (409 Exceeded MaxRequestBatch of ${maxBatch}) and the intake stops with ContractMismatch: ` +
        `update the consumer with max_batch 0 (no limit) or at least ${expect.prefetch}, or lower prefetch to ${maxBatch}`
    )
  }
  const expires = contractMillis("pullExpires", expect.pullExpires ?? Duration.millis(DEFAULT_PULL_EXPIRES_MILLIS), "30 seconds")
  if (typeof expires === "string" || expires < MIN_PULL_EXPIRES_MILLIS || expires > MAX_TIMER_MILLIS) {
    add(
      "error",
      "max_expires",
      `${target}: pullExpires must be a duration from 1 second to ${MAX_TIMER_MILLIS} ms (JetStreamSource ` +
        `refuses others), got ${DurationInput.show(expect.pullExpires)}`
    )
  } else {
    const maxExpires = live.max_expires ?? 0
    // The intake sends its expiry in nanoseconds; the server refuses a pull only above the limit.
    if (maxExpires > 0 && maxExpires < Math.round(expires * 1_000_000)) {
      const limit = Topology.formatNanos(maxExpires)
      add(
        "error",
        "max_expires",
        `${target} has max_expires ${limit}, shorter than the intake's pulls wait (${formatMillis(expires)}, pullExpires): ` +
          `the server refuses each pull (409 Exceeded MaxRequestExpires of ${limit}) and the intake stops with ` +
          `ContractMismatch: update the consumer with max_expires 0 (no limit) or at least ${formatMillis(expires)}` +
          // The intake's pulls wait 1 second at least.
          (maxExpires >= MIN_PULL_EXPIRES_MILLIS * 1_000_000 ? `, or lower pullExpires to ${limit}` : "")
      )
    }
  }
  const maxWaiting = live.max_waiting ?? 0
  const instances = expect.instances ?? 1
  const waiting = instances * pullsWaitingAtMost(expect.prefetch)
  if (maxWaiting > 0 && maxWaiting < waiting) {
    add(
      "warning",
      "max_waiting",
      `${target} has max_waiting ${maxWaiting}, below the ${waiting} pulls ${instances} ${instances === 1 ? "instance" : "instances"} ` +
        `of the intake may keep waiting (prefetch ${expect.prefetch}): the server refuses the pulls beyond it (409 Exceeded ` +
        `MaxWaiting) and the intake pauses before pulling again, so handlers wait (an instance may find no room for a ` +
        `pull for a while): max_waiting cannot change in place, so delete the consumer and declare it again with ` +
        `max_waiting at least ${waiting} (the server's default is 512), or lower prefetch or the instances`
    )
  }
}

/**
 * The checks of a consumer's declared settings against the live ones (the contract's promises):
 * every setting `Topology` would update is an error, and so is a filter it refuses to change (on
 * `serverVersion`, the server's version, for a filter change the server would apply by stopping
 * the consumer). The ack policy is left to {@link consumerFindings}, which checks it for every
 * consumer, declared or not.
 */
export const declaredConsumerFindings = (
  target: string,
  live: ConsumerConfig,
  declared: ConsumerContract,
  stream: string,
  serverVersion: string | undefined
): ReadonlyArray<Finding> =>
  Topology.consumerChanges({ ...declared, stream }, live, serverVersion).flatMap((change): ReadonlyArray<Finding> =>
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
 * the contract does not list is an error: the list is closed), the same storage, retention (left
 * out: limits, which jetworker relies on), replicas and maximum age, the declared limits (bytes,
 * messages, discard policy; only when declared, as `Topology` applies them), the declared
 * duplicate window, and a duplicate window that covers the producers' republish horizon (outside
 * it a republish is stored twice, which the consumer's dedup row then turns into a `Duplicate`). A `publishHorizon` that is not a finite duration of 0 or more is an
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
  const retention = retentionProblem(declared, live.retention)
  if (retention !== undefined) add("retention", retention.message)
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

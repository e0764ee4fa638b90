/**
 * What a `Topology` declaration stands for on the server: the config it builds
 * (`streamConfig`, `consumerConfig`), and the values the server would not keep or would refuse as
 * declared (`streamProblems`, `consumerProblems`, `filterProblems`). Kept apart from the
 * module that compares and applies declarations, which re-exports the public names.
 */
import {
  AckPolicy,
  type ConsumerConfig,
  DeliverPolicy,
  DiscardPolicy,
  RetentionPolicy,
  type StreamConfig,
  StorageType
} from "@nats-io/jetstream"
import { nanos } from "@nats-io/transport-node"
import { DurationInput } from "@jetworker/core"
import { Duration } from "effect"
import type { ConsumerOptions, StreamOptions } from "../Topology.ts"

/** A declared value the server would not keep: the setting (the server's name) and why. */
export interface Problem {
  readonly setting: string
  readonly message: string
}

/**
 * The milliseconds of `input`, or `undefined` when it is not a finite duration (a string that does
 * not parse, a NaN anywhere in it, which effect would read as 0, or an infinite one).
 */
const finiteMillis = (input: Duration.Input): number | undefined => {
  const parsed = DurationInput.parse(input)
  return parsed === undefined || !Duration.isFinite(parsed) ? undefined : Duration.toMillis(parsed)
}

/** A positive count, or -1 for none (the server stores -1 for a 0, so a 0 would never converge). */
const isLimit = (n: number): boolean => Number.isSafeInteger(n) && (n >= 1 || n === -1)

/**
 * The values of a stream declaration the server would not keep as declared: for a 0 it stores its
 * default (a 2-minute duplicate window, no limit, 1 replica), so `ensureStream` would update it on
 * every run and `Contract.check` report drift for ever. Empty: the declaration can be applied.
 */
export const streamProblems = (options: StreamOptions): ReadonlyArray<Problem> => {
  const problems: Array<Problem> = []
  const add = (setting: string, message: string) => problems.push({ setting, message })
  if (options.duplicateWindow !== undefined && !((finiteMillis(options.duplicateWindow) ?? 0) > 0)) {
    // JetStream cannot turn deduplication off: a 0 window is its default, 2 minutes.
    add(
      "duplicate_window",
      `duplicateWindow must be a positive duration (the server replaces 0 by 2 minutes; deduplication cannot be ` +
        `turned off), got ${DurationInput.show(options.duplicateWindow)}`
    )
  }
  if (options.maxAge !== undefined && !((finiteMillis(options.maxAge) ?? -1) >= 0)) {
    add("max_age", `maxAge must be a finite duration, 0 for no age limit, got ${DurationInput.show(options.maxAge)}`)
  }
  if (options.maxBytes !== undefined && !isLimit(options.maxBytes)) {
    add("max_bytes", `maxBytes must be a positive integer, or -1 for none (the server stores -1 for 0), got ${options.maxBytes}`)
  }
  if (options.maxMessages !== undefined && !isLimit(options.maxMessages)) {
    add("max_msgs", `maxMessages must be a positive integer, or -1 for none (the server stores -1 for 0), got ${options.maxMessages}`)
  }
  if (options.replicas !== undefined && !(Number.isSafeInteger(options.replicas) && options.replicas >= 1)) {
    add("num_replicas", `replicas must be an integer of at least 1 (the server stores 1 for 0), got ${options.replicas}`)
  }
  return problems
}

/**
 * The values of a consumer declaration the server would not keep as declared (it stores its
 * default for a 0: AckWait 30 seconds, MaxAckPending 1000, MaxDeliver -1), so `ensureConsumer`
 * would update it on every run and `Contract.check` report drift for ever. Empty: the
 * declaration can be applied.
 */
export const consumerProblems = (options: ConsumerOptions): ReadonlyArray<Problem> => {
  const problems: Array<Problem> = []
  const add = (setting: string, message: string) => problems.push({ setting, message })
  if (options.ackWait !== undefined && !((finiteMillis(options.ackWait) ?? 0) > 0)) {
    add("ack_wait", `ackWait must be a positive duration (the server replaces 0 by 30 seconds), got ${DurationInput.show(options.ackWait)}`)
  }
  if (options.maxDeliver !== undefined && !isLimit(options.maxDeliver)) {
    add("max_deliver", `maxDeliver must be a positive integer, or -1 for none (the server stores -1 for 0), got ${options.maxDeliver}`)
  }
  if (options.maxAckPending !== undefined && !isLimit(options.maxAckPending)) {
    add(
      "max_ack_pending",
      `maxAckPending must be a positive integer, or -1 for none (the server replaces 0 by 1000), got ${options.maxAckPending}`
    )
  }
  if ((options.backoff ?? []).some((delay) => !((finiteMillis(delay) ?? 0) > 0))) {
    // The first delay becomes AckWait, which the server does not keep at 0.
    add("backoff", `every backoff delay must be a positive duration, got ${DurationInput.show(options.backoff)}`)
  }
  return problems
}

/**
 * `input` (or `fallback`) in nanoseconds. Never throws: a value that is not a finite duration of 0
 * or more stands as 0, the server's "default"; the problem functions report it, and every effect
 * here refuses such a declaration before it builds a config.
 */
const ns = (input: Duration.Input | undefined, fallback: Duration.Input): number => {
  const millis = finiteMillis(input ?? fallback)
  return millis === undefined || !(millis >= 0) ? 0 : nanos(millis)
}

/** The server's duplicate window when none is declared: 2 minutes. */
const defaultWindowMillis = 120_000

/**
 * The duplicate window of a declaration: the declared one, else 2 minutes or a shorter positive
 * `maxAge` (nats-server's own default, so the live stream keeps what is declared; a 2-minute window
 * with a shorter max age is refused by the server).
 */
const windowNanos = (options: StreamOptions): number => {
  if (options.duplicateWindow !== undefined) return ns(options.duplicateWindow, 0)
  const maxAge = options.maxAge === undefined ? undefined : finiteMillis(options.maxAge)
  return ns(maxAge !== undefined && maxAge > 0 ? Math.min(defaultWindowMillis, maxAge) : defaultWindowMillis, 0)
}

/**
 * A declared duplicate window longer than the declared max age, which the server refuses ("duplicates
 * window can not be larger then max age"). Kept out of {@link streamProblems}, whose callers
 * (`Contract.validate`) report this case on their own.
 */
export const windowProblem = (options: StreamOptions): Problem | undefined => {
  if (options.duplicateWindow === undefined || options.maxAge === undefined) return undefined
  const window = finiteMillis(options.duplicateWindow)
  const maxAge = finiteMillis(options.maxAge)
  if (window === undefined || maxAge === undefined || !(maxAge > 0) || !(window > maxAge)) return undefined
  return {
    setting: "duplicate_window",
    message: `duplicateWindow must not be longer than maxAge (the server refuses it): shorten the window, or leave it ` +
      `out (it then defaults to the shorter of 2 minutes and maxAge), got duplicateWindow ` +
      `${formatNanos(ns(options.duplicateWindow, 0))} and maxAge ${formatNanos(ns(options.maxAge, 0))}`
  }
}

/** A nanosecond duration as text (`30s`, `2m`; `0` for none). */
export const formatNanos = (value: number | undefined): string =>
  (value ?? 0) === 0 ? "0" : Duration.format(Duration.millis(Math.floor((value ?? 0) / 1_000_000)))

const RETENTION: Record<NonNullable<StreamOptions["retention"]>, RetentionPolicy> = {
  limits: RetentionPolicy.Limits,
  interest: RetentionPolicy.Interest,
  workqueue: RetentionPolicy.Workqueue
}

/** What a live retention other than limits does to a jetworker consumer. */
const RETENTION_EFFECT: Partial<Record<string, string>> = {
  workqueue: "the server deletes each message once it is acked or terminated (dead-lettered) and refuses a " +
    "second consumer (\"multiple non-filtered consumers not allowed on workqueue stream\"); ",
  interest: "the server deletes each message once every consumer acked it and does not store what is published " +
    "while no consumer exists; "
}

/**
 * A live stream's retention (`live`; absent: limits) that is not the declared one, or `"limits"`
 * when the declaration leaves it out (jetworker relies on messages staying after their ack), with
 * what it does and what to do: retention cannot change in place on nats-server 2.9 (it answers
 * 10052). `undefined`: they agree.
 */
export const retentionProblem = (options: StreamOptions, live: string | undefined): Problem | undefined => {
  const have = live ?? RetentionPolicy.Limits
  const wanted = RETENTION[options.retention ?? "limits"]
  if (have === wanted) return undefined
  return {
    setting: "retention",
    message: `stream ${options.name} exists with retention ${have}, the declaration ${wanted}` +
      `${options.retention === undefined ? " (the default)" : ""}; ${RETENTION_EFFECT[have] ?? ""}retention cannot ` +
      `change in place (nats-server 2.9): declare retention: "${have}" if the stream is meant to work so, or create a ` +
      `new stream with retention ${wanted} and move the publishers and consumers to it`
  }
}

/**
 * The server config a stream declaration stands for. Check it with {@link streamProblems} first
 * (`ensureStream` does): a duration that is not a finite one of 0 or more (a string that does not
 * parse, NaN, negative, infinite) stands as 0 here, which the server would replace by its default.
 */
export const streamConfig = (options: StreamOptions): Partial<StreamConfig> & { name: string } => ({
  name: options.name,
  subjects: [...options.subjects],
  storage: options.storage === "memory" ? StorageType.Memory : StorageType.File,
  retention: RETENTION[options.retention ?? "limits"],
  duplicate_window: windowNanos(options),
  max_age: ns(options.maxAge, 0),
  max_bytes: options.maxBytes ?? -1,
  max_msgs: options.maxMessages ?? -1,
  discard: options.discard === "new" ? DiscardPolicy.New : DiscardPolicy.Old,
  num_replicas: options.replicas ?? 1
})

/**
 * Whether subject filter `pattern` captures every subject `subject` can match (NATS wildcards:
 * `*` one token, `>` one or more trailing tokens); for a concrete `subject`, whether it matches.
 */
export const captures = (pattern: string, subject: string): boolean => {
  const p = pattern.split(".")
  const s = subject.split(".")
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">") return s.length > i
    if (i >= s.length) return false
    if (p[i] === "*" ? s[i] === ">" : p[i] !== s[i]) return false
  }
  return p.length === s.length
}

/**
 * The server config a consumer declaration stands for, as the server stores it: with a backoff,
 * AckWait is `backoff[0]` (NATS 2.9 replaces the declared AckWait by it). Check it with
 * {@link consumerProblems} first (`ensureConsumer` does): a duration that is not a finite one of
 * 0 or more stands as 0 here, as in {@link streamConfig}.
 */
export const consumerConfig = (options: ConsumerOptions): Partial<ConsumerConfig> => {
  const backoff = (options.backoff ?? []).map((delay) => ns(delay, 0))
  return {
    durable_name: options.name,
    ack_policy: AckPolicy.Explicit,
    ack_wait: backoff.length > 0 ? backoff[0]! : ns(options.ackWait, "30 seconds"),
    max_deliver: options.maxDeliver ?? -1,
    max_ack_pending: options.maxAckPending ?? 1000,
    deliver_policy: options.deliverPolicy === "new" ? DeliverPolicy.New : DeliverPolicy.All,
    ...filters(options),
    ...(backoff.length === 0 ? {} : { backoff })
  }
}

/** The filter fields of a declaration: one subject as `filter_subject` (every server has it). */
const filters = (options: ConsumerOptions): Pick<ConsumerConfig, "filter_subject" | "filter_subjects"> => {
  const subjects = options.filterSubjects ?? (options.filterSubject === undefined ? [] : [options.filterSubject])
  if (subjects.length === 0) return {}
  return subjects.length === 1 ? { filter_subject: subjects[0]! } : { filter_subjects: [...subjects] }
}

/**
 * The filters of a consumer declaration that the stream's subjects (`streamSubjects`, as live or
 * declared) do not allow, which the server refuses ("consumer filter subject is not a valid
 * subset"): a filter must lie inside one of them, or be a wildcard wider than one (`>` is taken).
 * Empty: the filters fit, or the stream has no subjects of its own (a mirror or sourced stream).
 */
export const filterProblems = (options: ConsumerOptions, streamSubjects: ReadonlyArray<string>): ReadonlyArray<Problem> => {
  if (streamSubjects.length === 0) return []
  const option = options.filterSubjects === undefined ? "filterSubject" : "filterSubjects"
  const outside = (options.filterSubjects ?? (options.filterSubject === undefined ? [] : [options.filterSubject])).filter((filter) =>
    !streamSubjects.some((subject) => captures(subject, filter) || captures(filter, subject))
  )
  return outside.map((filter) => ({
    setting: "filter_subject",
    message: `${option} ${JSON.stringify(filter)} is outside the subjects of stream ${options.stream} ` +
      `(${streamSubjects.join(", ")}), so the server would refuse it: filter on a subject the stream captures, or add ` +
      `the subject to the stream`
  }))
}

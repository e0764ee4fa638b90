/**
 * Declares streams and durable pull consumers on the server: creates them when missing and
 * brings their mutable settings to what is declared when they differ. Options are camelCase
 * durations and counts; the snake_case nanosecond config of JetStream stays inside this module.
 * It refuses (typed error) to change what the server cannot change in place, such as a stream's
 * storage or a consumer's ack policy. {@link streamChanges} and {@link consumerChanges} say what
 * `ensure*` would do without doing it (`Contract.plan` and `Contract.apply` build on them). For a
 * consumer owned by a platform team, skip this and let the source (or `Contract.check`) check the
 * live config instead.
 *
 * @since 0.1.0
 */
import {
  AckPolicy,
  type ConsumerConfig,
  type ConsumerInfo,
  DeliverPolicy,
  DiscardPolicy,
  type StreamConfig,
  type StreamInfo,
  StorageType
} from "@nats-io/jetstream"
import { nanos } from "@nats-io/transport-node"
import { DurationInput } from "@jetworker/core"
import { Duration, Effect } from "effect"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"

/**
 * A stream declaration. The defaults below are what a new stream gets; on an existing stream a
 * setting left out keeps its live value (see {@link streamChanges}).
 */
export interface StreamOptions {
  /** Stream name: letters, digits, `_` and `-`. */
  readonly name: string
  /** The subjects it captures. */
  readonly subjects: ReadonlyArray<string>
  /**
   * How `subjects` is applied to an existing stream. `"exact"`: the live subjects become exactly
   * the declared ones (for a stream this declaration owns). `"add"`: declared subjects that no
   * live subject already captures are added, and no live subject is ever removed (for a stream
   * shared with other declarations or operators, such as a shared dead-letter stream).
   * Default: `"exact"`.
   */
  readonly subjectsMode?: "exact" | "add" | undefined
  /** Default: `"file"`. */
  readonly storage?: "file" | "memory" | undefined
  /**
   * `Nats-Msg-Id` deduplication window; must cover the producers' republish horizon, and be no
   * longer than `maxAge` (the server refuses that). Default: 2 minutes, or `maxAge` when that is
   * shorter (as nats-server itself does).
   */
  readonly duplicateWindow?: Duration.Input | undefined
  /** Oldest message kept. Default: 0 (no age limit). */
  readonly maxAge?: Duration.Input | undefined
  /** Size limit in bytes; -1 for none. Default: -1. */
  readonly maxBytes?: number | undefined
  /** Message count limit; -1 for none. Default: -1. */
  readonly maxMessages?: number | undefined
  /** What happens at a limit: drop the oldest, or refuse new messages. Default: `"old"`. */
  readonly discard?: "old" | "new" | undefined
  /** Replicas in a cluster. Default: 1 for a new stream; left out, an existing stream keeps its own. */
  readonly replicas?: number | undefined
}

/** A durable pull consumer declaration (explicit acks). */
export interface ConsumerOptions {
  readonly stream: string
  /** Durable name: letters, digits, `_` and `-`. */
  readonly name: string
  /** The lease on each delivery. Default: 30 seconds. */
  readonly ackWait?: Duration.Input | undefined
  /** Deliveries before the server gives up; -1 for no limit. Must exceed the retry policy's attempts. Default: -1. */
  readonly maxDeliver?: number | undefined
  /** Unacked deliveries outstanding across all instances. Default: 1000. */
  readonly maxAckPending?: number | undefined
  /**
   * Only messages on this subject: inside one of the stream's subjects, or a wildcard wider than
   * one (the server refuses any other; `ensureConsumer` refuses it before sending).
   */
  readonly filterSubject?: string | undefined
  /**
   * Only messages on these subjects (instead of `filterSubject`). Several subjects need NATS 2.10
   * or later: on an older server the declaration is refused before anything is sent (one
   * subject is declared as `filterSubject`, which every server has).
   */
  readonly filterSubjects?: ReadonlyArray<string> | undefined
  /** Where a new consumer starts. Default: `"all"`. */
  readonly deliverPolicy?: "all" | "new" | undefined
  /**
   * The server's redelivery delays after an unacked delivery (one per delivery, the last
   * repeated). On NATS 2.9 the server then stores AckWait = `backoff[0]`, requires `maxDeliver`
   * above the number of delays, and distorts the engine's `nak(delay)`: leave it out unless a
   * platform team requires it (the retry policy sets jetworker's delays). Default: none.
   */
  readonly backoff?: ReadonlyArray<Duration.Input> | undefined
}

/** One difference between a declaration and the server, and what `ensure*` does about it. */
export interface Change {
  /** `stream ORDERS` or `consumer ORDERS/order-shipping`. */
  readonly target: string
  /** `create`: it does not exist; `update`: a mutable setting differs; `refuse`: a setting that cannot change in place differs. */
  readonly action: "create" | "update" | "refuse"
  /** The server's name of the setting (`ack_wait`, `subjects`); `"*"` for a create. */
  readonly setting: string
  /** The live value, as text (`-` for a create). */
  readonly live: string
  /** The declared value, as text. */
  readonly wanted: string
  /** What happens, or for a refusal what to do instead. */
  readonly message: string
}

const NAME = /^[A-Za-z0-9_-]{1,200}$/

/** Whether `name` is a valid stream or durable consumer name: 1 to 200 letters, digits, `_` and `-`. */
export const isValidName = (name: string): boolean => NAME.test(name)

const invalid = (operation: string, message: string) =>
  new NatsError.NatsError({ reason: "ApiError", operation, message })

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
const windowProblem = (options: StreamOptions): Problem | undefined => {
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

const sameList = (a: ReadonlyArray<unknown> | undefined, b: ReadonlyArray<unknown> | undefined): boolean =>
  JSON.stringify([...(a ?? [])].sort()) === JSON.stringify([...(b ?? [])].sort())

const call = NatsError.tryPromise

/**
 * The server config a stream declaration stands for. Check it with {@link streamProblems} first
 * (`ensureStream` does): a duration that is not a finite one of 0 or more (a string that does not
 * parse, NaN, negative, infinite) stands as 0 here, which the server would replace by its default.
 */
export const streamConfig = (options: StreamOptions): Partial<StreamConfig> & { name: string } => ({
  name: options.name,
  subjects: [...options.subjects],
  storage: options.storage === "memory" ? StorageType.Memory : StorageType.File,
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
 * The subjects an existing stream should have: the declared ones (`"exact"`), or the live ones
 * plus each declared subject that no live one captures (`"add"`; the server refuses overlapping
 * subjects in one stream, so a covered subject must not be added).
 */
const wantedSubjects = (options: StreamOptions, live: ReadonlyArray<string>): Array<string> =>
  options.subjectsMode === "add"
    ? [...live, ...options.subjects.filter((subject) => !live.some((pattern) => captures(pattern, subject)))]
    : [...options.subjects]

/**
 * What {@link ensureStream} would do to the live stream (`undefined`: none exists): nothing (an
 * empty list), create it, update the settings listed, or refuse a change of storage. It compares
 * {@link streamConfig}, but only the settings the declaration gives (and its subjects): a stream's
 * replicas, age, duplicate window, storage or limits that an operator or platform set and the
 * declaration leaves out stay as they are. One exception: a live duplicate window longer than a
 * declared max age comes down to the default window (the server refuses the pair). A declaration
 * with {@link streamProblems} is refused by `ensureStream` whatever this says.
 */
export const streamChanges = (options: StreamOptions, live: StreamConfig | undefined): ReadonlyArray<Change> => {
  const target = `stream ${options.name}`
  const wanted = streamConfig(options)
  if (live === undefined) {
    return [{ target, action: "create", setting: "*", live: "-", wanted: wanted.subjects!.join(", "), message: `create ${target}` }]
  }
  if (options.storage !== undefined && live.storage !== wanted.storage) {
    return [{
      target,
      action: "refuse",
      setting: "storage",
      live: live.storage,
      wanted: wanted.storage!,
      message: `${target} exists with storage ${live.storage}; it cannot change in place: declare storage ` +
        `"${live.storage}" (keep the stream), or create a new stream with the other storage and move the consumers to it`
    }]
  }
  const changes: Array<Change> = []
  const update = (setting: string, liveText: string, wantedText: string) =>
    changes.push({ target, action: "update", setting, live: liveText, wanted: wantedText, message: `set ${setting} of ${target} to ${wantedText} (now ${liveText})` })
  const subjects = wantedSubjects(options, live.subjects)
  if (!sameList(live.subjects, subjects)) update("subjects", live.subjects.join(", "), subjects.join(", "))
  // Settings are compared only when declared: a platform's replicas, retention, disk or count cap
  // on a stream the declaration leaves them out of stays as it is (a worker ensuring its
  // dead-letter stream shrank an operator's 3 replicas to 1).
  const windowTooLong = options.maxAge !== undefined && wanted.max_age! > 0 && live.duplicate_window > wanted.max_age!
  if ((options.duplicateWindow !== undefined || windowTooLong) && live.duplicate_window !== wanted.duplicate_window) {
    update("duplicate_window", formatNanos(live.duplicate_window), formatNanos(wanted.duplicate_window))
  }
  if (options.maxAge !== undefined && live.max_age !== wanted.max_age) update("max_age", formatNanos(live.max_age), formatNanos(wanted.max_age))
  if (options.maxBytes !== undefined && live.max_bytes !== wanted.max_bytes) update("max_bytes", `${live.max_bytes}`, `${wanted.max_bytes}`)
  if (options.maxMessages !== undefined && live.max_msgs !== wanted.max_msgs) update("max_msgs", `${live.max_msgs}`, `${wanted.max_msgs}`)
  if (options.discard !== undefined && live.discard !== wanted.discard) update("discard", `${live.discard}`, `${wanted.discard}`)
  if (options.replicas !== undefined && live.num_replicas !== wanted.num_replicas) {
    update("num_replicas", `${live.num_replicas}`, `${wanted.num_replicas}`)
  }
  return changes
}

/**
 * Creates the stream, or updates its mutable settings to the declaration (its subjects as
 * `subjectsMode` says; settings the declaration does not cover are left as they are, see
 * {@link streamChanges}). Returns the live info. What the server would not keep
 * ({@link streamProblems}) or would refuse (a declared duplicate window longer than the max age)
 * is refused before anything is sent. Changing a live stream is logged at WARN (`stream <name>
 * reconfigured: ...`, each setting with its old and new value): an operator must see a worker
 * change a stream it shares with others.
 */
export const ensureStream = (options: StreamOptions): Effect.Effect<StreamInfo, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const operation = `ensure stream ${options.name}`
    if (!NAME.test(options.name)) return yield* invalid(operation, `invalid stream name ${JSON.stringify(options.name)}`)
    if (options.subjects.length === 0) return yield* invalid(operation, "a stream needs at least one subject")
    const window = windowProblem(options)
    const problems = [...streamProblems(options), ...(window === undefined ? [] : [window])]
    if (problems.length > 0) return yield* invalid(operation, problems.map((problem) => problem.message).join("; "))
    const { manager } = yield* NatsConnection
    const wanted = streamConfig(options)
    const existing = yield* call(operation, () => manager.streams.info(options.name)).pipe(
      Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed(undefined))
    )
    if (existing === undefined) return yield* call(operation, () => manager.streams.add(wanted))
    const changes = streamChanges(options, existing.config)
    const refused = changes.find((change) => change.action === "refuse")
    if (refused !== undefined) return yield* invalid(operation, refused.message)
    if (changes.length === 0) return existing
    // Only the settings that change are sent: the others keep their live values (nats.js sends
    // the live config with these changes).
    const changed = new Set(changes.map((change) => change.setting))
    const pick = <K extends keyof StreamConfig>(key: K) => changed.has(key) ? { [key]: wanted[key] } : {}
    const updated = yield* call(operation, () =>
      manager.streams.update(options.name, {
        ...pick("duplicate_window"),
        ...pick("max_age"),
        ...pick("max_bytes"),
        ...pick("max_msgs"),
        ...pick("discard"),
        ...pick("num_replicas"),
        subjects: wantedSubjects(options, existing.config.subjects)
      }))
    yield* Effect.logWarning(`stream ${options.name} reconfigured: ${changes.map((change) => change.message).join("; ")}`).pipe(
      Effect.annotateLogs({ stream: options.name, settings: [...changed].join(",") })
    )
    return updated
  })

/**
 * The replicas of a stream that serves stream `source` (its dead-letter or MaxDeliver-capture
 * stream) when none are declared: as many as `source` has, so that it survives what its source
 * survives, or `target`'s own when it exists with more, so that an operator's replicas are never
 * lowered. 1 when neither exists (a source not created yet). Costs two stream info requests.
 */
export const inheritedReplicas = (source: string, target: string): Effect.Effect<number, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const replicasOf = (name: string) =>
      call(`stream info ${name}`, () => manager.streams.info(name)).pipe(
        Effect.map((info) => info.config.num_replicas),
        Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed(1))
      )
    return Math.max(yield* replicasOf(source), yield* replicasOf(target), 1)
  })

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

/** Whether the dotted server `version` (`2.9.10`) is `wanted` or later. */
export const versionAtLeast = (version: string, wanted: string): boolean => {
  const parse = (text: string) => text.replace(/^v/, "").split(/[.-]/).slice(0, 3).map((part) => Number.parseInt(part, 10) || 0)
  const have = parse(version)
  const need = parse(wanted)
  for (let i = 0; i < 3; i++) {
    if ((have[i] ?? 0) !== (need[i] ?? 0)) return (have[i] ?? 0) > (need[i] ?? 0)
  }
  return true
}

/**
 * The features of a consumer declaration that need a server newer than NATS 2.9, each with the
 * first version that has it (empty: any supported server takes the declaration).
 */
export const consumerFeatures = (options: ConsumerOptions): ReadonlyArray<{ readonly feature: string; readonly since: string }> =>
  (options.filterSubjects?.length ?? 0) > 1 ? [{ feature: `filterSubjects (${options.filterSubjects!.length} subjects)`, since: "2.10.0" }] : []

/**
 * The refusals of a declaration that this server cannot take (`serverVersion`, as the server
 * reports it): features newer than the server are found before anything is sent, instead of
 * being silently ignored by an older server.
 */
export const unsupported = (options: ConsumerOptions, serverVersion: string | undefined): ReadonlyArray<Change> => {
  const target = `consumer ${options.stream}/${options.name}`
  const version = serverVersion ?? "unknown"
  return consumerFeatures(options)
    .filter(({ since }) => serverVersion === undefined || !versionAtLeast(serverVersion, since))
    .map(({ feature, since }) => ({
      target,
      action: "refuse" as const,
      setting: "server_version",
      live: version,
      wanted: `>= ${since}`,
      message: `${target} declares ${feature}, which needs NATS ${since} or later; the server is ${version}: ` +
        `upgrade the server, or declare one filterSubject (a consumer per subject)`
    }))
}

const formatBackoff = (backoff: ReadonlyArray<number> | undefined): string =>
  backoff === undefined || backoff.length === 0 ? "none" : backoff.map(formatNanos).join(", ")

/**
 * What {@link ensureConsumer} would do to the live consumer (`undefined`: none exists): nothing
 * (an empty list), create it, update the settings listed, or refuse a change of ack policy. It
 * compares {@link consumerConfig}: a declaration with {@link consumerProblems} is refused by
 * `ensureConsumer` whatever this says.
 */
export const consumerChanges = (options: ConsumerOptions, live: ConsumerConfig | undefined): ReadonlyArray<Change> => {
  const target = `consumer ${options.stream}/${options.name}`
  const wanted = consumerConfig(options)
  if (live === undefined) return [{ target, action: "create", setting: "*", live: "-", wanted: options.name, message: `create ${target}` }]
  if (live.ack_policy !== AckPolicy.Explicit) {
    return [{
      target,
      action: "refuse",
      setting: "ack_policy",
      live: live.ack_policy,
      wanted: AckPolicy.Explicit,
      message: `${target} exists with ack policy ${live.ack_policy}; it cannot change in place and jetworker needs ` +
        `explicit acks: delete it (\`nats consumer rm ${options.stream} ${options.name}\`; its delivery state goes with ` +
        `it) and apply the declaration again`
    }]
  }
  const changes: Array<Change> = []
  const update = (setting: string, liveText: string, wantedText: string) =>
    changes.push({ target, action: "update", setting, live: liveText, wanted: wantedText, message: `set ${setting} of ${target} to ${wantedText} (now ${liveText})` })
  if (live.ack_wait !== wanted.ack_wait) update("ack_wait", formatNanos(live.ack_wait), formatNanos(wanted.ack_wait))
  if ((live.max_deliver ?? -1) !== wanted.max_deliver) update("max_deliver", `${live.max_deliver ?? -1}`, `${wanted.max_deliver}`)
  if (live.max_ack_pending !== wanted.max_ack_pending) update("max_ack_pending", `${live.max_ack_pending}`, `${wanted.max_ack_pending}`)
  const liveFilters = [...(live.filter_subjects ?? []), ...(live.filter_subject ? [live.filter_subject] : [])].sort().join(", ")
  const wantedFilters = [...(wanted.filter_subjects ?? []), ...(wanted.filter_subject === undefined ? [] : [wanted.filter_subject])].sort().join(", ")
  if (liveFilters !== wantedFilters && wantedFilters === "") {
    // nats.js's update merges the live config, so it keeps a filter it is not given: not removed here.
    changes.push({
      target,
      action: "refuse",
      setting: "filter_subject",
      live: liveFilters,
      wanted: "none",
      message: `${target} filters on ${liveFilters}; jetworker does not remove a filter: remove it with the nats ` +
        `CLI (the consumer keeps its delivery state), or declare the filter`
    })
  } else if (liveFilters !== wantedFilters) update("filter_subject", liveFilters || "none", wantedFilters || "none")
  if (formatBackoff(live.backoff) !== formatBackoff(wanted.backoff)) update("backoff", formatBackoff(live.backoff), formatBackoff(wanted.backoff))
  return changes
}

/**
 * Creates the durable consumer, or updates its mutable settings to the declaration. Returns the
 * live info. A declared filter is first checked against the live stream's subjects
 * ({@link filterProblems}): one outside them is refused before anything is sent.
 */
export const ensureConsumer = (
  options: ConsumerOptions
): Effect.Effect<ConsumerInfo, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const operation = `ensure consumer ${options.stream}/${options.name}`
    if (!NAME.test(options.name)) return yield* invalid(operation, `invalid consumer name ${JSON.stringify(options.name)}`)
    const problems = consumerProblems(options)
    if (problems.length > 0) return yield* invalid(operation, problems.map((problem) => problem.message).join("; "))
    const wanted = consumerConfig(options)
    const delays = wanted.backoff?.length ?? 0
    if (delays > 0 && !(wanted.max_deliver! > delays)) {
      return yield* invalid(
        operation,
        `a backoff of ${delays} delays needs maxDeliver above ${delays} (the server refuses it otherwise); it is ${wanted.max_deliver}`
      )
    }
    if (options.filterSubject !== undefined && options.filterSubjects !== undefined) {
      return yield* invalid(operation, "give filterSubject or filterSubjects, not both")
    }
    const { connection, manager } = yield* NatsConnection
    const tooNew = unsupported(options, connection.info?.version)
    if (tooNew.length > 0) return yield* invalid(operation, tooNew.map((change) => change.message).join("; "))
    if (options.filterSubject !== undefined || options.filterSubjects !== undefined) {
      // Checked against the live stream, before the consumer is created or its filter changed.
      const stream = yield* call(operation, () => manager.streams.info(options.stream))
      const outside = filterProblems(options, stream.config.subjects ?? [])
      if (outside.length > 0) return yield* invalid(operation, outside.map((problem) => problem.message).join("; "))
    }
    const existing = yield* call(operation, () => manager.consumers.info(options.stream, options.name)).pipe(
      Effect.catchIf((error) => error.reason === "ConsumerNotFound", () => Effect.succeed(undefined))
    )
    if (existing === undefined) return yield* call(operation, () => manager.consumers.add(options.stream, wanted))
    const changes = consumerChanges(options, existing.config)
    const refused = changes.find((change) => change.action === "refuse")
    if (refused !== undefined) return yield* invalid(operation, refused.message)
    if (changes.length === 0) return existing
    return yield* call(operation, () =>
      manager.consumers.update(options.stream, options.name, {
        ack_wait: wanted.ack_wait!,
        max_deliver: wanted.max_deliver!,
        max_ack_pending: wanted.max_ack_pending!,
        // An empty list removes a live backoff (the server keeps a field left out).
        backoff: wanted.backoff ?? [],
        ...(wanted.filter_subject === undefined ? {} : { filter_subject: wanted.filter_subject }),
        ...(wanted.filter_subjects === undefined ? {} : { filter_subjects: wanted.filter_subjects })
      }))
  })

/**
 * Declares streams and durable pull consumers on the server: creates them when missing and
 * brings their mutable settings to what is declared when they differ. Options are camelCase
 * durations and counts; the snake_case nanosecond config of JetStream stays inside this module
 * and `internal/topologyDeclarations.ts`. It refuses (typed error) to change what the server
 * cannot change in place, such as a stream's storage or retention or a consumer's ack policy, and
 * a stream change that deletes stored messages unless the declaration allows it.
 * {@link streamChanges} and {@link consumerChanges} say what `ensure*` would do without doing it
 * (`Contract.plan` and `Contract.apply` build on them). For a consumer owned by a platform team,
 * skip this and let the source (or `Contract.check`) check the live config instead.
 *
 * @since 0.1.0
 */
import {
  AckPolicy,
  type ConsumerConfig,
  type ConsumerInfo,
  ReplayPolicy,
  type StreamConfig,
  type StreamInfo,
  type StreamState
} from "@nats-io/jetstream"
import { Duration, Effect } from "effect"
import {
  captures,
  consumerConfig,
  consumerProblems,
  filterProblems,
  formatNanos,
  retentionProblem,
  streamConfig,
  streamProblems,
  windowProblem
} from "./internal/topologyDeclarations.ts"
import { explainOverlap, namingServer, SUBJECTS_OVERLAP } from "./internal/serverHints.ts"
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
  /**
   * When the server deletes a message. `"limits"`: only at the stream's limits (age, count, bytes),
   * so a message stays after its ack, which jetworker relies on (the MaxDeliver recovery and
   * `nats stream get` read it, every consumer gets it, one created later too). `"workqueue"`: once
   * acked or terminated (a dead-lettered message goes with it), and the server refuses a second
   * consumer without a filter of its own. `"interest"`: once every consumer acked it, and what is
   * published while no consumer exists is not stored. nats-server 2.9 cannot change it in place:
   * an existing stream with another retention than declared, or than `"limits"` when left out, is
   * refused. Default: `"limits"`.
   */
  readonly retention?: "limits" | "interest" | "workqueue" | undefined
  /**
   * Apply a change that deletes messages the stream stores (a lower or first limit on its
   * messages, bytes or age that they exceed, a switch from discard `new` to `old` under a limit:
   * {@link streamChanges} marks it `destructive`). Without it `ensureStream` refuses such a change
   * before anything is sent, as the stored messages may not have been processed yet. The change
   * is logged at WARN with what it deletes. `Contract.apply` ignores this field: its own
   * `allowDataLoss` decides. Default: `false`.
   */
  readonly allowDataLoss?: boolean | undefined
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
  /**
   * `true` when the update can delete messages the stream stores: a lower (or a first) limit on
   * its messages, bytes or age, which nats-server applies at once to what the stream holds
   * (whatever its discard policy) and under discard `old` makes stored messages go sooner, or a
   * switch from discard `new` to `old` under a limit, after which the server deletes the oldest
   * messages at the limit instead of refusing a publish. `message` then says how many messages go
   * when the stream's state tells, else that it may delete stored messages. A stream known to hold
   * no message loses none. {@link ensureStream} and `Contract.apply` apply such a change only when
   * allowed to (`allowDataLoss`). Absent: it deletes none.
   */
  readonly destructive?: boolean | undefined
}

const NAME = /^[A-Za-z0-9_-]{1,200}$/

/** Whether `name` is a valid stream or durable consumer name: 1 to 200 letters, digits, `_` and `-`. */
export const isValidName = (name: string): boolean => NAME.test(name)

const invalid = (operation: string, message: string) =>
  new NatsError.NatsError({ reason: "ApiError", operation, message })

// What a declaration stands for on the server (its config) and what the server would not keep
// as declared: defined in internal/topologyDeclarations.ts, public here.
export { captures, consumerConfig, consumerProblems, filterProblems, formatNanos, streamConfig, streamProblems }
export type { Problem } from "./internal/topologyDeclarations.ts"

const sameList = (a: ReadonlyArray<unknown> | undefined, b: ReadonlyArray<unknown> | undefined): boolean =>
  JSON.stringify([...(a ?? [])].sort()) === JSON.stringify([...(b ?? [])].sort())

const call = NatsError.tryPromise

/**
 * The subjects an existing stream should have: the declared ones (`"exact"`), or the live ones
 * plus each declared subject that no live one captures (`"add"`; the server refuses overlapping
 * subjects in one stream, so a covered subject must not be added).
 */
const wantedSubjects = (options: StreamOptions, live: ReadonlyArray<string>): Array<string> =>
  options.subjectsMode === "add"
    ? [...live, ...options.subjects.filter((subject) => !live.some((pattern) => captures(pattern, subject)))]
    : [...options.subjects]

/** Whether a limit (`0` or `-1`: none) goes from `before` to a lower one, or to one where there was none. */
const lowered = (before: number | undefined, after: number | undefined): boolean =>
  (after ?? -1) > 0 && ((before ?? -1) <= 0 || after! < before!)

/**
 * What an update of `setting` from `live` to `wanted` (the stream as the update leaves it) can
 * delete of the messages the stream stores (`undefined`: none of them): how many when `state`
 * tells, else that it may delete some. nats-server 2.9 applies a lower limit at once to what the
 * stream stores, with discard `new` as with `old` (checked on 2.9.10). Only what goes at once
 * counts: a lower limit the stored messages still fit under, or a shorter age than the oldest
 * stored message's (its `first_ts`), deletes nothing now (the oldest going later, past the limit,
 * is what a limit is). A stream that stores nothing loses nothing.
 */
const dataLoss = (
  setting: string,
  live: StreamConfig,
  wanted: { readonly [K in "max_msgs" | "max_bytes" | "max_age" | "discard"]?: StreamConfig[K] | undefined },
  state: StreamState | undefined
): string | undefined => {
  if (state !== undefined && state.messages === 0) return undefined
  const held = state === undefined ? "" : ` (it holds ${state.messages} messages, ${state.bytes} bytes)`
  switch (setting) {
    case "max_msgs": {
      const limit = wanted.max_msgs!
      if (!lowered(live.max_msgs, limit)) return undefined
      if (state === undefined) return "may delete stored messages (a lower limit applies at once to what the stream holds)"
      const excess = state.messages - limit
      // Within the new limit nothing goes now; the oldest going later, past it, is what a limit is.
      return excess > 0 ? `deletes the oldest ${excess} of the ${state.messages} stored messages` : undefined
    }
    case "max_bytes": {
      const limit = wanted.max_bytes!
      if (!lowered(live.max_bytes, limit)) return undefined
      if (state === undefined) return "may delete stored messages (a lower limit applies at once to what the stream holds)"
      return state.bytes > limit ? `deletes the oldest stored messages until at most ${limit} bytes remain${held}` : undefined
    }
    case "max_age": {
      if (!lowered(live.max_age, wanted.max_age)) return undefined
      // The oldest stored message's time tells whether any is past the new age now.
      const oldest = state === undefined ? Number.NaN : Date.parse(state.first_ts)
      if (Number.isFinite(oldest) && Date.now() - oldest <= wanted.max_age! / 1_000_000) return undefined
      return `${Number.isFinite(oldest) ? "deletes" : "may delete"} stored messages: those older than ${formatNanos(wanted.max_age)} go (now kept ` +
        `${live.max_age > 0 ? `for ${formatNanos(live.max_age)}` : "for ever"})${held}`
    }
    case "discard": {
      const limited = [wanted.max_msgs ?? live.max_msgs, wanted.max_bytes ?? live.max_bytes, live.max_msgs_per_subject]
        .some((limit) => (limit ?? -1) > 0)
      return live.discard === "new" && wanted.discard === "old" && limited
        ? `may delete stored messages: at its limits the server then deletes the oldest instead of refusing a publish${held}`
        : undefined
    }
    default:
      return undefined
  }
}

/** The server's refusal of a consumer a `workqueue` stream cannot take beside its others (10099, 10100). */
const WORKQUEUE_REFUSAL = /non-filtered consumers not allowed on workqueue|filtered consumer not unique on workqueue/i

/**
 * A consumer refused by a `workqueue` stream, which hands each message to one consumer only: the
 * server's words, with the live consumers and what to do (a stream `ensureStream` declared is never
 * `workqueue` unless its declaration says so, but one an operator or another tool created may be).
 */
const workqueueRefusal = (operation: string, options: ConsumerOptions, error: NatsError.NatsError) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    const live = yield* call(operation, async () => {
      const names: Array<string> = []
      for await (const info of manager.consumers.list(options.stream)) {
        names.push(info.name)
        if (names.length === 10) break
      }
      return names
    }).pipe(Effect.orElseSucceed((): ReadonlyArray<string> => []))
    return yield* invalid(
      operation,
      `stream ${options.stream} has retention workqueue, which hands each message to one consumer only, and the server refuses ` +
        `consumer ${options.name} beside ${live.length === 0 ? "its live consumers" : `its live consumers (${live.join(", ")})`}: ` +
        `${error.message}. Give each consumer of the stream a filter subject (filterSubject) that no other one's overlaps, ` +
        `or read the stream with one consumer; a stream that several consumers read whole needs retention "limits" or "interest" ` +
        `(a new stream: the server cannot change retention in place)`
    )
  })

/**
 * What {@link ensureStream} would do to the live stream (`undefined`: none exists): nothing (an
 * empty list), create it, update the settings listed, or refuse a change of storage or retention
 * (the retention is always compared: left out, the declaration stands for `"limits"`). It compares
 * {@link streamConfig}, but only the settings the declaration gives (and its subjects): a stream's
 * replicas, age, duplicate window, storage or limits that an operator or platform set and the
 * declaration leaves out stay as they are. One exception: a live duplicate window longer than a
 * declared max age comes down to the default window (the server refuses the pair). A declaration
 * with {@link streamProblems} is refused by `ensureStream` whatever this says. An update that can
 * delete stored messages is marked `destructive`; given the live stream's `state`, its message says
 * how many go.
 */
export const streamChanges = (
  options: StreamOptions,
  live: StreamConfig | undefined,
  state?: StreamState | undefined
): ReadonlyArray<Change> => {
  const target = `stream ${options.name}`
  const wanted = streamConfig(options)
  if (live === undefined) {
    return [{ target, action: "create", setting: "*", live: "-", wanted: wanted.subjects!.join(", "), message: `create ${target}` }]
  }
  const refusals: Array<Change> = []
  if (options.storage !== undefined && live.storage !== wanted.storage) {
    refusals.push({
      target,
      action: "refuse",
      setting: "storage",
      live: live.storage,
      wanted: wanted.storage!,
      message: `${target} exists with storage ${live.storage}; it cannot change in place: declare storage ` +
        `"${live.storage}" (keep the stream), or create a new stream with the other storage and move the consumers to it`
    })
  }
  // Compared even when left out: jetworker's dead letters and consumers assume limits retention.
  const retention = retentionProblem(options, live.retention)
  if (retention !== undefined) {
    const { message } = retention
    refusals.push({ target, action: "refuse", setting: "retention", live: live.retention ?? "limits", wanted: wanted.retention!, message })
  }
  if (refusals.length > 0) return refusals
  const changes: Array<Change> = []
  // The stream as the update leaves it: a discard switch deletes only under the limits it will have.
  const after = {
    max_msgs: options.maxMessages === undefined ? live.max_msgs : wanted.max_msgs,
    max_bytes: options.maxBytes === undefined ? live.max_bytes : wanted.max_bytes,
    max_age: wanted.max_age,
    discard: wanted.discard
  }
  const update = (setting: string, liveText: string, wantedText: string) => {
    const loss = dataLoss(setting, live, after, state)
    const message = `set ${setting} of ${target} to ${wantedText} (now ${liveText})`
    changes.push({
      target,
      action: "update",
      setting,
      live: liveText,
      wanted: wantedText,
      ...(loss === undefined ? { message } : { message: `${message}: ${loss}`, destructive: true })
    })
  }
  const subjects = wantedSubjects(options, live.subjects)
  if (!sameList(live.subjects, subjects)) update("subjects", live.subjects.join(", "), subjects.join(", "))
  // Settings are compared only when declared: a platform's replicas, disk or count cap on a
  // stream the declaration leaves them out of stays as it is (a worker ensuring its
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
 * change a stream it shares with others. A change that deletes stored messages (`destructive`, see
 * {@link streamChanges}) is refused before anything is sent unless the declaration says
 * `allowDataLoss: true`: a limit lowered in the code must not delete unprocessed messages at the
 * next start-up. Subjects another stream captures are refused naming
 * each of them and that stream (the server names neither); a server without JetStream is named
 * (host:port) with how to enable it.
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
    // The server's refusal names neither the subjects nor the stream that has them.
    const overlap = (subjects: ReadonlyArray<string>) => (error: NatsError.NatsError) =>
      error.code === SUBJECTS_OVERLAP ? Effect.flatMap(explainOverlap(error, manager, options.name, subjects), Effect.fail) : Effect.fail(error)
    const existing = yield* call(operation, () => manager.streams.info(options.name)).pipe(
      Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed(undefined))
    )
    if (existing === undefined) return yield* call(operation, () => manager.streams.add(wanted)).pipe(Effect.catch(overlap(wanted.subjects!)))
    const changes = streamChanges(options, existing.config, existing.state)
    const refused = changes.filter((change) => change.action === "refuse")
    if (refused.length > 0) return yield* invalid(operation, refused.map((change) => change.message).join("; "))
    const destructive = changes.filter((change) => change.destructive === true)
    if (destructive.length > 0 && options.allowDataLoss !== true) {
      return yield* invalid(
        operation,
        `refused: ${destructive.map((change) => change.message).join("; ")}; the stored messages may not have been ` +
          `processed yet: keep the live limit in the declaration, or declare allowDataLoss: true to apply it ` +
          `(Contract.apply: allowDataLoss, or jetworker contract apply --allow-data-loss)`
      )
    }
    if (changes.length === 0) return existing
    // Only the settings that change are sent: the others keep their live values (nats.js sends
    // the live config with these changes).
    const changed = new Set(changes.map((change) => change.setting))
    const pick = <K extends keyof StreamConfig>(key: K) => changed.has(key) ? { [key]: wanted[key] } : {}
    const subjects = wantedSubjects(options, existing.config.subjects)
    const updated = yield* call(operation, () =>
      manager.streams.update(options.name, {
        ...pick("duplicate_window"),
        ...pick("max_age"),
        ...pick("max_bytes"),
        ...pick("max_msgs"),
        ...pick("discard"),
        ...pick("num_replicas"),
        subjects
      })).pipe(Effect.catch(overlap(subjects)))
    yield* Effect.logWarning(`stream ${options.name} reconfigured: ${changes.map((change) => change.message).join("; ")}`).pipe(
      Effect.annotateLogs({ stream: options.name, settings: [...changed].join(",") })
    )
    return updated
  }).pipe(namingServer)

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
  }).pipe(namingServer)

/**
 * Whether stream `name` exists (one stream info request; a failure other than "not found" fails).
 * For defaults meant for a stream created here only: a live stream keeps limits an operator set.
 */
export const streamExists = (name: string): Effect.Effect<boolean, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection
    return yield* call(`stream info ${name}`, () => manager.streams.info(name)).pipe(
      Effect.as(true),
      Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed(false))
    )
  }).pipe(namingServer)

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

/** Whether a filter subject has a wildcard token (`*` or `>`). */
const hasWildcard = (subject: string): boolean => subject.split(".").some((token) => token === "*" || token === ">")

/**
 * The first server version that applies an update giving a consumer without a wildcard filter a
 * wildcard one. nats-server 2.9.10 keeps the consumer's "wildcard filter" flag from its creation:
 * after such an update it compares each subject literally with the pattern and delivers nothing
 * more (no error; checked on 2.9.10, the only older server tested). 2.10.0 is the first version
 * known to apply it.
 */
const WILDCARD_FILTER_UPDATE_SINCE = "2.10.0"

/**
 * What {@link ensureConsumer} would do to the live consumer (`undefined`: none exists): nothing
 * (an empty list), create it, update the settings listed, or refuse what the server cannot change
 * in place (nats-server 2.9.10 refuses it, or nats.js cannot pull from it): an ack policy other than
 * explicit, a push consumer (`deliver_subject` set), a replay policy other than instant, and a
 * deliver policy other than the declared one (compared only when `deliverPolicy` is declared). It
 * compares {@link consumerConfig}: a declaration with {@link consumerProblems} is refused by
 * `ensureConsumer` whatever this says.
 *
 * `serverVersion` (as the server reports it, e.g. `connection.info?.version`) decides the one change
 * that depends on the server: a wildcard filter (`orders.>`, `orders.*`) for a live consumer that
 * has no filter or only literal ones. A server older than 2.10.0 takes that update and then
 * delivers nothing more from the consumer (nats-server 2.9.10 does), so it is refused there, and
 * when the version is not given; other filter changes are updates on every server.
 */
export const consumerChanges = (
  options: ConsumerOptions,
  live: ConsumerConfig | undefined,
  serverVersion?: string | undefined
): ReadonlyArray<Change> => {
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
  const remove = `delete it (\`nats consumer rm ${options.stream} ${options.name}\`; its delivery state goes with it) and apply ` +
    `the declaration again`
  const refuse = (setting: string, liveText: string, wantedText: string, message: string) =>
    changes.push({ target, action: "refuse", setting, live: liveText, wanted: wantedText, message })
  if ((live.deliver_subject ?? "") !== "") {
    refuse(
      "deliver_subject",
      live.deliver_subject!,
      "none (pull)",
      `${target} is a push consumer (deliver_subject ${live.deliver_subject}): jetworker pulls, and nats.js cannot pull ` +
        `from it ("not a pull consumer"); push cannot change to pull in place: ${remove} (a pull consumer)`
    )
  }
  if ((live.replay_policy ?? ReplayPolicy.Instant) !== ReplayPolicy.Instant) {
    refuse(
      "replay_policy",
      live.replay_policy,
      ReplayPolicy.Instant,
      `${target} has replay policy ${live.replay_policy}: the server hands out messages no faster than they were ` +
        `published (a backlog drains at its original pace); jetworker declares instant, and a replay policy cannot ` +
        `change in place: ${remove}`
    )
  }
  if (options.deliverPolicy !== undefined && live.deliver_policy !== wanted.deliver_policy) {
    // It only decides where a new consumer starts: keeping the consumer is usually the fix.
    const declarable = live.deliver_policy === "all" || live.deliver_policy === "new"
    refuse(
      "deliver_policy",
      live.deliver_policy,
      wanted.deliver_policy!,
      `${target} has deliver policy ${live.deliver_policy}, the declaration ${wanted.deliver_policy}; a deliver policy ` +
        `cannot change in place (it decides where a new consumer starts): ` +
        (declarable ? `declare deliverPolicy "${live.deliver_policy}"` : "leave deliverPolicy out of the declaration") +
        ` (the consumer keeps its position), or delete it (\`nats consumer rm ${options.stream} ${options.name}\`; its ` +
        `position goes with it) and apply the declaration again (it then starts ` +
        `${wanted.deliver_policy === "new" ? "with the next message published" : "at the stream's first message"})`
    )
  }
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
  } else if (liveFilters !== wantedFilters) {
    const liveList = [...(live.filter_subjects ?? []), ...(live.filter_subject ? [live.filter_subject] : [])]
    const wantedList = [...(wanted.filter_subjects ?? []), ...(wanted.filter_subject === undefined ? [] : [wanted.filter_subject])]
    const stops = !liveList.some(hasWildcard) && wantedList.some(hasWildcard) &&
      (serverVersion === undefined || !versionAtLeast(serverVersion, WILDCARD_FILTER_UPDATE_SINCE))
    if (stops) {
      refuse(
        "filter_subject",
        liveFilters || "none",
        wantedFilters,
        `${target} ${liveFilters === "" ? "has no filter" : `filters on ${liveFilters}`}, the declaration on ${wantedFilters}: ` +
          `NATS before ${WILDCARD_FILTER_UPDATE_SINCE} (the server is ${serverVersion ?? "unknown"}) takes an update that gives ` +
          `a consumer without a wildcard filter a wildcard one, and the consumer then delivers nothing more: delete it ` +
          `(\`nats consumer rm ${options.stream} ${options.name}\`; its delivery state goes with it: acks, redeliveries, its ` +
          `position) and apply the declaration again, or declare a new consumer with the filter (and move the service to it)`
      )
    } else update("filter_subject", liveFilters || "none", wantedFilters || "none")
  }
  if (formatBackoff(live.backoff) !== formatBackoff(wanted.backoff)) update("backoff", formatBackoff(live.backoff), formatBackoff(wanted.backoff))
  return changes
}

/**
 * Creates the durable consumer, or updates its mutable settings to the declaration. Returns the
 * live info. A declared filter is first checked against the live stream's subjects
 * ({@link filterProblems}): one outside them is refused before anything is sent, and so is a
 * change {@link consumerChanges} refuses on this server (a wildcard filter for a live consumer
 * without one, on NATS before 2.10). A consumer that a `workqueue` stream refuses beside its others
 * (each message goes to one consumer only) fails naming the retention, the live consumers and what
 * to do. A server without JetStream is named (host:port) with how to enable it.
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
    if (existing === undefined) {
      return yield* call(operation, () => manager.consumers.add(options.stream, wanted)).pipe(
        Effect.catchIf((error) => WORKQUEUE_REFUSAL.test(error.message), (error) => workqueueRefusal(operation, options, error))
      )
    }
    const changes = consumerChanges(options, existing.config, connection.info?.version)
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
  }).pipe(namingServer)

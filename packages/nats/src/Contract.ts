/**
 * A service's JetStream contract as code (INT-NATS-002): its stream (the closed list of subjects,
 * storage, retention, replicas, duplicate window, maximum age), its durable consumers, and what the
 * application expects of each (attempts, concurrency, prefetch, instances, ordering), checked
 * against the live server. The compatibility checks jetworker makes live here, once:
 * `JetStreamSource` runs {@link consumerFindings} on the live consumer when it opens, and
 * {@link check} runs every check of a contract (in CI against a live server, or before a deploy).
 *
 * Ownership says who may write: a `service`-owned contract is applied with {@link apply} (which
 * creates what is missing and brings mutable settings to the declaration, through `Topology`), a
 * `platform`-owned one is only ever checked. {@link plan} says what `apply` would change, and
 * which of its changes can delete stored messages (`destructive`: `apply` makes those only when
 * allowed). A contract kept as a reviewed JSON file in the repository is read with {@link fromJson}.
 *
 * The checks deliberately do not compare settings a contract leaves out (a stream's limits in
 * bytes or messages when it declares none, a consumer's deliver policy when it declares none),
 * nor fix anything they find: each finding says what to do. A live consumer jetworker cannot use
 * as it is (a push consumer, a replay policy other than instant) is an error whatever the contract
 * declares.
 *
 * @since 0.1.0
 */
import type { ConsumerConfig } from "@nats-io/jetstream"
import { Data, Duration, Effect } from "effect"
import * as ContractFile from "./internal/contractFile.ts"
import { consumerFindings, declaredConsumerFindings, streamFindings } from "./internal/contractFindings.ts"
import { namingServer } from "./internal/serverHints.ts"
import { NatsConnection } from "./NatsConnection.ts"
import * as NatsError from "./NatsError.ts"
import * as Topology from "./Topology.ts"

/**
 * What the application expects of one consumer: the settings the server's must agree with. The
 * intake's pulls ask for up to `prefetch` messages each and wait `pullExpires`: a pull consumer's
 * limits on pull requests (`max_batch`, `max_expires`, `max_waiting`) are checked against them.
 */
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
  /**
   * The longest one attempt may run (`Consumer.make`'s `handlerTimeout`). AckWait below it means
   * an attempt outlives its lease unless the engine's extensions keep arriving. A finite duration,
   * 0 or more (anything else is an error finding). Default: 30 seconds.
   */
  readonly maxProcessingTime?: Duration.Input | undefined
  /**
   * Whether a second delivery of a message that is still being handled is harmless (the handler
   * commits through an idempotency store, or its effect is idempotent). Default: `true`.
   */
  readonly idempotent?: boolean | undefined
  /**
   * How long each pull of the intake waits on the server (`JetStreamSource`'s `pullExpires`),
   * from 1 second to 2147483647 ms (anything else is an error finding). A consumer whose
   * `max_expires` is shorter refuses every pull. Default: 30 seconds, the intake's default.
   */
  readonly pullExpires?: Duration.Input | undefined
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
   * restart); the stream's duplicate window must cover it. A finite duration, 0 or more (anything
   * else is an error finding). Default: not checked.
   */
  readonly publishHorizon?: Duration.Input | undefined
}

/** Which check a finding comes from. */
export type Check =
  | "exists"
  | "subjects"
  | "storage"
  | "retention"
  | "replicas"
  | "duplicate_window"
  | "max_age"
  | "max_bytes"
  | "max_msgs"
  | "discard"
  | "ack_policy"
  | "ack_wait"
  | "max_deliver"
  | "max_ack_pending"
  | "max_batch"
  | "max_expires"
  | "max_waiting"
  | "filter_subject"
  | "deliver_subject"
  | "replay_policy"
  | "deliver_policy"
  | "backoff"
  | "headers_only"
  | "inactive_threshold"
  | "ordering"
  | "processing_time"
  | "server_version"

/** One incompatibility (`error`: the consumer must not run so) or risk (`warning`). */
export interface Finding {
  readonly severity: "error" | "warning"
  /** `stream ORDERS` or `consumer ORDERS/order-shipping`. */
  readonly target: string
  readonly check: Check
  /** What is wrong and what to do about it. */
  readonly message: string
}

// The checks of a live config: defined in internal/contractFindings.ts, public here.
export { consumerFindings, streamFindings }

/**
 * The contract's stream as a whole declaration: a setting it leaves out (storage, replicas, max
 * age, duplicate window) stands for its default, as {@link check} compares it. (`Topology` alone
 * leaves a setting its declaration omits as it is, so that a worker never undoes an operator's.)
 */
const inFull = (stream: Topology.StreamOptions): Topology.StreamOptions => {
  const wanted = Topology.streamConfig(stream)
  return {
    ...stream,
    storage: stream.storage ?? "file",
    replicas: stream.replicas ?? 1,
    maxAge: stream.maxAge ?? 0,
    duplicateWindow: stream.duplicateWindow ?? Duration.nanos(BigInt(wanted.duplicate_window ?? 0))
  }
}

/** A declared value the server would not keep, as an error finding of `target`. */
const problemFinding = (target: string, problem: Topology.Problem): Finding => ({
  severity: "error",
  target,
  check: problem.setting === "num_replicas" ? "replicas" : problem.setting as Check,
  message: `${target}: ${problem.message}`
})

/**
 * The values of the contract's stream and consumers that `Topology` would refuse as declared
 * ({@link Topology.streamProblems}, {@link Topology.consumerProblems}: a duration that is not one,
 * a 0 the server replaces by its default), as error findings.
 */
const declarationFindings = (contract: Contract): ReadonlyArray<Finding> => [
  ...Topology.streamProblems(contract.stream).map((problem) => problemFinding(`stream ${contract.stream.name}`, problem)),
  ...contract.consumers.flatMap((consumer) =>
    Topology.consumerProblems({ ...consumer, stream: contract.stream.name }).map((problem) =>
      problemFinding(`consumer ${contract.stream.name}/${consumer.name}`, problem)
    )
  )
]

/** `Topology`'s refusals that only deleting the consumer and declaring it again resolves. */
const RECREATE: ReadonlySet<string> = new Set(["replay_policy", "deliver_policy"])

/**
 * The live consumer's settings that cannot change in place and are not what the declaration
 * stands for (`Topology.consumerChanges`' refusals: a replay policy other than instant, a declared
 * deliver policy it does not have), as error findings saying what to do. (Its ack policy and a
 * push consumer are {@link consumerFindings}' errors, which the source checks too.)
 */
const recreateFindings = (
  target: string,
  live: ConsumerConfig,
  declared: ConsumerContract,
  stream: string
): ReadonlyArray<Finding> =>
  Topology.consumerChanges({ ...declared, stream }, live)
    .filter((change) => change.action === "refuse" && RECREATE.has(change.setting))
    .map((change) => ({ severity: "error", target, check: change.setting as Check, message: change.message }))

/**
 * Every check of `contract` against the live server: the stream, then each consumer (its
 * declared settings and the application's expectations). A missing stream or consumer is a
 * finding, not a failure; the effect fails only when the server cannot be asked. A declaration
 * `Topology` would refuse (a duration that is not one, a 0 the server replaces by its default) is
 * not compared with the server: its error findings, naming each value, are the answer. A server
 * without JetStream is named (host:port) with how to enable it.
 */
export const check = (contract: Contract): Effect.Effect<ReadonlyArray<Finding>, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    // Compared with the server, such a value would stand as 0 and be reported as drift.
    const invalid = declarationFindings(contract)
    if (invalid.length > 0) return invalid
    const { connection, manager } = yield* NatsConnection
    const name = contract.stream.name
    const serverVersion = connection.info?.version
    const missing = (reason: NatsError.NatsError["reason"]) => (error: NatsError.NatsError) => error.reason === reason
    const stream = yield* NatsError.tryPromise(`stream info ${name}`, () => manager.streams.info(name)).pipe(
      Effect.catchIf(missing("StreamNotFound"), () => Effect.succeed(undefined))
    )
    if (stream === undefined) {
      return [{
        severity: "error",
        target: `stream ${name}`,
        check: "exists",
        message: `stream ${name} does not exist: ${contract.ownership === "service" ? "apply the contract (jetworker contract apply, or Contract.apply)" : "ask the platform team that owns it"}`
      }] satisfies ReadonlyArray<Finding>
    }
    const findings: Array<Finding> = [...streamFindings(contract.stream, stream.config, contract.publishHorizon)]
    for (const consumer of contract.consumers) {
      const target = `consumer ${name}/${consumer.name}`
      // A feature newer than the server: the declaration cannot be applied here, whatever is live.
      for (const change of Topology.unsupported({ ...consumer, stream: name }, serverVersion)) {
        findings.push({ severity: "error", target, check: "server_version", message: change.message })
      }
      const info = yield* NatsError.tryPromise(`consumer info ${name}/${consumer.name}`, () => manager.consumers.info(name, consumer.name)).pipe(
        Effect.catchIf(missing("ConsumerNotFound"), () => Effect.succeed(undefined))
      )
      if (info === undefined) {
        findings.push({
          severity: "error",
          target,
          check: "exists",
          message: `${target} does not exist: ${contract.ownership === "service" ? "apply the contract (jetworker contract apply, or Contract.apply)" : "ask the platform team that owns it"}`
        })
        continue
      }
      findings.push(
        ...recreateFindings(target, info.config, consumer, name),
        ...declaredConsumerFindings(target, info.config, consumer, name, serverVersion),
        ...consumerFindings(target, info.config, consumer.expect)
      )
    }
    return findings
  }).pipe(namingServer)

/**
 * The contract's own consistency, without a server: the stream and every consumer as `Topology`
 * would declare them, put through the same checks as the live ones (a contract whose MaxDeliver
 * does not exceed its own attempts is wrong before it reaches a server).
 */
export const validate = (contract: Contract): ReadonlyArray<Finding> => {
  const stream = contract.stream
  const streamTarget = `stream ${stream.name}`
  const findings: Array<Finding> = []
  const error = (target: string, check: Check, message: string) => findings.push({ severity: "error", target, check, message })
  // What the server would refuse, found before anything is written (an apply must not stop half way).
  if (!Topology.isValidName(stream.name)) error(streamTarget, "exists", `${streamTarget}: a name is letters, digits, _ and -`)
  if (stream.subjects.length === 0) error(streamTarget, "subjects", `${streamTarget} lists no subjects`)
  // Values the server would replace by its default: apply would never converge.
  for (const problem of Topology.streamProblems(stream)) findings.push(problemFinding(streamTarget, problem))
  const wanted = Topology.streamConfig(stream)
  for (const consumer of contract.consumers) {
    const target = `consumer ${stream.name}/${consumer.name}`
    for (const problem of Topology.consumerProblems({ ...consumer, stream: stream.name })) findings.push(problemFinding(target, problem))
    // Topology.ensureConsumer refuses it on every server (NATS 2.9 does), after the stream was
    // written: an error here keeps apply from stopping half way. A MaxDeliver at or below the
    // number of delays is consumerFindings' error.
    if ((consumer.backoff?.length ?? 0) > 0 && (consumer.maxDeliver ?? -1) === -1) {
      error(
        target,
        "backoff",
        `${target} has a backoff and no maxDeliver: Topology.ensureConsumer refuses it (NATS 2.9 does); declare ` +
          `maxDeliver above the number of delays (${consumer.backoff!.length}), or remove the backoff`
      )
    }
  }
  if ((wanted.max_age ?? 0) > 0 && (wanted.duplicate_window ?? 0) > wanted.max_age!) {
    error(streamTarget, "duplicate_window", `${streamTarget} has a duplicate window longer than its max age (the server refuses it): shorten the window or keep messages longer`)
  }
  findings.push(...streamFindings(stream, wanted, contract.publishHorizon))
  const names = new Set<string>()
  for (const consumer of contract.consumers) {
    const target = `consumer ${stream.name}/${consumer.name}`
    if (!Topology.isValidName(consumer.name)) error(target, "exists", `${target}: a name is letters, digits, _ and -`)
    if (names.has(consumer.name)) error(target, "exists", `${target} is declared twice`)
    names.add(consumer.name)
    if (consumer.filterSubject !== undefined && consumer.filterSubjects !== undefined) {
      error(target, "filter_subject", `${target} gives both filterSubject and filterSubjects: keep one`)
    }
    for (const filter of consumer.filterSubjects ?? (consumer.filterSubject === undefined ? [] : [consumer.filterSubject])) {
      // The server takes a filter inside a stream subject, or a wildcard one wider than a subject.
      if (!stream.subjects.some((subject) => Topology.captures(subject, filter) || Topology.captures(filter, subject))) {
        error(target, "filter_subject", `${target} filters on ${filter}, which the stream's subjects (${stream.subjects.join(", ")}) do not capture (the server refuses it)`)
      }
    }
    findings.push(...consumerFindings(target, Topology.consumerConfig({ ...consumer, stream: stream.name }), consumer.expect))
  }
  return findings
}

/**
 * What {@link apply} would change on the server, in order: the stream, then each consumer. An
 * empty list: the server already matches the contract. A change that can delete stored messages
 * is marked `destructive`, its message saying how many go (from the stream's state) or that some
 * may. A declaration `Topology` would refuse (a
 * duration that is not one, a 0 the server replaces by its default) has no plan: it fails with a
 * `NatsError` (reason `ApiError`) naming each value, as `Topology.ensureStream` would.
 */
export const plan = (contract: Contract): Effect.Effect<ReadonlyArray<Topology.Change>, NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const name = contract.stream.name
    const invalid = declarationFindings(contract)
    if (invalid.length > 0) {
      return yield* new NatsError.NatsError({
        reason: "ApiError",
        operation: `plan contract ${name}`,
        message: invalid.map((finding) => finding.message).join("; ")
      })
    }
    const { connection, manager } = yield* NatsConnection
    const stream = yield* NatsError.tryPromise(`stream info ${name}`, () => manager.streams.info(name)).pipe(
      Effect.catchIf((error) => error.reason === "StreamNotFound", () => Effect.succeed(undefined))
    )
    const changes: Array<Topology.Change> = [
      ...Topology.streamChanges(inFull(contract.stream), stream?.config, stream?.state),
      ...contract.consumers.flatMap((consumer) => Topology.unsupported({ ...consumer, stream: name }, connection.info?.version))
    ]
    for (const consumer of contract.consumers) {
      const options = { ...consumer, stream: name }
      const info = stream === undefined ? undefined : yield* NatsError.tryPromise(
        `consumer info ${name}/${consumer.name}`,
        () => manager.consumers.info(name, consumer.name)
      ).pipe(Effect.catchIf((error) => error.reason === "ConsumerNotFound", () => Effect.succeed(undefined)))
      changes.push(...Topology.consumerChanges(options, info?.config, connection.info?.version))
    }
    return changes
  }).pipe(namingServer)

/** Why a contract was not applied. */
export class ContractError extends Data.TaggedError("ContractError")<{
  /**
   * `PlatformOwned`: the contract is only checked, never applied; `Invalid`: the contract
   * contradicts itself (its `findings`); `Refused`: the server cannot change a setting in place
   * (its `changes`); `DataLoss`: a change would delete stored messages and was not allowed to
   * (its `changes`, see {@link ApplyOptions}); `Unreadable`: a contract file is not a contract.
   */
  readonly reason: "PlatformOwned" | "Invalid" | "Refused" | "DataLoss" | "Unreadable"
  readonly message: string
  readonly findings?: ReadonlyArray<Finding> | undefined
  readonly changes?: ReadonlyArray<Topology.Change> | undefined
}> {}

/** How {@link apply} applies a contract. */
export interface ApplyOptions {
  /**
   * Apply the changes that can delete stored messages (a stream's lower limit on messages, bytes
   * or age, a switch to discard `old`: {@link plan} marks them `destructive`). Default: `false`,
   * and a contract needing one is not applied (`DataLoss`).
   */
  readonly allowDataLoss?: boolean | undefined
  /**
   * Check all that applying checks and return the changes it would make, writing nothing (it
   * fails as the apply would). Default: `false`.
   */
  readonly dryRun?: boolean | undefined
}

/**
 * Applies a `service`-owned contract: creates the stream and consumers that are missing and
 * brings their mutable settings to the contract, and returns what it changed (empty: nothing).
 * It applies nothing when the contract is `platform`-owned, contradicts itself ({@link validate}
 * errors), needs a change the server cannot make in place (a stream's storage, a consumer's ack,
 * replay or deliver policy, a push consumer; on NATS before 2.10, a wildcard filter for a live
 * consumer without one, which the server would take and then deliver nothing more), or needs a change that can delete stored messages
 * without `allowDataLoss`; the error says which.
 */
export const apply = (
  contract: Contract,
  options?: ApplyOptions
): Effect.Effect<ReadonlyArray<Topology.Change>, ContractError | NatsError.NatsError, NatsConnection> =>
  Effect.gen(function*() {
    const name = contract.stream.name
    if (contract.ownership === "platform") {
      return yield* new ContractError({
        reason: "PlatformOwned",
        message: `the contract of stream ${name} is platform-owned: it is only checked (jetworker contract check); ` +
          `ask the platform team to apply changes`
      })
    }
    const errors = validate(contract).filter((finding) => finding.severity === "error")
    if (errors.length > 0) {
      return yield* new ContractError({
        reason: "Invalid",
        message: `the contract of stream ${name} contradicts itself: ${errors.map((f) => f.message).join("; ")}`,
        findings: errors
      })
    }
    const changes = yield* plan(contract)
    const refused = changes.filter((change) => change.action === "refuse")
    if (refused.length > 0) {
      return yield* new ContractError({
        reason: "Refused",
        message: refused.map((change) => change.message).join("; "),
        changes: refused
      })
    }
    const destructive = changes.filter((change) => change.destructive === true)
    if (destructive.length > 0 && options?.allowDataLoss !== true) {
      return yield* new ContractError({
        reason: "DataLoss",
        message: `the contract of stream ${name} needs changes that delete stored messages: ` +
          `${destructive.map((change) => change.message).join("; ")}; apply them only on purpose (allowDataLoss, ` +
          `jetworker contract apply --allow-data-loss), or change the contract`,
        changes: destructive
      })
    }
    if (changes.length === 0 || options?.dryRun === true) return changes
    // Only this apply's own allowDataLoss allows it (ensureStream refuses it otherwise).
    yield* Topology.ensureStream({ ...inFull(contract.stream), allowDataLoss: options?.allowDataLoss === true })
    for (const consumer of contract.consumers) yield* Topology.ensureConsumer({ ...consumer, stream: name })
    return changes
  })

/**
 * Reads a contract from its file form (JSON text): the fields of {@link Contract}, durations as
 * text (`"30 seconds"`) or milliseconds. Fails with `Unreadable`, naming each wrong field.
 */
export const fromJson = (text: string): Effect.Effect<Contract, ContractError> =>
  Effect.gen(function*() {
    const json = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: (error) => new ContractError({ reason: "Unreadable", message: `not JSON: ${(error as Error).message}` })
    })
    const decoded = yield* ContractFile.decode(json).pipe(
      Effect.mapError((message) => new ContractError({ reason: "Unreadable", message }))
    )
    // The file form's filters checked every duration text.
    return decoded as unknown as Contract
  })

#!/usr/bin/env node
/**
 * The `jetworker` command.
 *
 *   jetworker config check --manifest <file> [--container <name>] [--ack-wait <duration> | --ack-wait-env <VAR>] [--json]
 *   jetworker dlq list --stream <dead-letter stream> [--from <seq>] [--limit <n>] [--json] [--server <url>]
 *   jetworker dlq replay --stream <dead-letter stream> --sequence <seq> [--server <url>]
 *   jetworker dlq recover --stream <source stream> --consumer <name> --sequence <seq> [--server <url>]
 *
 * Exit codes: `config check`: 0 the settings agree with the manifest (warnings allowed); 1 they
 * disagree (the report says where); 2 the check could not run (unreadable manifest, no such
 * container, bad arguments). `dlq`: 0 done; 1 the server refused (no such stream or message, not
 * stored); 2 bad arguments or no connection. The server is `--server`, else `NATS_URL`, else
 * `nats://127.0.0.1:4222`.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { DeadLetter, NatsConnection, type NatsError } from "@jetworker/nats"
import { Console, Duration, Effect, Exit, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as ConfigCheck from "../ConfigCheck.ts"
import * as DeadLetters from "../DeadLetters.ts"

const check = Command.make("check", {
  manifest: Flag.FileText("manifest").pipe(
    Flag.withDescription("The Kubernetes manifest (YAML) whose Deployment or StatefulSet runs the worker")
  ),
  container: Flag.String("container").pipe(
    Flag.optional,
    Flag.withDescription("The worker's container (default: the workload's only container)")
  ),
  ackWait: Flag.String("ack-wait").pipe(
    Flag.optional,
    Flag.withDescription("The consumer's AckWait, e.g. \"30 seconds\"")
  ),
  ackWaitEnv: Flag.String("ack-wait-env").pipe(
    Flag.optional,
    Flag.withDescription("The container's environment variable holding the AckWait, e.g. LEDGER_ACK_WAIT")
  ),
  json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print the report as JSON"))
}, (input) =>
  Effect.gen(function*() {
    const ackWait = Option.isSome(input.ackWait) ? Duration.fromInput(input.ackWait.value as Duration.Input) : Option.none()
    if (Option.isSome(input.ackWait) && Option.isNone(ackWait)) {
      yield* Console.error(`--ack-wait ${JSON.stringify(input.ackWait.value)} is not a duration (e.g. "30 seconds")`)
      process.exitCode = 2
      return
    }
    const report = yield* ConfigCheck.check({
      manifest: input.manifest,
      container: Option.getOrUndefined(input.container),
      ackWait: Option.getOrUndefined(ackWait),
      ackWaitEnv: Option.getOrUndefined(input.ackWaitEnv)
    }).pipe(Effect.result)
    if (report._tag === "Failure") {
      yield* Console.error(`jetworker config check: ${report.failure.message}`)
      process.exitCode = 2
      return
    }
    yield* Console.log(input.json ? JSON.stringify(report.success, null, 2) : ConfigCheck.format(report.success))
    if (!report.success.ok) process.exitCode = 1
  })).pipe(Command.withDescription("Check the worker's shutdown and probe settings against its deployment manifest"))

const config = Command.make("config").pipe(
  Command.withDescription("Settings of a worker process"),
  Command.withSubcommands([check])
)

const server = Flag.String("server").pipe(
  Flag.optional,
  Flag.withDescription("The NATS server (default: NATS_URL, else nats://127.0.0.1:4222)")
)

/** Runs `effect` on a connection to `server`; a refused connection exits 2, a refused operation 1. */
const withNats = <A>(
  what: string,
  serverFlag: Option.Option<string>,
  effect: Effect.Effect<A, NatsError.NatsError, NatsConnection.NatsConnection>
) =>
  Effect.gen(function*() {
    const url = Option.getOrElse(serverFlag, () => process.env.NATS_URL ?? "nats://127.0.0.1:4222")
    const result = yield* effect.pipe(
      Effect.provide(NatsConnection.layer({ servers: url.split(",").map((s) => s.trim()), name: "jetworker-cli", maxReconnectAttempts: 0 })),
      Effect.result
    )
    if (result._tag === "Success") return Option.some(result.success)
    const error = result.failure
    yield* Console.error(`jetworker ${what}: ${error.message}`)
    process.exitCode = error.reason === "ConnectionRefused" || error.reason === "ConnectionClosed" ? 2 : 1
    return Option.none()
  })

const dlqList = Command.make("list", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The dead-letter stream, e.g. LEDGER_DLQ")),
  from: Flag.Int("from").pipe(Flag.optional, Flag.withDescription("The first sequence to show (default: the oldest)")),
  limit: Flag.Int("limit").pipe(Flag.withDefault(100), Flag.withDescription("The most dead letters to show (at most 1000)")),
  json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print them as JSON")),
  server
}, (input) =>
  Effect.gen(function*() {
    const rows = yield* withNats(
      "dlq list",
      input.server,
      DeadLetters.list(input.stream, { from: Option.getOrUndefined(input.from), limit: input.limit })
    )
    if (Option.isNone(rows)) return
    yield* Console.log(input.json ? JSON.stringify(rows.value, null, 2) : DeadLetters.format(input.stream, rows.value))
  })).pipe(Command.withDescription("List the dead letters of a dead-letter stream, with their cause"))

const dlqReplay = Command.make("replay", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The dead-letter stream")),
  sequence: Flag.Int("sequence").pipe(Flag.withDescription("The dead letter's sequence (from dlq list)")),
  server
}, (input) =>
  Effect.gen(function*() {
    const ack = yield* withNats("dlq replay", input.server, DeadLetter.replay(input.stream, input.sequence))
    if (Option.isNone(ack)) return
    yield* Console.log(`replayed ${input.stream}#${input.sequence}: stored as ${ack.value.stream}#${ack.value.seq}${ack.value.duplicate ? " (a duplicate of an earlier replay)" : ""}; the dead letter is removed`)
  })).pipe(Command.withDescription("Publish a dead letter again to its original subject (its cause fixed), then remove it"))

const dlqRecover = Command.make("recover", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The source stream that still holds the message")),
  consumer: Flag.String("consumer").pipe(Flag.withDescription("The consumer that gave up on it")),
  sequence: Flag.Int("sequence").pipe(Flag.withDescription("The message's sequence (from dead-letter.stranded or the MaxDeliver advisory)")),
  server
}, (input) =>
  Effect.gen(function*() {
    const ack = yield* withNats(
      "dlq recover",
      input.server,
      DeadLetter.recover({ stream: input.stream, consumer: input.consumer, sequence: input.sequence })
    )
    if (Option.isNone(ack)) return
    yield* Console.log(`stored ${input.stream}#${input.sequence} as dead letter ${ack.value.stream}#${ack.value.seq}${ack.value.duplicate ? " (it was already there)" : ""}`)
  })).pipe(Command.withDescription("Store a message the broker stopped delivering in the consumer's dead-letter stream"))

const dlq = Command.make("dlq").pipe(
  Command.withDescription("Inspect and replay dead letters"),
  Command.withSubcommands([dlqList, dlqReplay, dlqRecover])
)

const jetworker = Command.make("jetworker").pipe(
  Command.withDescription("Operate jetworker workers"),
  Command.withSubcommands([config, dlq])
)

// A failure here is a usage error (effect/cli has printed it) or an unreadable file: exit 2.
Command.run(jetworker, { version: "0.1.0" }).pipe(
  Effect.provide(NodeServices.layer),
  NodeRuntime.runMain({
    disableErrorReporting: true,
    teardown: (exit, onExit) => onExit(Exit.isSuccess(exit) ? Number(process.exitCode ?? 0) : 2)
  })
)

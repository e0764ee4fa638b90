#!/usr/bin/env node
/**
 * The `jetworker` command.
 *
 *   jetworker config check --manifest <file> [--container <name>] [--ack-wait <duration> | --ack-wait-env <VAR>] [--json]
 *
 * Exit codes: 0 the settings agree with the manifest (warnings allowed); 1 they disagree (the
 * report says where); 2 the check could not run (unreadable manifest, no such container, bad
 * arguments).
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Console, Duration, Effect, Exit, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as ConfigCheck from "../ConfigCheck.ts"

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

const jetworker = Command.make("jetworker").pipe(
  Command.withDescription("Operate jetworker workers"),
  Command.withSubcommands([config])
)

// A failure here is a usage error (effect/cli has printed it) or an unreadable file: exit 2.
Command.run(jetworker, { version: "0.1.0" }).pipe(
  Effect.provide(NodeServices.layer),
  NodeRuntime.runMain({
    disableErrorReporting: true,
    teardown: (exit, onExit) => onExit(Exit.isSuccess(exit) ? Number(process.exitCode ?? 0) : 2)
  })
)

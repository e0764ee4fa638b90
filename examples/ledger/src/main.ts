/**
 * The ledger worker on its own: `node examples/ledger/src/main.ts`. Runs until SIGTERM or SIGINT,
 * then stops taking messages, lets running transfers finish (LEDGER_DRAIN_TIMEOUT), releases the
 * rest and closes NATS and PostgreSQL in that order. Logs are JSON lines on stdout. Exit code 0
 * after a signal, 1 when it stops for any other reason (e.g. the NATS connection closed for good).
 */
import { NodeRuntime } from "@effect/platform-node"
import { Cause, Effect, Exit, Layer, Logger } from "effect"
import { Runtime } from "effect"
import * as LedgerWorker from "./LedgerWorker.ts"

const program = LedgerWorker.run().pipe(
  Effect.provide(Layer.mergeAll(LedgerWorker.WorkerLive, Logger.layer([Logger.consoleJson])))
)

NodeRuntime.runMain(program, {
  teardown: (exit, onExit) =>
    Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onExit(0) : Runtime.defaultTeardown(exit, onExit)
})

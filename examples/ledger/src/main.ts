/**
 * The ledger worker on its own: `node examples/ledger/src/main.ts`. Runs under `Worker.runMain`:
 * waits for NATS and PostgreSQL at start (STARTUP_TIMEOUT), serves `/healthz/live`,
 * `/healthz/ready` and `/metrics` on HEALTH_PORT (default 8080), and on the first SIGTERM or
 * SIGINT runs one shutdown within SHUTDOWN_BUDGET (default 25 seconds): stops taking messages,
 * lets running transfers finish, releases the rest, closes NATS and PostgreSQL, and exits 0
 * (1 when it stopped because of a failure, 3 when a stage overran its share of the budget).
 * Logs are JSON lines on stdout. With `OTEL_EXPORTER_OTLP_ENDPOINT` set, traces (one span per
 * transfer), metrics and logs are also exported over OTLP/HTTP.
 */
import { Worker } from "@jetworker/node"
import { Otlp } from "@jetworker/opentelemetry"
import * as LedgerWorker from "./LedgerWorker.ts"

Worker.runMain(LedgerWorker.run(), { layer: LedgerWorker.WorkerLive, telemetry: Otlp.layerFromEnv })

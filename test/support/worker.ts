/**
 * Helpers for tests that run the ledger worker as a child process under `Worker.runMain`: start
 * it and learn its health port, call its probes over HTTP on loopback, read its JSON log lines,
 * and slow a transfer down inside its database transaction (a trigger that sleeps), so a
 * shutdown finds work in flight.
 */
import { ChildWorker, Eventually } from "@jetworker/testing"
import { Data, Duration, Effect } from "effect"
import { SqlClient } from "effect/sql"
import { fileURLToPath } from "node:url"

export const fixture = fileURLToPath(new URL("../fixtures/ledger-worker.ts", import.meta.url))

/** One JSON log line of the worker. */
export type LogLine = Readonly<Record<string, unknown>> & { readonly message: string; readonly level: string }

/** A worker child with its health port. */
export interface Worker {
  readonly child: ChildWorker.ChildWorker
  readonly port: number
  /** `GET path` on the health server: status and parsed (JSON) or raw body. */
  readonly get: (path: string) => Effect.Effect<{ readonly status: number; readonly body: string }, HttpFailed>
  /** The JSON log lines so far. */
  readonly logs: Effect.Effect<ReadonlyArray<LogLine>>
  /** Waits for a log line whose message is `message` and that satisfies `where`. */
  readonly waitForLog: (
    message: string,
    timeout: Duration.Input,
    where?: (line: LogLine) => boolean
  ) => Effect.Effect<LogLine, ChildWorker.ChildWorkerError>
}

/** A probe request that failed (connection refused, timeout). */
export class HttpFailed extends Data.TaggedError("HttpFailed")<{ readonly message: string }> {}

const parse = (line: string): LogLine | undefined => {
  if (!line.startsWith("{")) return undefined
  try {
    const value = JSON.parse(line) as unknown
    return typeof value === "object" && value !== null && "message" in value ? value as LogLine : undefined
  } catch {
    return undefined
  }
}

/** Parses the worker's JSON log lines out of `lines` (other lines are skipped). */
export const jsonLines = (lines: ReadonlyArray<string>): ReadonlyArray<LogLine> => lines.flatMap((l) => parse(l) ?? [])

/** Starts the ledger worker fixture with `env`; waits (bounded) until its health server listens. */
export const start = (env: Record<string, string>) => startScript(fixture, env)

/** Starts the worker `script` with `env`; waits (bounded) until its health server listens. */
export const startScript = Effect.fnUntraced(function*(script: string, env: Record<string, string>) {
  const child = yield* ChildWorker.spawn({ script, env })
  const listening = yield* child.waitForLine((line) => parse(line)?.message === "health.listening", "20 seconds")
  const port = Number(parse(listening)!.port)
  const get = (path: string) =>
    Effect.tryPromise({
      try: async () => {
        const response = await fetch(`http://127.0.0.1:${port}${path}`, { signal: AbortSignal.timeout(5_000) })
        return { status: response.status, body: await response.text() }
      },
      catch: (error) => new HttpFailed({ message: `GET ${path}: ${String(error)}` })
    })
  const worker: Worker = {
    child,
    port,
    get,
    logs: Effect.map(child.lines, jsonLines),
    waitForLog: (message, timeout, where = () => true) =>
      Effect.map(
        child.waitForLine((line) => {
          const parsed = parse(line)
          return parsed !== undefined && parsed.message === message && where(parsed)
        }, timeout),
        (line) => parse(line)!
      )
  }
  return worker
})

/** A short shutdown budget for worker tests: 6 s (grace 200 ms, close 1.5 s, telemetry 500 ms, reserve 500 ms). */
export const quickBudget = {
  SHUTDOWN_BUDGET: "6 seconds",
  SHUTDOWN_READINESS_GRACE: "200 millis",
  SHUTDOWN_CLOSE: "1500 millis",
  SHUTDOWN_TELEMETRY: "500 millis",
  SHUTDOWN_RESERVE: "500 millis"
}

/** Waits until `/healthz/ready` answers 200. */
export const waitReady = (worker: Worker, timeout: Duration.Input = "20 seconds") =>
  Eventually.poll(
    `worker ${worker.child.pid} ready`,
    worker.get("/healthz/ready").pipe(Effect.orElseSucceed(() => ({ status: 0, body: "" }))),
    (r) => r.status === 200,
    { timeout, interval: "50 millis" }
  )

/** The `shutdown.stage` lines as `stage:target`, in order. */
export const stages = (logs: ReadonlyArray<LogLine>): ReadonlyArray<string> =>
  logs.filter((l) => l.message === "shutdown.stage").map((l) => `${String(l.stage)}:${String(l.target)}`)

/** The log lines whose message is `message`. */
export const withMessage = (logs: ReadonlyArray<LogLine>, message: string) => logs.filter((l) => l.message === message)

/**
 * Makes inserting transfer `id` sleep `millis` inside the worker's transaction (a trigger on
 * `transfers` in the current schema), until {@link clearSlow}.
 */
export const makeSlow = Effect.fnUntraced(function*(id: string, millis: number) {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS test_delays (transfer_id text PRIMARY KEY, millis int NOT NULL)`
  yield* sql.unsafe(`
    CREATE OR REPLACE FUNCTION test_delay() RETURNS trigger AS $$
    DECLARE d int;
    BEGIN
      SELECT millis INTO d FROM test_delays WHERE transfer_id = NEW.id;
      IF d IS NOT NULL THEN PERFORM pg_sleep(d / 1000.0); END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql`)
  yield* sql.unsafe(`DROP TRIGGER IF EXISTS test_delay ON transfers`)
  yield* sql.unsafe(`CREATE TRIGGER test_delay BEFORE INSERT ON transfers FOR EACH ROW EXECUTE FUNCTION test_delay()`)
  yield* sql`INSERT INTO test_delays (transfer_id, millis) VALUES (${id}, ${millis})
             ON CONFLICT (transfer_id) DO UPDATE SET millis = EXCLUDED.millis`
})

/** Removes every delay set by {@link makeSlow}. */
export const clearSlow = SqlClient.SqlClient.use((sql) => sql`DELETE FROM test_delays`.pipe(Effect.asVoid))

/** Waits until the worker printed that the handler of `eventId` is about to run. */
export const waitReceived = (worker: Worker, eventId: string, timeout: Duration.Input = "15 seconds") =>
  worker.child.waitForLine((line) => line.startsWith("received ") && line.includes(JSON.stringify(eventId)), timeout)

/** The `outcome` lines a child worker (the ledger fixture) printed, parsed. */
export const outcomeLines = (child: ChildWorker.ChildWorker) =>
  Effect.map(child.lines, (lines) =>
    lines.flatMap((line) =>
      line.startsWith("outcome ")
        ? [JSON.parse(line.slice("outcome ".length)) as { readonly tag: string; readonly eventId?: string; readonly sequence: number }]
        : []
    ))

/** The `outcome` lines the worker printed, parsed. */
export const outcomes = (worker: Worker) => outcomeLines(worker.child)

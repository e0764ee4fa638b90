/**
 * The README's main job: the reference ledger worker end to end against the real NATS and
 * PostgreSQL. It opens fresh accounts, publishes a mix of transfers (normal ones, a redelivered
 * duplicate, a malformed payload, an invalid amount, an unknown account, insufficient funds, an
 * expired transfer, and one whose database insert fails transiently on purpose), runs the worker
 * until every one of them has settled, prints a table of outcomes, and checks that the total money
 * is unchanged, that each transfer took effect at most once, that each committed transfer's
 * `ledger.applied` event was published once (through the outbox relay) and that the dead-letter
 * stream holds the failures. Runs under `Worker.runMain` like the worker itself; exits 0 when every check holds,
 * 1 otherwise.
 */
import type { Outcome } from "@jetworker/core"
import { DeadLetter, NatsConnection, Publisher } from "@jetworker/nats"
import { Worker } from "@jetworker/node"
import { Console, DateTime, Deferred, Duration, Effect, Fiber, Layer, References, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import { openAccount, totalBalance, transferCount } from "./Ledger.ts"
import * as LedgerWorker from "./LedgerWorker.ts"
import { toJson } from "./TransferEvent.ts"

interface Case {
  readonly name: string
  readonly eventId: string
  readonly payload: string
  /** `Nats-Msg-Id`; a duplicate reuses the event id with another message id, as a republish past the window would. */
  readonly msgId: string
  readonly expected: Outcome.Tag
}

const run = `demo-${Date.now().toString(36)}`
const acct = (name: string) => `${run}.${name}`
const encoder = new TextEncoder()

/** Makes the `transfers` insert of `transferId` fail `times` times with a serialization failure (SQLSTATE 40001). */
const injectTransientFailure = (transferId: string, times: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql`CREATE TABLE IF NOT EXISTS demo_faults (transfer_id text PRIMARY KEY, fail_times int NOT NULL)`
    yield* sql.unsafe(`
      CREATE OR REPLACE FUNCTION demo_inject_fault() RETURNS trigger AS $$
      DECLARE budget int;
      BEGIN
        SELECT fail_times INTO budget FROM demo_faults WHERE transfer_id = NEW.id;
        -- a sequence is not rolled back with the failing transaction, so it counts the failures
        IF budget IS NOT NULL AND nextval(('demo_fault_' || md5(NEW.id))::regclass) <= budget THEN
          RAISE EXCEPTION 'demo: injected transient failure for %', NEW.id USING ERRCODE = '40001';
        END IF;
        RETURN NEW;
      END $$ LANGUAGE plpgsql`)
    yield* sql.unsafe(`DROP TRIGGER IF EXISTS demo_inject_fault ON transfers`)
    yield* sql.unsafe(
      `CREATE TRIGGER demo_inject_fault BEFORE INSERT ON transfers FOR EACH ROW EXECUTE FUNCTION demo_inject_fault()`
    )
    const md5 = yield* sql<{ readonly h: string }>`SELECT md5(${transferId}) AS h`
    yield* sql.unsafe(`CREATE SEQUENCE IF NOT EXISTS demo_fault_${md5[0]!.h}`)
    yield* sql`INSERT INTO demo_faults (transfer_id, fail_times) VALUES (${transferId}, ${times})`
  })

const pad = (text: string, width: number) => (text.length > width ? `${text.slice(0, width - 1)}…` : text.padEnd(width))

const detail = (outcome: Outcome.Outcome): string => {
  switch (outcome._tag) {
    case "Rejected":
    case "DeadLettered":
      return outcome.reason === outcome.error.tag
        ? `${outcome.reason}: ${outcome.error.message}`
        : `${outcome.reason}: ${outcome.error.tag}: ${outcome.error.message}`
    case "Released":
      return `${outcome.reason}${outcome.retryIn === undefined ? "" : ` in ${Duration.format(outcome.retryIn)}`}` +
        (outcome.error === undefined ? "" : `: ${outcome.error.tag}`)
    case "Expired":
      return `expired at ${DateTime.formatIso(outcome.expiresAt)}`
    default:
      return outcome.confirmed ? "ack confirmed" : "ack unconfirmed"
  }
}

const program = Effect.gen(function*() {
  const settings = yield* LedgerWorker.settings
  yield* LedgerWorker.setup(settings)
  const now = DateTime.makeUnsafe(Date.now())
  const transfer = (id: string, from: string, to: string, amount: number, extra: { expiresAt?: DateTime.Utc } = {}) =>
    toJson({ id, from: acct(from), to: acct(to), amount, currency: "EUR", createdAt: now, ...extra })
  const id = (name: string) => `${run}.${name}`
  const cases: ReadonlyArray<Case> = [
    { name: "normal transfer", eventId: id("t1"), payload: transfer(id("t1"), "alice", "bob", 25_00), msgId: id("t1"), expected: "Committed" },
    { name: "normal transfer", eventId: id("t2"), payload: transfer(id("t2"), "bob", "carol", 10_00), msgId: id("t2"), expected: "Committed" },
    { name: "duplicate of t1", eventId: id("t1"), payload: transfer(id("t1"), "alice", "bob", 25_00), msgId: `${id("t1")}.again`, expected: "Duplicate" },
    { name: "malformed payload", eventId: "-", payload: `{"id": "${id("t4")}", "from": `, msgId: id("t4"), expected: "Rejected" },
    { name: "invalid amount", eventId: id("t5"), payload: transfer(id("t5"), "alice", "bob", -5), msgId: id("t5"), expected: "Rejected" },
    { name: "unknown account", eventId: id("t6"), payload: transfer(id("t6"), "alice", "nobody", 1_00), msgId: id("t6"), expected: "DeadLettered" },
    { name: "insufficient funds", eventId: id("t7"), payload: transfer(id("t7"), "carol", "alice", 1_000_00), msgId: id("t7"), expected: "DeadLettered" },
    { name: "expired transfer", eventId: id("t8"), payload: transfer(id("t8"), "alice", "carol", 5_00, { expiresAt: DateTime.subtract(now, { minutes: 1 }) }), msgId: id("t8"), expected: "Expired" },
    { name: "transient DB failure (x3)", eventId: id("t9"), payload: transfer(id("t9"), "bob", "alice", 7_00), msgId: id("t9"), expected: "Committed" }
  ]
  const accounts = ["alice", "bob", "carol"].map(acct)
  yield* openAccount(acct("alice"), "EUR", 100_00)
  yield* openAccount(acct("bob"), "EUR", 50_00)
  yield* openAccount(acct("carol"), "EUR", 0)
  yield* injectTransientFailure(id("t9"), 3)
  const before = yield* totalBalance(accounts)

  // Dead letters of this run only: the dead-letter stream may hold thousands from earlier runs
  // or real traffic, so read it from its current end (a stream not created yet starts at 1).
  const deadLetterStream = `${settings.stream}_DLQ`
  const { manager } = yield* NatsConnection.NatsConnection
  const deadLettersFrom = yield* Effect.tryPromise(() => manager.streams.info(deadLetterStream)).pipe(
    Effect.map((info) => info.state.last_seq + 1),
    Effect.orElseSucceed(() => 1)
  )

  // Publish everything (confirmed), remembering which stream sequence is which case.
  const bySequence = new Map<number, Case>()
  for (const c of cases) {
    const ack = yield* Publisher.publish(`${settings.subjectPrefix}.eur`, encoder.encode(c.payload), {
      msgId: c.msgId,
      stream: settings.stream
    })
    bySequence.set(ack.seq, c)
  }

  // Run the worker until every case has a final (non-Released) outcome.
  const seen = new Map<number, Array<Outcome.Outcome>>()
  const allSettled = yield* Deferred.make<void>()
  const onOutcome = (outcome: Outcome.Outcome) =>
    Effect.suspend(() => {
      if (!bySequence.has(outcome.message.sequence)) return Effect.void
      const list = seen.get(outcome.message.sequence) ?? []
      list.push(outcome)
      seen.set(outcome.message.sequence, list)
      const done = [...bySequence.keys()].every((seq) => (seen.get(seq) ?? []).some((o) => o._tag !== "Released"))
      return done ? Deferred.succeed(allSettled, undefined) : Effect.void
    })
  const worker = yield* Effect.forkChild(LedgerWorker.run(onOutcome))
  const settled = yield* Deferred.await(allSettled).pipe(Effect.timeoutOption("60 seconds"))
  yield* Fiber.interrupt(worker)

  // The applied events of this run's committed transfers, published by the outbox relay (which
  // runs beside the worker): stored once each, within a bound.
  const committed = cases.filter((c) => c.expected === "Committed").length
  const appliedCopies = () => manager.streams.info(settings.appliedStream, {
    subjects_filter: `${LedgerWorker.appliedSubject(settings, run)}.>`
  }).then((info) => Object.values(info.state.subjects ?? {}), () => [] as Array<number>)
  const applied = yield* Effect.promise(appliedCopies).pipe(
    Effect.repeat({ until: (copies) => copies.length >= committed, schedule: Schedule.spaced("100 millis") }),
    Effect.timeoutOption("10 seconds"),
    Effect.flatMap((copies) => copies._tag === "Some" ? Effect.succeed(copies.value) : Effect.promise(appliedCopies))
  )

  // Report.
  yield* Console.log(`\njetworker ledger demo (${run}): ${cases.length} transfers on ${settings.stream}\n`)
  yield* Console.log(`${pad("seq", 6)}${pad("case", 28)}${pad("outcome(s)", 30)}detail`)
  const problems: Array<string> = []
  for (const [seq, c] of bySequence) {
    const outcomes = seen.get(seq) ?? []
    const final = outcomes.find((o) => o._tag !== "Released")
    const trail = outcomes.map((o) => `${o._tag}${o.message.deliveryCount > 1 ? `#${o.message.deliveryCount}` : ""}`).join(" -> ")
    yield* Console.log(`${pad(String(seq), 6)}${pad(c.name, 28)}${pad(trail || "(none)", 30)}${final ? detail(final) : ""}`)
    if (final?._tag !== c.expected) problems.push(`${c.name} (#${seq}) ended ${final?._tag ?? "unsettled"}, expected ${c.expected}`)
  }
  const after = yield* totalBalance(accounts)
  const t1 = yield* transferCount(id("t1"))
  const dead = yield* DeadLetter.list(deadLetterStream, { from: deadLettersFrom, limit: 1000 }).pipe(
    Effect.map((list) => list.filter((m) => m.sourceStream === settings.stream && bySequence.has(m.sourceSequence)))
  )
  const expectedDead = cases.filter((c) => c.expected === "Rejected" || c.expected === "DeadLettered").length
  if (settled._tag === "None") problems.push("not every transfer settled within 60 seconds")
  if (before !== after) problems.push(`total money changed: ${before} -> ${after}`)
  if (t1 !== 1) problems.push(`transfer t1 recorded ${t1} times`)
  if (dead.length !== expectedDead) problems.push(`dead-letter stream holds ${dead.length} of ${expectedDead} failures`)
  if (applied.length !== committed || applied.some((n) => n !== 1)) {
    problems.push(`${settings.appliedStream} holds ${applied.length} applied events (copies: ${applied.join(", ")}), expected ${committed} stored once each`)
  }
  yield* Console.log(`\ntotal money before ${before}, after ${after}: ${before === after ? "unchanged" : "CHANGED"}`)
  yield* Console.log(`t1 applied ${t1} time(s); dead-letter stream ${settings.stream}_DLQ holds ${dead.length} of them`)
  yield* Console.log(`${applied.length} ledger.applied events on ${settings.appliedStream}, one per committed transfer, each stored ${applied.every((n) => n === 1) ? "once" : "MORE THAN ONCE"}`)
  if (problems.length > 0) {
    yield* Console.error(`\nFAILED:\n- ${problems.join("\n- ")}`)
    return yield* Effect.fail(new Error("demo checks failed"))
  }
  yield* Console.log("\nall checks passed")
})

// The table reports every outcome; the engine's own per-message warnings would repeat it.
const Quiet = Layer.succeed(References.MinimumLogLevel, "Error")

// The demo is a worker process too: the same entry point, resources and shutdown procedure as
// the ledger worker (its JSON lines after the table show the stages), without the health server.
Worker.runMain(program.pipe(Effect.provide(Quiet)), {
  layer: LedgerWorker.WorkerLive,
  readyWhen: "started",
  settings: { healthPort: "off", readinessGrace: Duration.zero }
})

/**
 * Prints which tests prove which requirement, read from the test names (a requirement test's name
 * starts with its id, e.g. `BE-JOB-002: concurrent redelivery ...`), and which of the standard's
 * Verification lines each test covers. With `--check` it exits 1 when a Verification line of a
 * requirement in scope has no test, or when a test names an unknown requirement.
 *
 *   node scripts/requirements-matrix.ts [--check]
 */
import { readdirSync, readFileSync, statSync } from "node:fs"
import { join, relative } from "node:path"

interface Verification {
  /** The Verification line, in the standard's words. */
  readonly line: string
  /** What a test name must contain (after its id) to count for this line. */
  readonly match: RegExp
}

interface Requirement {
  readonly id: string
  readonly title: string
  /** Whether the project claims it yet (a missing test fails `--check` only for these). */
  readonly inScope: boolean
  readonly verifications: ReadonlyArray<Verification>
}

const requirements: ReadonlyArray<Requirement> = [
  {
    id: "BE-JOB-001",
    title: "Ack after the result",
    inScope: true,
    verifications: [
      { line: "crash before the commit", match: /crash(ed)? before the commit/i },
      { line: "crash after the commit", match: /crash(ed)? after the commit/i },
      { line: "unavailable store", match: /store (is )?unavailable/i },
      { line: "unavailable broker", match: /broker (is )?unavailable/i },
      { line: "the ack matched to the transaction boundary", match: /transaction boundary/i }
    ]
  },
  {
    id: "BE-JOB-002",
    title: "Idempotent reprocessing",
    inScope: true,
    verifications: [
      { line: "sequential redelivery", match: /sequential redelivery/i },
      { line: "concurrent redelivery", match: /concurrent redelivery/i },
      { line: "restart between the effect and the ack", match: /restart between the effect and the ack/i },
      { line: "atomicity of deduplication", match: /atomicity of deduplication/i }
    ]
  },
  {
    id: "BE-JOB-003",
    title: "Bounded retries and a terminal outcome",
    inScope: true,
    verifications: [
      { line: "transient error", match: /transient error/i },
      { line: "permanent error", match: /permanent error/i },
      { line: "reaching the limit and the observable terminal outcome", match: /attempts limit/i },
      { line: "writing to the dead-letter channel", match: /dead-letter write/i },
      { line: "controlled replay", match: /controlled replay/i }
    ]
  },
  {
    id: "BE-JOB-004",
    title: "Ordering and concurrency",
    inScope: true,
    verifications: [
      { line: "permuted delivery", match: /permuted/i },
      { line: "parallel delivery", match: /parallel delivery|in parallel/i },
      { line: "two messages with the same key", match: /same key/i },
      { line: "load test of the prefetch limit", match: /load test of the prefetch/i },
      { line: "load test of the queue limits", match: /load test of the queue limits/i },
      { line: "sequential processing as an explicitly declared model", match: /sequential processing/i }
    ]
  },
  {
    id: "BE-JOB-005",
    title: "Work expiry",
    inScope: true,
    verifications: [
      { line: "delivery before and after expiry", match: /before and after expiry|after expiry/i },
      { line: "expiry while waiting for a dependency", match: /while waiting/i },
      { line: "no business effect plus a separate expiry metric", match: /expiry metric/i },
      { line: "producer/consumer clock consistency", match: /clock/i }
    ]
  },
  {
    id: "BE-JOB-006",
    title: "Ownership of reserved work",
    inScope: true,
    verifications: [
      { line: "pause longer than the reservation", match: /pause longer/i },
      { line: "failed extension", match: /failed extension/i },
      { line: "delayed extension", match: /delayed extension/i },
      { line: "old and new owner running concurrently", match: /old and new owner/i },
      { line: "no ack after ownership is lost", match: /ownership is lost|lease (is )?lost/i }
    ]
  },
  {
    id: "BE-JOB-007",
    title: "Independent results in a batch",
    inScope: true,
    verifications: [
      { line: "failure of the first element", match: /failure of the first element/i },
      { line: "failure of the middle element", match: /failure of the middle element/i },
      { line: "failure of the last element", match: /failure of the last element/i },
      { line: "a poison element isolated without blocking the rest", match: /poison element/i },
      { line: "crash after a partial commit", match: /partial commit/i },
      { line: "redelivery of the whole batch", match: /whole batch/i },
      { line: "individual acks or durable per-element results", match: /individual acks|per-element/i }
    ]
  },
  {
    id: "INT-NATS-002",
    title: "Stream and consumer contract",
    inScope: true,
    verifications: [
      { line: "review of subjects and expectations", match: /review of subjects/i },
      { line: "AckWait/BackOff, MaxDeliver and MaxAckPending compared against timeouts, idempotency and capacity", match: /compared against timeouts/i },
      { line: "redelivery, exhaustion and terminal result", match: /exhaustion and terminal result/i },
      { line: "recovery of the consumer position and draining the consumer", match: /consumer position/i }
    ]
  },
  {
    id: "INT-NATS-007",
    title: "Confirmed JetStream publish",
    inScope: true,
    verifications: [
      { line: "positive and negative PubAck", match: /positive and negative PubAck/i },
      { line: "timeout and reconnect after a publish that was in fact stored", match: /timeout and reconnect/i },
      { line: "retry with the same id and the same Nats-Msg-Id", match: /same id and the same Nats-Msg-Id/i },
      { line: "retry before and after the duplicate window boundary", match: /before and after the duplicate window/i },
      { line: "the republish horizon compared with the dedup setting", match: /republish horizon/i }
    ]
  },
  {
    id: "BE-SHUT-001",
    title: "One shutdown procedure",
    inScope: true,
    verifications: [
      { line: "one stop signal", match: /one stop signal/i },
      { line: "repeated stop signals", match: /repeated (and concurrent )?stop signals/i },
      { line: "concurrent stop signals", match: /concurrent stop signals/i },
      { line: "each stage runs exactly once", match: /each stage runs exactly once/i },
      { line: "a business failure stays isolated from the process lifecycle", match: /business failure stays isolated/i }
    ]
  },
  {
    id: "BE-SHUT-002",
    title: "Stop admitting new work",
    inScope: true,
    verifications: [
      { line: "readiness change", match: /readiness turns 503/i },
      { line: "intake stop", match: /intake stops/i },
      { line: "a message arriving during shutdown", match: /message arriving during shutdown/i },
      { line: "review that application, probe and orchestrator timings agree", match: /timings agree/i }
    ]
  },
  {
    id: "BE-SHUT-003",
    title: "Drain in-flight work",
    inScope: true,
    verifications: [
      { line: "long job and message handling", match: /long (job|message handling)/i },
      { line: "budget expiry", match: /budget expiry/i },
      { line: "cancellation", match: /cancels/i },
      { line: "redelivery", match: /redelivered/i },
      { line: "no success and no ack before the commit", match: /no success and no ack before the commit/i }
    ]
  },
  {
    id: "BE-SHUT-004",
    title: "Bounded shutdown budget",
    inScope: true,
    verifications: [
      { line: "automated check of the application's and the runtime environment's configuration", match: /configuration check/i },
      { line: "a hung operation", match: /hung operation/i },
      { line: "an unavailable dependency", match: /black-holed (database|broker|dependency)/i },
      { line: "the real time until the process exits", match: /exits inside the budget/i }
    ]
  },
  {
    id: "BE-SHUT-005",
    title: "Resource close order",
    inScope: true,
    verifications: [
      { line: "integration test of the order of lifecycle events", match: /lifecycle events in order/i },
      { line: "running work that uses the database, the broker and an external client", match: /database, the broker and an external client/i },
      { line: "one owner for each closed resource", match: /closed once by its owner/i }
    ]
  },
  {
    id: "BE-SHUT-006",
    title: "Telemetry shutdown",
    inScope: true,
    verifications: [
      { line: "shutdown with full buffers", match: /full (telemetry )?buffers/i },
      { line: "a slow receiver for each channel", match: /slow receiver/i },
      { line: "an unreachable receiver for each channel", match: /unreachable receiver/i },
      { line: "the total budget holds", match: /budget holds/i }
    ]
  },
  {
    id: "BE-SHUT-007",
    title: "Result and observability of shutdown",
    inScope: true,
    verifications: [
      { line: "successful shutdown", match: /successful shutdown/i },
      { line: "failed shutdown", match: /failed shutdown/i },
      { line: "overrun shutdown", match: /overrun shutdown/i },
      { line: "exit code", match: /exit code/i },
      { line: "uniqueness of the events", match: /exactly one started and one completed event/i },
      { line: "the schema and duration of the completion event", match: /schema and the real duration/i }
    ]
  }
]

const ROOT = new URL("..", import.meta.url).pathname
const SKIP = new Set(["node_modules", ".git", ".tools", ".tmp", "dist"])

const testFiles = (dir: string): Array<string> =>
  readdirSync(dir).flatMap((name) => {
    if (SKIP.has(name)) return []
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return testFiles(path)
    return name.endsWith(".test.ts") ? [path] : []
  })

interface TestName {
  readonly file: string
  readonly name: string
}

// `it("...")`, `it.effect("...")`, `it.effect.each(...)("...")`, `test("...")`, with any quote.
const TEST_CALL = /\b(?:it|test)(?:\.[A-Za-z]+)*(?:\([^()]*\))?\(\s*(["'`])((?:\\.|(?!\1)[^\\])*)\1/g

const names: Array<TestName> = testFiles(ROOT).flatMap((file) => {
  const text = readFileSync(file, "utf8")
  return [...text.matchAll(TEST_CALL)].map((m) => ({ file: relative(ROOT, file), name: m[2]!.replace(/\s+/g, " ") }))
})

// A test may name several requirements: `BE-SHUT-002, BE-SHUT-004: ...`.
const ONE_ID = "(?:BE-JOB|BE-SHUT|INT-NATS|INT-EVT)-\\d{3}"
const IDS = new RegExp(`^(${ONE_ID}(?:,\\s*${ONE_ID})*)\\b`)
const known = new Map(requirements.map((r) => [r.id, r]))
const problems: Array<string> = []
const byId = new Map<string, Array<TestName>>()
/** What a test claims about a requirement: its name without the ids. */
const claim = (test: TestName): string => test.name.replace(IDS, "")
for (const test of names) {
  const ids = IDS.exec(test.name)?.[1]?.split(/,\s*/)
  if (ids === undefined) continue
  for (const id of ids) {
    if (!known.has(id)) problems.push(`${test.file}: "${test.name}" names unknown requirement ${id}`)
    const list = byId.get(id) ?? []
    list.push(test)
    byId.set(id, list)
  }
}

const lines: Array<string> = []
let proven = 0
let needed = 0
const fullyProven: Array<string> = []
for (const requirement of requirements) {
  const tests = byId.get(requirement.id) ?? []
  const everyClause = requirement.verifications.length > 0 &&
    requirement.verifications.every((v) => tests.some((t) => v.match.test(claim(t))))
  if (everyClause) fullyProven.push(requirement.id)
  lines.push(`\n${requirement.id} ${requirement.title}${requirement.inScope ? "" : " (not yet in scope)"}: ${tests.length} test(s)`)
  for (const verification of requirement.verifications) {
    const covering = tests.filter((t) => verification.match.test(claim(t)))
    if (requirement.inScope) {
      needed++
      if (covering.length > 0) proven++
      else problems.push(`${requirement.id}: no test for the Verification line "${verification.line}"`)
    }
    lines.push(`  ${covering.length > 0 ? "✓" : requirement.inScope ? "✗" : "·"} ${verification.line}`)
    for (const t of covering) lines.push(`      ${t.file}: ${t.name}`)
  }
  const unmatched = tests.filter((t) =>
    !requirement.verifications.some((v) => v.match.test(claim(t)))
  )
  for (const t of unmatched) lines.push(`    (also) ${t.file}: ${t.name}`)
}

console.log(`Requirement -> test matrix (${names.length} tests in ${new Set(names.map((n) => n.file)).size} files)`)
console.log(lines.join("\n"))
console.log(`\nVerification lines in scope with a test: ${proven}/${needed}`)
console.log(
  `Requirements with a test for every Verification clause: ${fullyProven.length}/${requirements.length}` +
    (fullyProven.length > 0 ? ` (${fullyProven.join(", ")})` : "")
)
if (problems.length > 0) {
  console.log(`\nProblems:\n- ${problems.join("\n- ")}`)
  if (process.argv.includes("--check")) process.exit(1)
}

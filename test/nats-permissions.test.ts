/**
 * The least-privilege NATS permissions of `docs/nats-permissions.md`, run as written: the test
 * reads the page's `conf` blocks, starts a private nats-server (JetStream, its own store, removed
 * with the scope) whose users have exactly those permissions, and does as each role what jetworker
 * does for it. The worker that declares its streams applies its contract (create, then update) and
 * publishes as its outbox relay; the consumer worker commits a message, naks one for a retry,
 * dead-letters a poison one, extends the lease of a handler that outlives its ack wait, stores a
 * message the server gave up on (a MaxDeliver advisory), and gives its dead-letter and capture
 * streams back the subjects it needs; the producer publishes with and without naming the stream and
 * relays an outbox row twice; the operator checks, diffs and applies the contract and lists,
 * shows, replays, purges and recovers dead letters. No refusal is logged meanwhile. Then what a
 * missing permission looks like: a worker that may not create its dead-letter stream, a producer
 * publishing where it may not, a worker that may not ack, and one that may not pull.
 *
 * The page's names (ORDERS, shipping, SHIPMENTS) are used as they are: the server is this test's
 * own, so they collide with nothing.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Outbox, type Outcome, Retry, type Source } from "@jetworker/core"
import { Contract, DeadLetter, JetStreamSource, MaxDeliveries, NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Eventually, NatsServer, OutcomeLog } from "@jetworker/testing"
import { Context, Data, DateTime, Duration, Effect, Fiber, Layer, Logger, Redacted, Schema } from "effect"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { watchAcks } from "./support/acks.ts"

const page = readFileSync(fileURLToPath(new URL("../docs/nats-permissions.md", import.meta.url)), "utf8")

/** The page's `conf` blocks, as written. */
const blocks = [...page.matchAll(/```conf\n([\s\S]*?)```/g)].map((match) => match[1]!)

/** The text inside the `[...]` that opens at `open` in `text` (brackets matched; subjects hold none). */
const bracketed = (text: string, open: number): string => {
  let depth = 0
  for (let i = open; i < text.length; i++) {
    if (text[i] === "[") depth++
    else if (text[i] === "]" && --depth === 0) return text.slice(open + 1, i)
  }
  throw new Error(`unbalanced brackets in ${text}`)
}

/** The entry of `user` in the page's `authorization { users: [...] }` block for that user. */
const userEntry = (user: string): string => {
  const block = blocks.find((text) => text.includes(`user: ${user},`))
  if (block === undefined) throw new Error(`docs/nats-permissions.md has no conf block for user ${user}`)
  return bracketed(block, block.indexOf("[", block.indexOf("users:"))).trim()
}

/** The subjects `user` may publish to, or subscribe to (`which`), as the page lists them. */
const allowed = (user: string, which: "publish" | "subscribe"): ReadonlyArray<string> => {
  const entry = userEntry(user)
  const list = bracketed(entry, entry.indexOf("[", entry.indexOf(`${which}:`)))
  return [...list.matchAll(/^\s*(?:\[\s*)?"([^"]+)"/gm)].map((match) => match[1]!)
}

const roles = ["shipping-worker", "shipping-service", "shipments-relay", "jetworker-operator"] as const
const passwordVariable = (user: string) => `${user.toUpperCase().replaceAll("-", "_")}_PASSWORD`
const password = (user: string) => `pw-${user}`

/** `user`'s entry without one of its lines (`subject`), as user `name` (with `user`'s password). */
const without = (user: string, subject: string, name: string): string => {
  const entry = userEntry(user)
  const line = `"${subject}"`
  if (!entry.split("\n").some((l) => l.trim() === line)) throw new Error(`the page does not grant ${user} ${subject} on a line of its own`)
  return entry.replace(`user: ${user},`, `user: ${name},`).split("\n").filter((l) => l.trim() !== line).join("\n")
}

/** The server's configuration: the page's users as written, their passwords, an admin, and the negative cases. */
const serverConfig = (): string =>
  [
    // The page reads each password from a variable; defined here, as the environment would.
    ...roles.map((user) => `${passwordVariable(user)}: "${password(user)}"`),
    "authorization {",
    "  users: [",
    "    { user: admin, password: admin }",
    ...roles.map(userEntry),
    without("shipping-worker", "$JS.ACK.ORDERS.shipping.>", "shipping-worker-noack"),
    without("shipping-worker", "$JS.API.STREAM.CREATE.ORDERS_DLQ", "shipping-worker-nodlq"),
    without("shipping-worker", "$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping", "shipping-worker-nopull"),
    "  ]",
    "}"
  ].join("\n")

const Job = Schema.Struct({ id: Schema.String, kind: Schema.Literals(["ok", "retry", "poison", "slow"]) })
class Flaky extends Data.TaggedError("Flaky")<{ readonly message: string }> {}
class Poison extends Data.TaggedError("Poison")<{ readonly message: string }> {}

const encoder = new TextEncoder()
const ackWait = "3 seconds"
/** Longer than the ack wait: only the engine's lease extensions (+WPI) keep the message. */
const slowMillis = 4_500

/** ORDERS and shipping as the service first declares them (no filter, as the reference worker). */
const declared: Contract.Contract = {
  version: "1",
  ownership: "service",
  stream: { name: "ORDERS", subjects: ["orders.>"], duplicateWindow: "2 minutes" },
  consumers: [{
    name: "shipping",
    ackWait,
    maxDeliver: 10,
    maxAckPending: 100,
    expect: { attempts: 3, concurrency: 4, prefetch: 4, maxProcessingTime: "10 seconds" }
  }]
}

/**
 * Then with settings changed: an update of each. (Not a filter added to the live consumer: on NATS
 * 2.9.10 a durable given a wildcard filter by an update delivers nothing more.)
 */
const contract: Contract.Contract = {
  ...declared,
  stream: { ...declared.stream, duplicateWindow: "1 minute" },
  consumers: [{ ...declared.consumers[0]!, maxAckPending: 200 }]
}

/** Log lines as text, with their annotations (the logger replaces the others). */
const collecting = () => {
  const lines: Array<string> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    const part = (value: unknown) => (typeof value === "object" && value !== null ? JSON.stringify(value) : String(value))
    const message = Array.isArray(entry.message) ? entry.message.map(part).join(" ") : part(entry.message)
    lines.push(`${entry.level} ${message} ${JSON.stringify(entry.annotations)}`)
  })
  return { lines, layer: Logger.layer([logger]) }
}

describe("NATS permissions (docs/nats-permissions.md)", () => {
  it("the page has a block for each role; the worker that declares its streams has every permission of the consumer worker", () => {
    for (const user of roles) assert.include(userEntry(user), `password: $${passwordVariable(user)}`)
    for (const which of ["publish", "subscribe"] as const) {
      const service = allowed("shipping-service", which)
      const missing = allowed("shipping-worker", which).filter((subject) => !service.includes(subject))
      assert.deepStrictEqual(missing, [], `shipping-service lacks the consumer worker's ${which} permissions`)
    }
    assert.include(allowed("shipping-worker", "publish"), "$JS.ACK.ORDERS.shipping.>")
    assert.deepStrictEqual(allowed("shipments-relay", "subscribe"), ["_INBOX.>"])
  })

  it.live("each role works with exactly its documented permissions, and a missing one fails naming it", () => {
    const logged = collecting()
    return Effect.gen(function*() {
      const server = yield* NatsServer.make({ config: serverConfig() })
      const as = (user: string, pw = password(user)) =>
        Layer.build(NatsConnection.layer({ servers: server.url, name: user, user, password: Redacted.make(pw) }))
      const admin = yield* as("admin", "admin")
      const { jetstream, manager } = Context.get(admin, NatsConnection.NatsConnection)
      const messages = (stream: string) => Effect.promise(() => manager.streams.info(stream).then((info) => info.state.messages))
      const violations = () => logged.lines.filter((line) => /permissions violation/i.test(line))

      /** What a producer does: publish to a named stream and to a found one, check the horizon, relay a row twice. */
      const produce = (id: string) =>
        Effect.gen(function*() {
          const stored = yield* messages("SHIPMENTS")
          const named = yield* Publisher.publish(`shipments.${id}`, encoder.encode("{}"), { msgId: `${id}-1`, stream: "SHIPMENTS" })
          const found = yield* Publisher.publish(`shipments.${id}`, encoder.encode("{}"), { msgId: `${id}-2` })
          assert.deepStrictEqual([named.stream, found.stream], ["SHIPMENTS", "SHIPMENTS"])
          assert.isTrue((yield* Publisher.checkHorizon("SHIPMENTS")).covered)
          const outbox = yield* Layer.build(Publisher.outboxPublisher({ stream: "SHIPMENTS" }))
          const publisher = Context.get(outbox, Outbox.OutboxPublisher)
          yield* publisher.checkRelay!({ maxMessageBytes: 1024, roundBudget: Duration.seconds(1) })
          const row = { subject: `shipments.${id}`, id: `${id}-3`, payload: encoder.encode("{\"n\":3}") }
          yield* publisher.publish(row, undefined)
          // Published again (a relay killed before marking the row): a duplicate, read back and compared.
          yield* publisher.publish(row, undefined)
          assert.strictEqual(yield* messages("SHIPMENTS"), stored + 3)
        })

      // The worker that declares its streams (as examples/ledger): its contract created, then
      // updated; its events' stream created, then updated; its outbox relay's publishes.
      yield* Effect.gen(function*() {
        const created = yield* Contract.apply(declared)
        assert.deepStrictEqual(created.map((c) => `${c.action} ${c.target}`), ["create stream ORDERS", "create consumer ORDERS/shipping"])
        const updated = yield* Contract.apply(contract)
        assert.deepStrictEqual(updated.map((c) => `${c.action} ${c.setting}`), ["update duplicate_window", "update max_ack_pending"])
        yield* Topology.ensureStream({ name: "SHIPMENTS", subjects: ["shipments.>"], duplicateWindow: "2 minutes" })
        yield* Topology.ensureStream({ name: "SHIPMENTS", subjects: ["shipments.>"], duplicateWindow: "2 minutes", maxAge: "7 days" })
        yield* produce("svc")
      }).pipe(Effect.provide(yield* as("shipping-service")))

      const log = yield* OutcomeLog.make
      const runs = new Map<string, number>()
      const consumer = (settleTimeout: Duration.Input, onOutcome: (outcome: Outcome.Outcome) => Effect.Effect<void>) =>
        Consumer.make({
          name: "shipping",
          source: JetStreamSource.make({ stream: "ORDERS", consumer: "shipping", lagInterval: "500 millis", settleTimeout }),
          schema: Job,
          metadata: (job) => ({ id: job.id, time: DateTime.makeUnsafe(0) }),
          handle: (job) =>
            Effect.gen(function*() {
              const run = (runs.get(job.id) ?? 0) + 1
              runs.set(job.id, run)
              if (job.kind === "retry" && run === 1) return yield* new Flaky({ message: "first run fails" })
              if (job.kind === "poison") return yield* new Poison({ message: "never works" })
              if (job.kind === "slow") yield* Effect.sleep(Duration.millis(slowMillis))
            }),
          classify: { Flaky: "transient", Poison: "permanent" },
          retry: Retry.exponential({ attempts: 3, base: "100 millis", cap: "1 second", inProcessRetries: 0 }),
          concurrency: 4,
          prefetch: 4,
          drainTimeout: "2 seconds",
          onOutcome
        })

      // A consumer worker that may not create its dead-letter stream: its start fails at once, naming the subject.
      const noDlq = yield* Consumer.run(consumer("5 seconds", () => Effect.void)).pipe(
        Effect.provide(yield* as("shipping-worker-nodlq", password("shipping-worker"))),
        Effect.timeout("15 seconds"),
        Effect.flip
      )
      assert.include(noDlq.message, "Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.ORDERS_DLQ\"")
      yield* Eventually.holds("the refusal logged", Effect.sync(() => violations().length === 1), "5 seconds")
      const expectedViolations = violations().length

      // The consumer worker, which declares nothing of ORDERS: commit, nak, dead letter, extensions.
      const acks = yield* watchAcks("ORDERS", "shipping").pipe(Effect.provide(admin))
      const worker = yield* as("shipping-worker")
      const running = yield* Effect.forkChild(Consumer.run(consumer("5 seconds", log.record)).pipe(Effect.provide(worker)))
      const publish = (id: string, kind: string) =>
        Effect.promise(() => jetstream.publish(`orders.${kind}`, encoder.encode(JSON.stringify({ id, kind })), { msgID: id })).pipe(
          Effect.map((ack) => ack.seq)
        )
      const seq = {
        ok: yield* publish("o1", "ok"),
        retry: yield* publish("o2", "retry"),
        poison: yield* publish("o3", "poison"),
        slow: yield* publish("o4", "slow")
      }
      const outcomes = yield* log.waitUntil(
        (all) =>
          ["o1", "o2", "o4"].every((id) => all.some((o) => o.message.eventId === id && o._tag === "Committed")) &&
          all.some((o) => o.message.eventId === "o3" && o._tag === "DeadLettered"),
        "30 seconds",
        "the four jobs settled"
      )
      const trail = (id: string) =>
        outcomes.filter((o) => o.message.eventId === id).map((o) => `${o._tag}@${o.message.deliveryCount}${o.confirmed ? "" : " unconfirmed"}`)
      assert.deepStrictEqual(trail("o1"), ["Committed@1"])
      assert.deepStrictEqual(trail("o2"), ["Released@1", "Committed@2"], "naked, redelivered, committed")
      assert.deepStrictEqual(trail("o3"), ["DeadLettered@1"], "the dead letter stored, the original terminated")
      assert.deepStrictEqual(trail("o4"), ["Committed@1"], "the slow job kept its lease past the ack wait")
      assert.isAtLeast(acks.filter((a) => a.sequence === seq.slow && a.body === "+WPI").length, 2, JSON.stringify(acks))
      assert.isTrue(acks.some((a) => a.sequence === seq.retry && a.body.startsWith("-NAK")), JSON.stringify(acks))
      assert.isTrue(acks.some((a) => a.sequence === seq.poison && a.body === "+TERM"), JSON.stringify(acks))
      assert.strictEqual(yield* messages("ORDERS_DLQ"), 1)

      // A MaxDeliver advisory, as the server publishes it (here the admin does): the worker's capture
      // stream keeps it, and the worker stores the message as a dead letter and removes the advisory.
      const capture = MaxDeliveries.captureStream("ORDERS", "shipping")
      yield* Effect.promise(() =>
        jetstream.publish(
          MaxDeliveries.advisorySubject("ORDERS", "shipping"),
          encoder.encode(JSON.stringify({ type: "io.nats.jetstream.advisory.v1.max_deliver", stream: "ORDERS", consumer: "shipping", stream_seq: seq.ok, deliveries: 10 }))
        )
      )
      yield* Eventually.holds(
        "the advisory's message stored as a dead letter, the advisory removed",
        Effect.map(Effect.all([messages("ORDERS_DLQ"), messages(capture)]), ([dead, captured]) => dead === 2 && captured === 0),
        "15 seconds"
      )
      yield* Fiber.interrupt(running).pipe(Effect.timeout("15 seconds"))

      // Its dead-letter and capture streams changed by someone else: its next start gives them back
      // the subjects it needs (an update of each).
      const subjectsOf = (stream: string) => Effect.promise(() => manager.streams.info(stream).then((info) => info.config.subjects))
      yield* Effect.promise(() => manager.streams.update("ORDERS_DLQ", { subjects: ["ops.dead.>"] }))
      yield* Effect.promise(() => manager.streams.update(capture, { subjects: ["ops.captured"] }))
      const restarted = yield* OutcomeLog.make
      const again = yield* Effect.forkChild(Consumer.run(consumer("5 seconds", restarted.record)).pipe(Effect.provide(worker)))
      yield* Eventually.poll(
        "the streams' subjects given back (dead-letter stream, capture stream)",
        Effect.all([subjectsOf("ORDERS_DLQ"), subjectsOf(capture)]),
        ([dlq, captured]) => dlq.includes("jetworker.dlq.ORDERS.>") && captured.join() === MaxDeliveries.advisorySubject("ORDERS", "shipping"),
        { timeout: "15 seconds" }
      )
      yield* Eventually.holds("the consumer started", Effect.sync(() => logged.lines.filter((l) => l.includes("consumer shipping started")).length === 2), "15 seconds")
      yield* Fiber.interrupt(again).pipe(Effect.timeout("15 seconds"))

      // The producer (an outbox relay).
      const relay = yield* as("shipments-relay")
      yield* produce("relay").pipe(Effect.provide(relay))

      // The operator's CLI: contract check, diff and apply; dead letters listed, shown, replayed, purged, recovered.
      yield* Effect.gen(function*() {
        assert.deepStrictEqual((yield* Contract.check(contract)).filter((f) => f.severity === "error"), [])
        assert.deepStrictEqual(yield* Contract.plan(contract), [])
        const reapplied = yield* Contract.apply(declared)
        assert.deepStrictEqual(reapplied.map((c) => `${c.action} ${c.setting}`), ["update duplicate_window", "update max_ack_pending"])
        const listed = yield* DeadLetter.list("ORDERS_DLQ")
        assert.deepStrictEqual(listed.map((m) => [m.sourceSequence, m.reason]), [[seq.poison, "PermanentError"], [seq.ok, "DeliveriesExhausted"]])
        const shown = yield* DeadLetter.read("ORDERS_DLQ", listed[0]!.sequence)
        assert.strictEqual(shown.subject, "orders.poison")
        const replayed = yield* DeadLetter.replay("ORDERS_DLQ", listed[0]!.sequence)
        assert.strictEqual(replayed.stream, "ORDERS")
        yield* DeadLetter.discard("ORDERS_DLQ", listed[1]!.sequence)
        assert.strictEqual(yield* messages("ORDERS_DLQ"), 0)
        const recovered = yield* DeadLetter.recover({ stream: "ORDERS", consumer: "shipping", sequence: seq.retry, deadLetter: { create: false } })
        assert.deepStrictEqual([recovered.stream, recovered.duplicate], ["ORDERS_DLQ", false])
        assert.strictEqual(yield* messages("ORDERS_DLQ"), 1)
      }).pipe(Effect.provide(yield* as("jetworker-operator")))

      // Nothing refused to the documented users (a refusal jetworker swallows is still logged).
      assert.deepStrictEqual(violations().slice(expectedViolations), [], "no permission refused to the documented users")
      const unhandled = logged.lines.filter((l) => l.includes("cannot subscribe") || l.includes("not handled yet"))
      assert.deepStrictEqual(unhandled, [])

      // The producer where it may not publish: refused at once (not retried), naming the subject.
      // (Its reason is `Unknown`: nats.js rejects the request with a RequestError around the refusal.)
      const refused = yield* Effect.flip(Publisher.publish("orders.x", encoder.encode("{}"), { msgId: "x1" }).pipe(Effect.provide(relay)))
      assert.isFalse(refused.isRetryable)
      assert.strictEqual(refused.message, "Permissions Violation for Publish to \"orders.x\"")

      // The consumer worker without `$JS.ACK.ORDERS.shipping.>`: its first ack is refused at once
      // (not after its 20 s settle timeout), and the consumer stops with what to grant instead of
      // handling messages whose results can never be acknowledged.
      // The dead letter the operator replayed waits on the consumer: acked here, so the worker
      // without acks is given n1 alone.
      const drained = yield* Effect.promise(async () => {
        const pull = await jetstream.consumers.get("ORDERS", "shipping")
        const taken = await pull.fetch({ max_messages: 10, expires: 2_000 })
        const subjects: Array<string> = []
        for await (const msg of taken) {
          subjects.push(msg.subject)
          await msg.ackAck()
        }
        return subjects
      })
      assert.deepStrictEqual(drained, ["orders.poison"])
      const before = logged.lines.length
      const since = () => logged.lines.slice(before)
      const denied = yield* OutcomeLog.make
      const noAck = yield* as("shipping-worker-noack", password("shipping-worker"))
      const deniedRun = yield* Effect.forkChild(Consumer.run(consumer("20 seconds", denied.record)).pipe(Effect.provide(noAck)))
      const n1 = yield* publish("n1", "ok")
      const first = yield* denied.waitUntil((all) => all.some((o) => o.message.eventId === "n1"), "10 seconds", "the job's outcome")
      const stoppedWith = yield* Fiber.join(deniedRun).pipe(Effect.timeout("10 seconds"), Effect.flip)
      // The ack's own failure is the refusal, naming the subject; the outcome is unconfirmed.
      assert.deepStrictEqual(
        first.filter((o) => o.message.eventId === "n1").map((o) => [o._tag, o.message.deliveryCount, o.confirmed]),
        [["Committed", 1, false]]
      )
      // The server's refusal, logged from the connection (event nats.error), and the ack's.
      const ackRefusal = /^WARN nats connection error: Permissions Violation for Publish to "\$JS\.ACK\.ORDERS\.shipping\.1\.\d+\./
      const refusedAck = `Ack ORDERS#${n1}: Permissions Violation for Publish to \\"$JS.ACK.ORDERS.shipping.1.${n1}.`
      yield* Eventually.holds(
        "the refusal logged, and the outcome",
        Effect.sync(() =>
          since().some((line) => ackRefusal.test(line) && line.includes("\"event\":\"nats.error\"")) &&
          since().some((line) => line.startsWith("WARN Committed shipping#") && line.includes("(n1), ack unconfirmed")) &&
          since().some((line) => line.includes(refusedAck))
        ),
        "5 seconds"
      ).pipe(Effect.tapError(() => Effect.sync(() => console.error(since().join("\n")))))
      assert.notInclude(since().join("\n"), "no reply within")
      // The consumer stops: NotAuthorized, naming the refused subject and the permission to grant.
      assert.strictEqual(stoppedWith._tag, "SourceError", String(stoppedWith))
      const failure = stoppedWith as Source.SourceError
      assert.strictEqual(failure.reason, "NotAuthorized")
      assert.include(failure.message, `Permissions Violation for Publish to "$JS.ACK.ORDERS.shipping.1.${n1}.`)
      assert.include(failure.message, `publish permission on "$JS.ACK.ORDERS.shipping.>"`)
      // Handled once: nothing more was taken once the ack was refused.
      assert.strictEqual(runs.get("n1"), 1)

      // The consumer worker without `$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping`: its first pull is
      // refused, and the consumer stops at once with what to grant (before, it stalled and checked
      // the consumer for ever, saying only `intake.stalled`).
      const noPull = yield* as("shipping-worker-nopull", password("shipping-worker"))
      const started = performance.now()
      const pullRefused = yield* Consumer.run(consumer("20 seconds", () => Effect.void)).pipe(
        Effect.provide(noPull),
        Effect.timeout("10 seconds"),
        Effect.flip
      )
      assert.isBelow(performance.now() - started, 10_000)
      assert.strictEqual(pullRefused._tag, "SourceError", String(pullRefused))
      assert.strictEqual((pullRefused as Source.SourceError).reason, "NotAuthorized")
      assert.include(
        (pullRefused as Source.SourceError).message,
        `ORDERS/shipping: NATS refuses this connection's pulls (Permissions Violation for Publish to "$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping")`
      )
      assert.include((pullRefused as Source.SourceError).message, `publish permission on "$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping"`)
      assert.strictEqual(runs.get("n1"), 1, "nothing handled without a pull")
    }).pipe(Effect.scoped, Effect.provide(logged.layer))
  }, 90_000)
})

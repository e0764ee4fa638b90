/**
 * A pull consumer's limits on pull requests (`max_batch`, `max_expires`, `max_waiting`,
 * `max_bytes`) against the intake's pulls (`{ batch: up to prefetch, expires: pullExpires }`): the
 * server's real answer to such a pull first (nats-server 2.9 refuses it with a 409), then the
 * contract's findings, which must say so before the intake runs into it.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { AckPolicy, type ConsumerConfig } from "@nats-io/jetstream"
import { Contract, JetStreamSource, NatsConnection, Topology } from "@jetworker/nats"
import { createInbox } from "@nats-io/transport-node"
import { Duration, Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A stream name of this run, deleted with the test's scope. */
const freshStream = Effect.gen(function*() {
  const name = `CPL_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`.toUpperCase()
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return name
})

const expect = { attempts: 5, concurrency: 4, prefetch: 16 }

const contractFor = (stream: string, expectations: Contract.Expectations = expect): Contract.Contract => ({
  version: "1",
  ownership: "platform",
  stream: { name: stream, subjects: [`${stream.toLowerCase()}.>`] },
  consumers: [{ name: "shipper", ackWait: "30 seconds", maxDeliver: 11, expect: expectations }]
})

/**
 * The stream and a consumer `shipper` as `contractFor` declares it, with the pull limits `limits`
 * (set at creation: NATS 2.9 refuses to change `max_waiting` later), and one message in the stream.
 */
const declare = (limits: Partial<ConsumerConfig>) =>
  Effect.gen(function*() {
    const stream = yield* freshStream
    const { connection, manager } = yield* NatsConnection.NatsConnection
    yield* Topology.ensureStream(contractFor(stream).stream)
    yield* Effect.promise(() =>
      manager.consumers.add(stream, {
        durable_name: "shipper",
        ack_policy: AckPolicy.Explicit,
        ack_wait: 30_000_000_000,
        max_deliver: 11,
        ...limits
      })
    )
    yield* Effect.promise(() => connection.request(`${stream.toLowerCase()}.orders`, "one", { timeout: 5_000 }))
    return stream
  })

/** The first answer to one pull request: `message` or the status (`409 Exceeded ...`), within 5 seconds. */
const firstAnswer = (stream: string, request: object) =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const inbox = createInbox()
    return yield* Effect.acquireUseRelease(
      Effect.sync(() => connection.subscribe(inbox)),
      (subscription) =>
        Effect.promise(async () => {
          connection.publish(`$JS.API.CONSUMER.MSG.NEXT.${stream}.shipper`, JSON.stringify(request), { reply: inbox })
          for await (const msg of subscription) {
            const code = msg.headers?.code ?? 0
            if (code === 100) continue // an idle heartbeat
            return code === 0 ? "message" : `${code} ${msg.headers?.description ?? ""}`
          }
          return "closed"
        }).pipe(Effect.timeout("5 seconds")),
      (subscription) => Effect.sync(() => subscription.unsubscribe())
    )
  })

/** The intake's pull of `batch` waiting `expires` (as JetStreamSource sends it). */
const intakePull = (batch: number, expires: Duration.Input) => {
  const nanos = Duration.toMillis(Duration.fromInputUnsafe(expires)) * 1_000_000
  return { batch, expires: nanos, idle_heartbeat: Math.min(5_000_000_000, nanos / 2) }
}

const shape = (findings: ReadonlyArray<Contract.Finding>) => findings.map((f) => [f.check, f.severity]).sort()

describe("a consumer's limits on pull requests", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("max_batch below the prefetch: the server refuses the intake's first pull, and the contract check is an error that says what to do", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_batch: 4 })
        assert.strictEqual(yield* firstAnswer(stream, intakePull(16, "30 seconds")), "409 Exceeded MaxRequestBatch of 4")
        assert.strictEqual(yield* firstAnswer(stream, intakePull(4, "30 seconds")), "message")

        const findings = yield* Contract.check(contractFor(stream))
        assert.deepStrictEqual(shape(findings), [["max_batch", "error"]])
        assert.strictEqual(findings[0]!.target, `consumer ${stream}/shipper`)
        assert.include(findings[0]!.message, "has max_batch 4, below the intake's largest pull (prefetch 16)")
        assert.include(findings[0]!.message, "409 Exceeded MaxRequestBatch of 4")
        assert.include(findings[0]!.message, "update the consumer with max_batch 0 (no limit) or at least 16, or lower prefetch to 4")
        // A prefetch the limit takes: nothing to say.
        assert.deepStrictEqual(yield* Contract.check(contractFor(stream, { ...expect, prefetch: 4 })), [])
      }).pipe(Effect.scoped))

    it.effect("JetStreamSource refuses to open on a consumer whose max_batch is below its prefetch, instead of ending at its first pull", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_batch: 4 })
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(`${stream}_DLQ`).catch(() => false)))
        const source = JetStreamSource.make({ stream, consumer: "shipper", captureMaxDeliveries: false })
        // Opened (as before the check), the intake ends at its first pull: its error is compared too.
        const ended = yield* source.open({ consumer: "shipper", prefetch: 16, attempts: 5, ordering: "Unordered" }).pipe(
          Effect.flatMap((intake) => intake.take),
          Effect.flip,
          Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.die(new Error("neither refused nor ended")) })
        )
        assert.strictEqual(ended.reason, "ContractMismatch")
        assert.include(ended.message, `${stream}/shipper has max_batch 4, below the intake's largest pull (prefetch 16)`)
        // Nothing was set up for an intake that never ran.
        assert.isFalse(yield* Effect.promise(() => manager.streams.info(`${stream}_DLQ`).then(() => true, () => false)))
      }).pipe(Effect.scoped))

    it.effect("JetStreamSource checks a consumer's max_expires against its own pullExpires: within the limit it opens and delivers, beyond it it refuses to open", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_expires: 10_000_000_000 })
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(`${stream}_DLQ`).catch(() => false)))
        const open = (pullExpires: Duration.Input) =>
          JetStreamSource.make({ stream, consumer: "shipper", pullExpires, captureMaxDeliveries: false })
            .open({ consumer: "shipper", prefetch: 16, attempts: 5, ordering: "Unordered" })
        // 10 s pulls on a consumer that takes pulls of up to 10 s: the message is delivered.
        const taken = yield* open("10 seconds").pipe(
          Effect.flatMap((intake) => intake.take),
          Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.die(new Error("no delivery within 10 s")) }),
          Effect.scoped
        )
        assert.strictEqual(taken.sequence, 1)
        // 20 s pulls: refused before the intake opens, naming the limit.
        const refused = yield* Effect.flip(open("20 seconds")).pipe(Effect.scoped)
        assert.strictEqual(refused.reason, "ContractMismatch")
        assert.include(refused.message, "max_expires 10s")
      }).pipe(Effect.scoped))

    it.effect("max_expires below pullExpires (default 30 s): the server refuses the pull, and the contract check is an error; a declared pullExpires within it is fine", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_expires: 1_000_000_000 })
        assert.strictEqual(yield* firstAnswer(stream, intakePull(16, "30 seconds")), "409 Exceeded MaxRequestExpires of 1s")
        // Exactly the limit is accepted.
        assert.strictEqual(yield* firstAnswer(stream, intakePull(16, "1 second")), "message")

        const findings = yield* Contract.check(contractFor(stream))
        assert.deepStrictEqual(shape(findings), [["max_expires", "error"]])
        assert.include(findings[0]!.message, "has max_expires 1s, shorter than the intake's pulls wait (30s, pullExpires)")
        assert.include(findings[0]!.message, "409 Exceeded MaxRequestExpires of 1s")
        assert.include(findings[0]!.message, "update the consumer with max_expires 0 (no limit) or at least 30s, or lower pullExpires to 1s")
        const longer = yield* Contract.check(contractFor(stream, { ...expect, pullExpires: "2 minutes" }))
        assert.include(longer[0]!.message, "shorter than the intake's pulls wait (2m, pullExpires)")
        assert.deepStrictEqual(yield* Contract.check(contractFor(stream, { ...expect, pullExpires: "1 second" })), [])
        assert.deepStrictEqual(yield* Contract.check(contractFor(stream, { ...expect, pullExpires: 1_000 })), [])
      }).pipe(Effect.scoped))

    it.effect("max_waiting below the pulls the instances may keep waiting: the server refuses the extra pull (not for good), and the contract check warns", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_waiting: 2 })
        const { connection } = yield* NatsConnection.NatsConnection
        // The message is taken, then two pulls wait on an empty stream; a third is one too many.
        assert.strictEqual(yield* firstAnswer(stream, intakePull(1, "30 seconds")), "message")
        // Listened to: the server drops a waiting pull whose inbox nobody listens to once the queue is full.
        for (const _ of [1, 2]) {
          const inbox = createInbox()
          const listening = connection.subscribe(inbox)
          yield* Effect.addFinalizer(() => Effect.sync(() => listening.unsubscribe()))
          connection.publish(`$JS.API.CONSUMER.MSG.NEXT.${stream}.shipper`, JSON.stringify(intakePull(4, "5 seconds")), { reply: inbox })
        }
        assert.strictEqual(yield* firstAnswer(stream, intakePull(4, "5 seconds")), "409 Exceeded MaxWaiting")

        const findings = yield* Contract.check(contractFor(stream))
        assert.deepStrictEqual(shape(findings), [["max_waiting", "warning"]])
        assert.include(findings[0]!.message, "has max_waiting 2, below the 8 pulls 1 instance of the intake may keep waiting (prefetch 16)")
        assert.include(findings[0]!.message, "409 Exceeded MaxWaiting")
        assert.include(findings[0]!.message, "max_waiting cannot change in place")
        // Pulls per instance: at most the prefetch (each asks for one message at least), counted for every instance.
        assert.deepStrictEqual(yield* Contract.check(contractFor(stream, { ...expect, prefetch: 2 })), [])
        const three = yield* Contract.check(contractFor(stream, { ...expect, prefetch: 2, instances: 3 }))
        assert.include(three[0]!.message, "has max_waiting 2, below the 6 pulls 3 instances of the intake may keep waiting (prefetch 2)")
      }).pipe(Effect.scoped))

    it.effect("max_bytes: the server takes a pull that sets no max_bytes (the intake's), so the contract check says nothing; the default max_waiting neither", () =>
      Effect.gen(function*() {
        // Room for 64 instances of 4 + 16 unacked: only the pull limits are in question.
        const stream = yield* declare({ max_bytes: 1024, max_ack_pending: 2_000 })
        assert.strictEqual(yield* firstAnswer(stream, intakePull(16, "30 seconds")), "message")
        // What max_bytes refuses: a pull asking for more bytes than it.
        assert.strictEqual(
          yield* firstAnswer(stream, { ...intakePull(16, "30 seconds"), max_bytes: 4096 }),
          "409 Exceeded MaxRequestMaxBytes of 1024"
        )
        const { manager } = yield* NatsConnection.NatsConnection
        const live = yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))
        assert.strictEqual(live.config.max_waiting, 512, "the server's default")
        const contract = contractFor(stream, { ...expect, instances: 64 })
        const consumer = { ...contract.consumers[0]!, maxAckPending: 2_000 }
        assert.deepStrictEqual(yield* Contract.check({ ...contract, consumers: [consumer] }), [])
      }).pipe(Effect.scoped))

    it.effect("the contract file declares the intake's pullExpires; one the intake would refuse is an error finding naming it", () =>
      Effect.gen(function*() {
        const stream = yield* declare({ max_expires: 10_000_000_000 })
        const file = (pullExpires: unknown) =>
          JSON.stringify({
            version: "1",
            ownership: "platform",
            stream: { name: stream, subjects: [`${stream.toLowerCase()}.>`] },
            consumers: [{ name: "shipper", ackWait: "30 seconds", maxDeliver: 11, expect: { ...expect, pullExpires } }]
          })
        const fits = yield* Contract.fromJson(file("10 seconds"))
        assert.strictEqual(fits.consumers[0]!.expect.pullExpires, "10 seconds")
        assert.deepStrictEqual(yield* Contract.check(fits), [])
        const tooLong = yield* Contract.check(yield* Contract.fromJson(file(20_000)))
        assert.deepStrictEqual(shape(tooLong), [["max_expires", "error"]])
        assert.include(tooLong[0]!.message, "has max_expires 10s, shorter than the intake's pulls wait (20s, pullExpires)")
        // Without pullExpires (a file written before it): the intake's default, 30 s.
        const omitted = JSON.parse(file("x")) as { consumers: Array<{ expect: Record<string, unknown> }> }
        delete omitted.consumers[0]!.expect.pullExpires
        const old = yield* Contract.check(yield* Contract.fromJson(JSON.stringify(omitted)))
        assert.include(old[0]!.message, "shorter than the intake's pulls wait (30s, pullExpires)")

        const problem = (shown: string) =>
          `consumer ${stream}/shipper: pullExpires must be a duration from 1 second to 2147483647 ms (JetStreamSource refuses others), got ${shown}`
        for (const [pullExpires, shown] of [["500 millis", `"500 millis"`], [2 ** 31, "2147483648"]] as const) {
          const findings = yield* Contract.check(yield* Contract.fromJson(file(pullExpires)))
          assert.deepStrictEqual(findings.map((f) => [f.check, f.severity, f.message]), [["max_expires", "error", problem(shown)]])
        }
        // Validated without a server too (the contract's own consistency).
        const validated = Contract.validate(yield* Contract.fromJson(file("500 millis")))
        assert.deepStrictEqual(validated.filter((f) => f.check === "max_expires").map((f) => f.message), [problem(`"500 millis"`)])
      }).pipe(Effect.scoped))
  })

  it("consumerFindings takes the intake's pullExpires as JetStreamSource knows it (milliseconds, or a Duration)", () => {
    const target = "consumer S/c"
    const live = { ack_policy: AckPolicy.Explicit, max_deliver: -1, max_expires: 5_000_000_000, max_batch: 8 }
    const checks = (expectations: Contract.Expectations) => shape(Contract.consumerFindings(target, live, expectations))
    assert.deepStrictEqual(checks({ ...expect, prefetch: 8, pullExpires: Duration.millis(5_000) }), [])
    assert.deepStrictEqual(checks({ ...expect, prefetch: 8, pullExpires: 5_000 }), [])
    assert.deepStrictEqual(checks({ ...expect, prefetch: 9, pullExpires: 5_001 }), [["max_batch", "error"], ["max_expires", "error"]])
    // No limits on the consumer (0 or absent): nothing to compare.
    assert.deepStrictEqual(shape(Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_batch: 0, max_expires: 0 }, expect)), [])
    // Below the intake's shortest pull (1 second), only the consumer can change.
    const [short] = Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_expires: 500_000_000 }, expect)
    assert.strictEqual(
      short!.message,
      `${target} has max_expires 500ms, shorter than the intake's pulls wait (30s, pullExpires): the server refuses each pull ` +
        "(409 Exceeded MaxRequestExpires of 500ms) and the intake stops with ContractMismatch: update the consumer with " +
        "max_expires 0 (no limit) or at least 30s"
    )
  })
})

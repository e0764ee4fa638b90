import { assert, describe, it, layer } from "@effect/vitest"
import { AckPolicy } from "@nats-io/jetstream"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
import { nanos } from "@nats-io/transport-node"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A stream name of this run, deleted with the test's scope. */
const freshStream = Effect.gen(function*() {
  const name = `CONTRACT_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6).toString(36)}`.toUpperCase()
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return name
})

const contractFor = (stream: string): Contract.Contract => ({
  version: "1",
  ownership: "service",
  stream: { name: stream, subjects: [`${stream.toLowerCase()}.orders.>`], duplicateWindow: "2 minutes" },
  consumers: [{
    name: "shipper",
    ackWait: "30 seconds",
    maxDeliver: 11,
    maxAckPending: 1000,
    expect: { attempts: 5, concurrency: 16, prefetch: 16, instances: 3 }
  }],
  publishHorizon: "1 minute"
})

/** The findings as `[target, check, severity]`, sorted, for comparison. */
const shape = (findings: ReadonlyArray<Contract.Finding>) =>
  findings.map((f) => [f.target.replace(/ [A-Z0-9_]+/, " S"), f.check, f.severity]).sort()

describe("Contract", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-002: a service's contract applied with Topology matches the live stream and consumer: no findings", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const contract = contractFor(stream)
        yield* Topology.ensureStream(contract.stream)
        for (const consumer of contract.consumers) yield* Topology.ensureConsumer({ ...consumer, stream })
        assert.deepStrictEqual(yield* Contract.check(contract), [])
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: every incompatibility with the live server is reported, each with what to do", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const contract = contractFor(stream)
        // What an operator left on the server: an extra subject, a short duplicate window, a
        // consumer with too few deliveries for the attempts, too few unacked for three instances.
        yield* Topology.ensureStream({
          ...contract.stream,
          subjects: [...contract.stream.subjects, `${stream.toLowerCase()}.audit`],
          duplicateWindow: "30 seconds"
        })
        yield* Topology.ensureConsumer({ stream, name: "shipper", ackWait: "10 seconds", maxDeliver: 3, maxAckPending: 40 })
        const findings = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(findings), [
          ["consumer S/shipper", "ack_wait", "error"],
          ["consumer S/shipper", "max_ack_pending", "error"],
          ["consumer S/shipper", "max_ack_pending", "warning"],
          ["consumer S/shipper", "max_deliver", "error"],
          ["consumer S/shipper", "max_deliver", "error"],
          ["consumer S/shipper", "processing_time", "warning"],
          ["stream S", "duplicate_window", "error"],
          ["stream S", "duplicate_window", "warning"],
          ["stream S", "subjects", "error"]
        ])
        const message = (check: Contract.Check, severity: Contract.Finding["severity"]) =>
          findings.filter((f) => f.check === check && f.severity === severity).map((f) => f.message).join("\n")
        assert.include(message("subjects", "error"), `captures ${stream.toLowerCase()}.audit, which the contract does not list`)
        assert.include(message("max_deliver", "error"), "it must exceed the retry policy's 5 attempts")
        assert.include(message("max_ack_pending", "warning"), "below 96 (instances x (concurrency + prefetch))")
        assert.include(message("duplicate_window", "warning"), "deduplicates republishes for 30s, but producers may republish for 1m")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: a missing stream or consumer is a finding that says who acts, by ownership", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const contract = contractFor(stream)
        const platform = { ...contract, ownership: "platform" as const }
        const none = yield* Contract.check(platform)
        assert.deepStrictEqual(shape(none), [["stream S", "exists", "error"]])
        assert.include(none[0]!.message, "ask the platform team that owns it")
        yield* Topology.ensureStream(contract.stream)
        const noConsumer = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(noConsumer), [["consumer S/shipper", "exists", "error"]])
        assert.include(noConsumer[0]!.message, "apply the contract (jetworker contract apply, or Contract.apply)")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: AckWait/BackOff, MaxDeliver and MaxAckPending compared against timeouts, idempotency and capacity, the server's BackOff normalised first", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        // A platform team's consumer: BackOff 1s, 5s, 20s (2.9 stores AckWait = 1s), four
        // deliveries, 20 unacked for two instances of 8 + 8.
        const consumer = {
          name: "platform-owned",
          ackWait: "30 seconds",
          backoff: ["1 second", "5 seconds", "20 seconds"],
          maxDeliver: 4,
          maxAckPending: 20
        } as const
        const contract: Contract.Contract = {
          version: "1",
          ownership: "platform",
          stream: { name: stream, subjects: [`${stream.toLowerCase()}.>`] },
          consumers: [{
            ...consumer,
            expect: { attempts: 5, concurrency: 8, prefetch: 8, instances: 2, maxProcessingTime: "10 seconds", idempotent: false }
          }]
        }
        yield* Topology.ensureStream(contract.stream)
        yield* Topology.ensureConsumer({ ...consumer, stream })
        const live = yield* Effect.promise(() => manager.consumers.info(stream, consumer.name))
        assert.strictEqual(live.config.ack_wait, 1_000_000_000, "the server stores AckWait = BackOff[0]")
        // The declared AckWait (30 s) is normalised to BackOff[0] before comparing: no ack_wait finding.
        const findings = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(findings), [
          ["consumer S/platform-owned", "backoff", "warning"],
          ["consumer S/platform-owned", "max_ack_pending", "warning"],
          ["consumer S/platform-owned", "max_deliver", "error"],
          ["consumer S/platform-owned", "processing_time", "error"]
        ])
        const text = findings.map((f) => f.message).join("\n")
        assert.include(text, "max_deliver 4; it must exceed the retry policy's 5 attempts")
        assert.include(text, "max_ack_pending 20 below 32 (instances x (concurrency + prefetch))")
        assert.include(text, "AckWait 1s (its first backoff delay), shorter than an attempt may run (10s)")
        assert.include(text, "the handler is not idempotent, so both may perform the effect")
        assert.include(text, "distorts the engine's nak delays")

        // The same timings with an idempotent handler are a risk, not an incompatibility.
        const idempotent: Contract.Contract = {
          ...contract,
          consumers: [{ ...contract.consumers[0]!, maxDeliver: 4, expect: { ...contract.consumers[0]!.expect, attempts: 3, idempotent: true } }]
        }
        assert.deepStrictEqual(shape(yield* Contract.check(idempotent)), [
          ["consumer S/platform-owned", "backoff", "warning"],
          ["consumer S/platform-owned", "max_ack_pending", "warning"],
          ["consumer S/platform-owned", "processing_time", "warning"]
        ])

        // A contract that leaves the BackOff out does not match a consumer that has one.
        const { backoff: _backoff, ...withoutBackoff } = idempotent.consumers[0]!
        const drifted = yield* Contract.check({ ...idempotent, consumers: [withoutBackoff] })
        assert.deepInclude(shape(drifted), ["consumer S/platform-owned", "backoff", "error"])
        assert.deepInclude(shape(drifted), ["consumer S/platform-owned", "ack_wait", "error"])
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: apply creates what is missing and brings mutable settings to the contract; plan says what it would change; it refuses a platform-owned contract, one that contradicts itself, and a change the server cannot make", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        const contract = contractFor(stream)
        const planned = yield* Contract.plan(contract)
        assert.deepStrictEqual(planned.map((c) => [c.action, c.target.replace(/ [A-Z0-9_]+/, " S")]), [
          ["create", "stream S"],
          ["create", "consumer S/shipper"]
        ])
        assert.deepStrictEqual(yield* Contract.apply(contract), planned)
        assert.deepStrictEqual(yield* Contract.plan(contract), [])
        assert.deepStrictEqual(yield* Contract.check(contract), [])
        assert.deepStrictEqual(yield* Contract.apply(contract), [], "applying again changes nothing")

        // Someone gave the consumer a backoff and a short AckWait: apply puts the contract back.
        yield* Topology.ensureConsumer({ stream, name: "shipper", ackWait: "30 seconds", backoff: ["2 seconds", "4 seconds"], maxDeliver: 11 })
        const drift = yield* Contract.plan(contract)
        assert.deepStrictEqual(drift.map((c) => [c.action, c.setting, c.live, c.wanted]), [
          ["update", "ack_wait", "2s", "30s"],
          ["update", "backoff", "2s, 4s", "none"]
        ])
        yield* Contract.apply(contract)
        const live = yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))
        assert.strictEqual(live.config.ack_wait, 30_000_000_000)
        assert.deepStrictEqual(live.config.backoff ?? [], [])

        const platform = yield* Effect.flip(Contract.apply({ ...contract, ownership: "platform" }))
        assert.strictEqual(platform._tag === "ContractError" ? platform.reason : platform._tag, "PlatformOwned")
        const contradicting: Contract.Contract = {
          ...contract,
          consumers: [{ ...contract.consumers[0]!, maxDeliver: 5 }]
        }
        const invalid = yield* Effect.flip(Contract.apply(contradicting))
        assert.strictEqual(invalid._tag === "ContractError" ? invalid.reason : invalid._tag, "Invalid")
        assert.include(invalid.message, "it must exceed the retry policy's 5 attempts")
        assert.strictEqual((yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))).config.max_deliver, 11, "nothing was written")

        yield* Effect.promise(() => manager.consumers.delete(stream, "shipper"))
        yield* Effect.promise(() => manager.consumers.add(stream, { durable_name: "shipper", ack_policy: AckPolicy.None }))
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : refused._tag, "Refused")
        assert.include(refused.message, "exists with ack policy none; it cannot change in place")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: apply leaves what the contract does not declare: a platform's stream limits stay, a shared stream's other subjects stay and check clean; a filter that would have to be removed is refused, not silently kept", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        const contract = contractFor(stream)
        // The platform made the stream with limits the contract leaves out.
        yield* Effect.promise(() =>
          manager.streams.add({ name: stream, subjects: [...contract.stream.subjects], max_bytes: 1024 * 1024, max_msgs: 5000, discard: "new" as never })
        )
        yield* Contract.apply(contract)
        const config = (yield* Effect.promise(() => manager.streams.info(stream))).config
        assert.deepStrictEqual([config.max_bytes, config.max_msgs, config.discard], [1024 * 1024, 5000, "new"])
        assert.deepStrictEqual(yield* Contract.check(contract), [])

        // Shared ("add"): a live subject that captures the declared one is enough, and others may be there.
        const shared: Contract.Contract = {
          ...contract,
          stream: { ...contract.stream, subjects: [`${stream.toLowerCase()}.orders.eu`], subjectsMode: "add" },
          consumers: []
        }
        yield* Effect.promise(() => manager.streams.update(stream, { subjects: [`${stream.toLowerCase()}.orders.>`, `${stream.toLowerCase()}.audit`] }))
        assert.deepStrictEqual(yield* Contract.plan(shared), [])
        assert.deepStrictEqual(yield* Contract.check(shared), [])

        // The live consumer filters; the contract has no filter: an update would keep it.
        yield* Effect.promise(() => manager.consumers.update(stream, "shipper", { filter_subject: `${stream.toLowerCase()}.orders.eu` }))
        const planned = yield* Contract.plan(contract)
        assert.isTrue(planned.some((c) => c.action === "refuse" && c.setting === "filter_subject"), JSON.stringify(planned))
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : refused._tag, "Refused")
        assert.include(refused.message, "jetworker does not remove a filter")
        const findings = yield* Contract.check(contract)
        // (The exact contract also sees the subject the shared step added: its list is closed.)
        assert.deepStrictEqual(shape(findings), [["consumer S/shipper", "filter_subject", "error"], ["stream S", "subjects", "error"]])
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: check reports a declared stream limit (max_msgs, discard) that differs on the live stream, as plan does", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const base = contractFor(stream)
        // Declared: keep up to 100 000 messages and refuse new ones at the limit (never drop unprocessed work).
        const contract: Contract.Contract = { ...base, stream: { ...base.stream, maxMessages: 100_000, discard: "new" } }
        yield* Contract.apply(contract)
        assert.deepStrictEqual(yield* Contract.check(contract), [])
        // A platform operator shrinks the stream and makes it drop old messages.
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.update(stream, { max_msgs: 10, discard: "old" as never }))
        assert.deepStrictEqual((yield* Contract.plan(contract)).map((c) => c.setting).sort(), ["discard", "max_msgs"])
        const findings = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(findings), [["stream S", "discard", "error"], ["stream S", "max_msgs", "error"]])
        const text = findings.map((f) => f.message).join("\n")
        assert.include(text, "has max_msgs 10, the contract 100000")
        assert.include(text, "discards old messages at its limits, the contract new")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: check reports a live consumer that delivers headers only, or that the server deletes when idle (inactive_threshold)", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const contract = contractFor(stream)
        yield* Contract.apply(contract)
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.consumers.update(stream, "shipper", { headers_only: true }))
        assert.isTrue((yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))).config.headers_only === true, "precondition: the server took headers_only")
        const headersOnly = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(headersOnly), [["consumer S/shipper", "headers_only", "error"]])
        assert.include(headersOnly[0]!.message, "delivers headers only, without the payload")

        yield* Effect.promise(() => manager.consumers.update(stream, "shipper", { headers_only: false, inactive_threshold: nanos(60 * 60_000) }))
        assert.isTrue(((yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))).config.inactive_threshold ?? 0) > 0, "precondition: the server took inactive_threshold")
        const idle = yield* Contract.check(contract)
        assert.deepStrictEqual(shape(idle), [["consumer S/shipper", "inactive_threshold", "error"]])
        assert.include(idle[0]!.message, "has inactive_threshold 1h: the server deletes the durable and its position")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: a contract apply refuses cannot have written anything: a backoff without maxDeliver is an error of validate, and no stream is left behind", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        const contract: Contract.Contract = {
          version: "1",
          ownership: "service",
          stream: { name: stream, subjects: [`${stream.toLowerCase()}.orders.>`] },
          consumers: [{ name: "shipper", backoff: ["1 second", "5 seconds"], expect: { attempts: 5, concurrency: 4, prefetch: 4 } }]
        }
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : `${refused._tag}: ${refused.message}`, "Invalid")
        assert.include(refused.message, "has a backoff and no maxDeliver")
        const exists = yield* Effect.promise(() => manager.streams.info(stream).then(() => true, () => false))
        assert.isFalse(exists, `stream ${stream} was created by an apply that then failed`)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: values the server replaces by its default (0 AckWait, MaxAckPending, duplicate window) are refused before anything is written, so apply converges", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        const base = contractFor(stream)
        const shipper = base.consumers[0]!
        const variants: ReadonlyArray<readonly [string, Contract.Contract]> = [
          ["maxAckPending", { ...base, consumers: [{ ...shipper, maxAckPending: 0 }] }],
          ["ackWait", { ...base, consumers: [{ ...shipper, ackWait: "0 millis" }] }],
          ["duplicateWindow", { ...base, stream: { ...base.stream, duplicateWindow: "0 millis" } }]
        ]
        for (const [setting, contract] of variants) {
          const refused = yield* Effect.flip(Contract.apply(contract))
          assert.strictEqual(refused._tag === "ContractError" ? refused.reason : `${refused._tag}: ${refused.message}`, "Invalid", setting)
          assert.include(refused.message, `${setting} must be a positive`)
        }
        const exists = yield* Effect.promise(() => manager.streams.info(stream).then(() => true, () => false))
        assert.isFalse(exists, `stream ${stream} was created by a refused apply`)
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-002: a feature newer than the server is detected, not assumed: several filter subjects on a server older than 2.10 are an error of check, refused by plan, apply and Topology before anything is sent; one filter subject works everywhere", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { connection, manager } = yield* NatsConnection.NatsConnection
        const version = connection.info!.version
        const base = contractFor(stream)
        const subjects = [`${stream.toLowerCase()}.orders.eu`, `${stream.toLowerCase()}.orders.us`]
        const contract: Contract.Contract = { ...base, consumers: [{ ...base.consumers[0]!, filterSubjects: subjects }] }
        yield* Topology.ensureStream(contract.stream)
        if (Topology.versionAtLeast(version, "2.10.0")) {
          // A newer server takes the declaration, and the live filters then match the contract.
          yield* Contract.apply(contract)
          assert.deepStrictEqual(yield* Contract.check(contract), [])
          return
        }
        const findings = yield* Contract.check(contract)
        const tooNew = findings.filter((f) => f.check === "server_version")
        assert.strictEqual(tooNew.length, 1, JSON.stringify(findings))
        assert.strictEqual(tooNew[0]!.severity, "error")
        assert.include(tooNew[0]!.message, `declares filterSubjects (2 subjects), which needs NATS 2.10.0 or later; the server is ${version}`)
        assert.include(tooNew[0]!.message, "declare one filterSubject")
        const planned = yield* Contract.plan(contract)
        assert.isTrue(planned.some((change) => change.action === "refuse" && change.setting === "server_version"))
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : refused._tag, "Refused")
        const direct = yield* Effect.flip(Topology.ensureConsumer({ ...contract.consumers[0]!, stream }))
        assert.include(direct.message, "needs NATS 2.10.0 or later")
        const live = yield* Effect.promise(() => manager.consumers.info(stream, "shipper").then(() => true, () => false))
        assert.isFalse(live, "no consumer was created")

        // One subject in the list is the 2.9 form, and a live consumer then matches the contract.
        const one: Contract.Contract = { ...base, consumers: [{ ...base.consumers[0]!, filterSubjects: [subjects[0]!] }] }
        yield* Contract.apply(one)
        assert.strictEqual((yield* Effect.promise(() => manager.consumers.info(stream, "shipper"))).config.filter_subject, subjects[0])
        assert.deepStrictEqual(yield* Contract.check(one), [])
        // Both forms at once is a contract that contradicts itself.
        const both = Contract.validate({ ...base, consumers: [{ ...base.consumers[0]!, filterSubject: subjects[0]!, filterSubjects: subjects }] })
        assert.isTrue(both.some((f) => f.check === "filter_subject" && f.message.includes("keep one")))
      }).pipe(Effect.scoped))
  })

  it.effect("server versions compare by their numbers", () =>
    Effect.sync(() => {
      assert.isFalse(Topology.versionAtLeast("2.9.10", "2.10.0"))
      assert.isTrue(Topology.versionAtLeast("2.10.0", "2.10.0"))
      assert.isTrue(Topology.versionAtLeast("2.11.4", "2.10.0"))
      assert.isTrue(Topology.versionAtLeast("v3.0.0-beta.1", "2.10.0"))
      assert.isFalse(Topology.versionAtLeast("2.9.25", "2.10"))
    }))

  it.effect("a contract file is read with durations as text; every wrong field is named", () =>
    Effect.gen(function*() {
      const contract = yield* Contract.fromJson(JSON.stringify({
        version: "7",
        ownership: "service",
        stream: { name: "ORDERS", subjects: ["orders.>"], duplicateWindow: "2 minutes" },
        consumers: [{ name: "shipper", ackWait: "30 seconds", maxDeliver: 11, expect: { attempts: 5, concurrency: 16, prefetch: 16 } }],
        publishHorizon: 60_000
      }))
      assert.deepStrictEqual(Contract.validate(contract), [])
      assert.strictEqual(contract.consumers[0]!.ackWait, "30 seconds")
      const wrong = yield* Effect.flip(Contract.fromJson(JSON.stringify({
        version: "7",
        ownership: "shared",
        stream: { name: "ORDERS", subjects: ["orders.>"], duplicateWindow: "two minutes" },
        consumers: [{ name: "shipper", expect: { attempts: 0, concurrency: 16, prefetch: 16 } }]
      })))
      assert.strictEqual(wrong.reason, "Unreadable")
      assert.include(wrong.message, "ownership")
      assert.include(wrong.message, "stream.duplicateWindow")
      assert.include(wrong.message, "consumers.0.expect.attempts")
      assert.strictEqual((yield* Effect.flip(Contract.fromJson("{"))).reason, "Unreadable")
      // A misspelt field is not a setting left at its default, and no server takes these values.
      const misspelt = yield* Effect.flip(Contract.fromJson(JSON.stringify({
        version: "7",
        ownership: "service",
        stream: { name: "ORDERS", subjects: ["orders.>"], replica: 3, maxAge: "Infinity" },
        consumers: [{ name: "shipper", maxDelivery: 6, ackWait: "-5 seconds", maxAckPending: 0, expect: { attempts: 5, concurrency: 16, prefetch: 16 } }]
      })))
      for (const field of ["stream.replica", "stream.maxAge", "consumers.0.maxDelivery", "consumers.0.ackWait", "consumers.0.maxAckPending"]) {
        assert.include(misspelt.message, field)
      }
      // 0 is the server's "default": a file cannot declare a value apply would never converge to.
      const zero = yield* Effect.flip(Contract.fromJson(JSON.stringify({
        version: "7",
        ownership: "service",
        stream: { name: "ORDERS", subjects: ["orders.>"], duplicateWindow: 0 },
        consumers: [{ name: "c", ackWait: 0, maxDeliver: 11, backoff: ["0 seconds"], expect: { attempts: 5, concurrency: 1, prefetch: 1 } }]
      })))
      assert.strictEqual(zero.reason, "Unreadable")
      for (const field of ["stream.duplicateWindow", "consumers.0.ackWait", "consumers.0.backoff.0"]) {
        assert.include(zero.message, field)
      }
      assert.include(zero.message, "expected a positive duration")
    }))

  it("validate finds what the server would refuse or not keep, before anything is written: a backoff without a MaxDeliver above it, a duplicate window longer than the max age, a filter the stream does not capture, bad or repeated names, a 0 the server replaces by its default", () => {
    const base = contractFor("ORDERS")
    const shipper = base.consumers[0]!
    const checks = (contract: Contract.Contract) =>
      Contract.validate(contract).filter((f) => f.severity === "error").map((f) => [f.target, f.check])
    assert.deepStrictEqual(checks(base), [])
    // Topology.ensureConsumer refuses a backoff without MaxDeliver (NATS 2.9 does): an error, or apply stops half way.
    assert.deepStrictEqual(checks({ ...base, consumers: [{ ...shipper, maxDeliver: undefined, backoff: ["1 second", "5 seconds"] }] }), [
      ["consumer ORDERS/shipper", "backoff"]
    ])
    // Values the server replaces by its default, each named.
    assert.deepStrictEqual(
      checks({
        ...base,
        stream: { ...base.stream, duplicateWindow: 0, replicas: 0, maxMessages: 0 },
        consumers: [{ ...shipper, ackWait: 0, maxAckPending: 0 }]
      }),
      [
        ["stream ORDERS", "duplicate_window"],
        ["stream ORDERS", "max_msgs"],
        ["stream ORDERS", "replicas"],
        ["consumer ORDERS/shipper", "ack_wait"],
        ["consumer ORDERS/shipper", "max_ack_pending"]
      ]
    )
    assert.deepStrictEqual(checks({ ...base, consumers: [{ ...shipper, maxDeliver: 2, backoff: ["1 second", "5 seconds"] }] }), [
      ["consumer ORDERS/shipper", "max_deliver"],
      ["consumer ORDERS/shipper", "backoff"]
    ])
    assert.deepStrictEqual(checks({ ...base, stream: { ...base.stream, maxAge: "30 seconds" } }), [["stream ORDERS", "duplicate_window"]])
    assert.deepStrictEqual(checks({ ...base, consumers: [{ ...shipper, filterSubject: "billing.>" }] }), [["consumer ORDERS/shipper", "filter_subject"]])
    assert.deepStrictEqual(checks({ ...base, consumers: [{ ...shipper, filterSubject: "orders.orders.eu" }] }), [])
    // A wildcard filter wider than the stream's subjects is taken by the server too.
    assert.deepStrictEqual(checks({ ...base, consumers: [{ ...shipper, filterSubject: ">" }] }), [])
    assert.deepStrictEqual(checks({ ...base, stream: { ...base.stream, name: "ORDERS.EU" }, consumers: [shipper, shipper] }).map(([, check]) => check), [
      "exists",
      "exists"
    ])
  })

  it("a consumer's own checks: explicit acks, sequential needs max_ack_pending 1, a server backoff is a warning", () => {
    const target = "consumer S/c"
    const expect = { attempts: 3, concurrency: 1, prefetch: 1, ordering: "Sequential" as const }
    const sequential = Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_ack_pending: 5, max_deliver: 5, backoff: [1_000_000_000] }, expect)
    assert.deepStrictEqual(sequential.map((f) => [f.check, f.severity]), [["backoff", "warning"], ["ordering", "error"]])
    const noAcks = Contract.consumerFindings(target, { ack_policy: AckPolicy.None, max_ack_pending: 1 }, expect)
    assert.deepStrictEqual(noAcks.map((f) => [f.check, f.severity]), [["ack_policy", "error"]])
    assert.deepStrictEqual(Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_ack_pending: 1, max_deliver: -1 }, expect), [])
    // What the source would refuse at open: deliveries without payload, a durable deleted when idle.
    const lossy = Contract.consumerFindings(
      target,
      { ack_policy: AckPolicy.Explicit, max_ack_pending: 1, max_deliver: -1, headers_only: true, inactive_threshold: nanos(60_000) },
      expect
    )
    assert.deepStrictEqual(lossy.map((f) => [f.check, f.severity]), [["headers_only", "error"], ["inactive_threshold", "error"]])
  })
})

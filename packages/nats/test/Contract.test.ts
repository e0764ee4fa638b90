import { assert, describe, it, layer } from "@effect/vitest"
import { AckPolicy } from "@nats-io/jetstream"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
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
        assert.include(noConsumer[0]!.message, "apply the contract (Topology.ensureConsumer)")
      }).pipe(Effect.scoped))
  })

  it("a consumer's own checks: explicit acks, sequential needs max_ack_pending 1, a server backoff is a warning", () => {
    const target = "consumer S/c"
    const expect = { attempts: 3, concurrency: 1, prefetch: 1, ordering: "Sequential" as const }
    const sequential = Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_ack_pending: 5, backoff: [1_000_000_000] }, expect)
    assert.deepStrictEqual(sequential.map((f) => [f.check, f.severity]), [["backoff", "warning"], ["ordering", "error"]])
    const noAcks = Contract.consumerFindings(target, { ack_policy: AckPolicy.None, max_ack_pending: 1 }, expect)
    assert.deepStrictEqual(noAcks.map((f) => [f.check, f.severity]), [["ack_policy", "error"]])
    assert.deepStrictEqual(Contract.consumerFindings(target, { ack_policy: AckPolicy.Explicit, max_ack_pending: 1, max_deliver: -1 }, expect), [])
  })
})

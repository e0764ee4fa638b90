import { assert, describe, it, layer } from "@effect/vitest"
import { AckPolicy, StorageType } from "@nats-io/jetstream"
import { Contract, NatsConnection } from "@jetworker/nats"
import { Duration, Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A stream name of this run, deleted with the test's scope. */
const freshStream = Effect.gen(function*() {
  const name = `CD_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`.toUpperCase()
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return name
})

const contractFor = (stream: string): Contract.Contract => ({
  version: "1",
  ownership: "service",
  stream: { name: stream, subjects: [`${stream.toLowerCase()}.orders.>`], duplicateWindow: "2 minutes" },
  consumers: [{ name: "shipper", ackWait: "30 seconds", maxDeliver: 11, expect: { attempts: 5, concurrency: 4, prefetch: 4 } }],
  publishHorizon: "1 minute"
})

const soon = "soon" as Duration.Input

const processingProblem = (shown: string) =>
  `maxProcessingTime must be a finite duration such as "30 seconds", 0 or more, got ${shown}`
const horizonProblem = (shown: string) => `publishHorizon must be a finite duration such as "1 minute", 0 or more, got ${shown}`

describe("Contract durations", () => {
  it("a maxProcessingTime that is not a finite duration is an error finding naming it, never a throw", () => {
    const target = "consumer S/c"
    const live = { ack_policy: AckPolicy.Explicit, ack_wait: 30_000_000_000, max_deliver: -1 }
    const expect = { attempts: 3, concurrency: 1, prefetch: 1 }
    const cases: ReadonlyArray<readonly [Duration.Input, string]> = [
      [soon, `"soon"`],
      [Number.NaN, "NaN"],
      ["-5 seconds", `"-5 seconds"`],
      [Duration.infinity, "Infinity"]
    ]
    for (const [maxProcessingTime, shown] of cases) {
      let findings: ReadonlyArray<Contract.Finding> = []
      assert.doesNotThrow(() => {
        findings = Contract.consumerFindings(target, live, { ...expect, maxProcessingTime })
      })
      assert.deepStrictEqual(findings, [
        { severity: "error", target, check: "processing_time", message: `${target}: ${processingProblem(shown)}` }
      ])
    }
    // A valid one is still compared with AckWait.
    assert.deepStrictEqual(
      Contract.consumerFindings(target, live, { ...expect, maxProcessingTime: "1 minute" }).map((f) => [f.check, f.severity]),
      [["processing_time", "warning"]]
    )
  })

  it("a publishHorizon that is not a finite duration is an error finding naming it, never a throw", () => {
    const declared = { name: "ORDERS", subjects: ["orders.>"] }
    const live = { subjects: ["orders.>"], duplicate_window: 120_000_000_000, num_replicas: 1, storage: StorageType.File }
    let findings: ReadonlyArray<Contract.Finding> = []
    assert.doesNotThrow(() => {
      findings = Contract.streamFindings(declared, live, soon)
    })
    assert.deepStrictEqual(findings, [
      { severity: "error", target: "stream ORDERS", check: "duplicate_window", message: `stream ORDERS: ${horizonProblem(`"soon"`)}` }
    ])
    assert.deepStrictEqual(Contract.streamFindings(declared, live, "-1 minute").map((f) => f.message), [
      `stream ORDERS: ${horizonProblem(`"-1 minute"`)}`
    ])
    assert.deepStrictEqual(Contract.streamFindings(declared, live, "1 minute"), [])
  })

  it("validate reports every duration of a contract that is not one, naming the option and the value, never a throw", () => {
    const base = contractFor("ORDERS")
    const shipper = base.consumers[0]!
    const errors = (contract: Contract.Contract) => {
      let findings: ReadonlyArray<Contract.Finding> = []
      assert.doesNotThrow(() => {
        findings = Contract.validate(contract)
      })
      return findings.filter((f) => f.severity === "error").map((f) => [f.target, f.check, f.message])
    }
    assert.deepStrictEqual(errors({ ...base, publishHorizon: soon }), [
      ["stream ORDERS", "duplicate_window", `stream ORDERS: ${horizonProblem(`"soon"`)}`]
    ])
    assert.deepStrictEqual(errors({ ...base, consumers: [{ ...shipper, expect: { ...shipper.expect, maxProcessingTime: soon } }] }), [
      ["consumer ORDERS/shipper", "processing_time", `consumer ORDERS/shipper: ${processingProblem(`"soon"`)}`]
    ])
    assert.deepStrictEqual(errors({ ...base, stream: { ...base.stream, maxAge: soon } }), [
      ["stream ORDERS", "max_age", `stream ORDERS: maxAge must be a finite duration, 0 for no age limit, got "soon"`]
    ])
    assert.deepStrictEqual(errors({ ...base, consumers: [{ ...shipper, ackWait: soon }] }), [
      ["consumer ORDERS/shipper", "ack_wait", `consumer ORDERS/shipper: ackWait must be a positive duration (the server replaces 0 by 30 seconds), got "soon"`]
    ])
  })

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("apply, check and plan answer a duration that is not one with their typed error or a finding naming it, instead of dying, and write nothing", () =>
      Effect.gen(function*() {
        const stream = yield* freshStream
        const { manager } = yield* NatsConnection.NatsConnection
        const base = contractFor(stream)
        const shipper = base.consumers[0]!
        const badAge: Contract.Contract = { ...base, stream: { ...base.stream, maxAge: soon } }
        const refused = yield* Effect.flip(Contract.apply(badAge))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : `${refused._tag}: ${refused.message}`, "Invalid")
        assert.include(refused.message, `maxAge must be a finite duration, 0 for no age limit, got "soon"`)
        const planError = yield* Effect.flip(Contract.plan(badAge))
        assert.deepInclude(planError, {
          _tag: "NatsError",
          reason: "ApiError",
          operation: `plan contract ${stream}`,
          message: `stream ${stream}: maxAge must be a finite duration, 0 for no age limit, got "soon"`
        })
        assert.deepStrictEqual(yield* Contract.check(badAge), [{
          severity: "error",
          target: `stream ${stream}`,
          check: "max_age",
          message: `stream ${stream}: maxAge must be a finite duration, 0 for no age limit, got "soon"`
        }])
        const created = yield* Effect.promise(() => manager.streams.info(stream).then(() => true, () => false))
        assert.isFalse(created, `stream ${stream} was created`)

        // Against a live stream and consumer: the bad value is named, not compared as 0.
        yield* Contract.apply(base)
        const badWait: Contract.Contract = { ...base, consumers: [{ ...shipper, ackWait: soon }] }
        assert.deepStrictEqual(yield* Contract.check(badWait), [{
          severity: "error",
          target: `consumer ${stream}/shipper`,
          check: "ack_wait",
          message: `consumer ${stream}/shipper: ackWait must be a positive duration (the server replaces 0 by 30 seconds), got "soon"`
        }])
        const badTime: Contract.Contract = { ...base, consumers: [{ ...shipper, expect: { ...shipper.expect, maxProcessingTime: soon } }] }
        assert.deepStrictEqual((yield* Contract.check(badTime)).map((f) => [f.check, f.severity, f.message]), [
          ["processing_time", "error", `consumer ${stream}/shipper: ${processingProblem(`"soon"`)}`]
        ])
        assert.deepStrictEqual((yield* Contract.check({ ...base, publishHorizon: soon })).map((f) => [f.check, f.severity, f.message]), [
          ["duplicate_window", "error", `stream ${stream}: ${horizonProblem(`"soon"`)}`]
        ])
        assert.deepStrictEqual(yield* Contract.check(base), [])
      }).pipe(Effect.scoped))
  })
})

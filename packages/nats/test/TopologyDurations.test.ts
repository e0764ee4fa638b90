import { assert, describe, it, layer } from "@effect/vitest"
import { NatsConnection, Topology } from "@jetworker/nats"
import { type Duration, Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A throw-away stream name, deleted with the scope. */
const streamName = Effect.gen(function*() {
  const { manager } = yield* NatsConnection.NatsConnection
  const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
  const name = `TD_${id}`
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, prefix: `td_${id}` }
})

const banana = "banana" as Duration.Input

describe("Topology durations", () => {
  it("the config and change functions never throw on a duration that does not parse: it stands as 0, and the problems name it", () => {
    const stream = { name: "ORDERS", subjects: ["orders.>"], maxAge: banana, duplicateWindow: banana }
    const consumer = { stream: "ORDERS", name: "shipper", ackWait: banana }
    const withBackoff: Topology.ConsumerOptions = { ...consumer, ackWait: undefined, backoff: ["1 second", banana], maxDeliver: 5 }
    assert.doesNotThrow(() => Topology.streamConfig(stream))
    assert.deepInclude(Topology.streamConfig(stream), { max_age: 0, duplicate_window: 0 })
    assert.doesNotThrow(() => Topology.streamChanges(stream, undefined))
    assert.doesNotThrow(() => Topology.consumerConfig(consumer))
    assert.strictEqual(Topology.consumerConfig(consumer).ack_wait, 0)
    assert.deepStrictEqual(Topology.consumerConfig(withBackoff).backoff, [1_000_000_000, 0])
    assert.doesNotThrow(() => Topology.consumerChanges(withBackoff, undefined))
    assert.deepStrictEqual(Topology.streamProblems(stream).map((p) => p.message), [
      `duplicateWindow must be a positive duration (the server replaces 0 by 2 minutes; deduplication cannot be turned off), got "banana"`,
      `maxAge must be a finite duration, 0 for no age limit, got "banana"`
    ])
    assert.deepStrictEqual(Topology.consumerProblems(consumer).map((p) => p.message), [
      `ackWait must be a positive duration (the server replaces 0 by 30 seconds), got "banana"`
    ])
  })

  it("a NaN duration is a problem named as NaN, not read as 0 (no age limit) or shown as null", () => {
    assert.deepStrictEqual(Topology.streamProblems({ name: "ORDERS", subjects: ["orders.>"], maxAge: Number.NaN }), [
      { setting: "max_age", message: "maxAge must be a finite duration, 0 for no age limit, got NaN" }
    ])
    assert.deepStrictEqual(
      Topology.streamProblems({ name: "ORDERS", subjects: ["orders.>"], duplicateWindow: { seconds: Number.NaN } }).map((p) => p.message),
      [
        `duplicateWindow must be a positive duration (the server replaces 0 by 2 minutes; deduplication cannot be turned off), got { seconds: NaN }`
      ]
    )
    assert.deepStrictEqual(Topology.consumerProblems({ stream: "ORDERS", name: "shipper", ackWait: Number.NaN }).map((p) => p.message), [
      "ackWait must be a positive duration (the server replaces 0 by 30 seconds), got NaN"
    ])
    assert.deepStrictEqual(
      Topology.consumerProblems({ stream: "ORDERS", name: "shipper", backoff: ["1 second", Number.NaN], maxDeliver: 5 }).map((p) => p.message),
      [`every backoff delay must be a positive duration, got ["1 second", NaN]`]
    )
  })

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("ensureStream refuses a NaN maxAge, naming it, and creates nothing (it made a stream that keeps messages for ever)", () =>
      Effect.gen(function*() {
        const { name, prefix } = yield* streamName
        const { manager } = yield* NatsConnection.NatsConnection
        const error = yield* Effect.flip(Topology.ensureStream({ name, subjects: [`${prefix}.>`], maxAge: Number.NaN }))
        assert.deepInclude(error, {
          reason: "ApiError",
          operation: `ensure stream ${name}`,
          message: "maxAge must be a finite duration, 0 for no age limit, got NaN"
        })
        const created = yield* Effect.promise(() => manager.streams.info(name).then(() => true, () => false))
        assert.isFalse(created, `stream ${name} was created`)
      }).pipe(Effect.scoped))
  })
})

/**
 * `Topology.ensureStream` refuses a change that deletes stored messages unless the declaration
 * allows it (`allowDataLoss`), against the real server.
 *
 * Before: a lower limit in the code (every program calls `ensureStream` at start-up: the reference
 * worker, the dead-letter and MaxDeliver capture streams) was applied with only a WARN, and the
 * server deleted the stored messages above it at once (5 stored, `maxMessages: 2`: 3 unprocessed
 * messages gone). `Contract.apply` refused it (`DataLoss`), `ensureStream` did not.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
import { jetstream } from "@nats-io/jetstream"
import { Effect, Logger } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A throw-away stream holding `count` messages, deleted with the scope. */
const streamHolding = (count: number) =>
  Effect.gen(function*() {
    const { connection, manager } = yield* NatsConnection.NatsConnection
    const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
    const name = `TDL_${id}`
    yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
    const declared = { name, subjects: [`tdl_${id}.>`] }
    yield* Topology.ensureStream(declared)
    const js = jetstream(connection)
    for (let i = 0; i < count; i++) yield* Effect.promise(() => js.publish(`tdl_${id}.order`, `order ${i}`))
    const info = Effect.promise(() => manager.streams.info(name))
    return { declared, info }
  })

/** Every line logged at WARN, by its message's text. */
const captureWarnings = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    if (logLevel === "Warn") lines.push(String(Array.isArray(message) ? message[0] : message))
  })
  return { lines, layer: Logger.layer([logger]) }
}

describe("Topology.ensureStream and data loss", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a lower max_msgs the stored messages exceed is refused before anything is sent, naming the stream, setting, old and new value, how many go and how to allow it; 5 messages remain", () =>
      Effect.gen(function*() {
        const { declared, info } = yield* streamHolding(5)
        const error = yield* Effect.flip(Topology.ensureStream({ ...declared, maxMessages: 2 }))
        assert.deepInclude(error, { _tag: "NatsError", reason: "ApiError", operation: `ensure stream ${declared.name}` })
        assert.isFalse(error.isRetryable)
        for (const part of [declared.name, "max_msgs", "to 2 (now -1)", "deletes the oldest 3 of the 5 stored messages", "allowDataLoss: true"]) {
          assert.include(error.message, part)
        }
        const live = yield* info
        assert.strictEqual(live.state.messages, 5)
        assert.strictEqual(live.config.max_msgs, -1)
      }).pipe(Effect.scoped))

    it.effect("with allowDataLoss the change is applied and logged at WARN with what it deleted", () =>
      Effect.gen(function*() {
        const { declared, info } = yield* streamHolding(5)
        const logged = captureWarnings()
        const applied = yield* Topology.ensureStream({ ...declared, maxMessages: 2, allowDataLoss: true }).pipe(Effect.provide(logged.layer))
        assert.strictEqual(applied.config.max_msgs, 2)
        assert.strictEqual((yield* info).state.messages, 2)
        const warning = logged.lines.find((line) => line.includes(`stream ${declared.name} reconfigured`))
        assert.isDefined(warning, logged.lines.join("\n"))
        assert.include(warning, "deletes the oldest 3 of the 5 stored messages")
      }).pipe(Effect.scoped))

    it.effect("a lower limit the stored messages still fit under, and a first max age they are all younger than (the reference worker's 7 days), are plain updates", () =>
      Effect.gen(function*() {
        const { declared, info } = yield* streamHolding(5)
        const updated = yield* Topology.ensureStream({ ...declared, maxMessages: 10, maxBytes: 1024 * 1024, maxAge: "7 days" })
        assert.strictEqual(updated.config.max_msgs, 10)
        assert.strictEqual(updated.config.max_age, 7 * 24 * 3600 * 1_000_000_000)
        assert.strictEqual((yield* info).state.messages, 5)
      }).pipe(Effect.scoped))

    it.effect("Contract.apply refuses it (DataLoss) and applies it with allowDataLoss", () =>
      Effect.gen(function*() {
        const { declared, info } = yield* streamHolding(5)
        const contract: Contract.Contract = { version: "1", ownership: "service", stream: { ...declared, maxMessages: 2 }, consumers: [] }
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.deepInclude(refused, { _tag: "ContractError", reason: "DataLoss" })
        assert.strictEqual((yield* info).state.messages, 5)
        const changes = yield* Contract.apply(contract, { allowDataLoss: true })
        assert.isTrue(changes.some((change) => change.setting === "max_msgs" && change.destructive === true))
        assert.strictEqual((yield* info).state.messages, 2)
      }).pipe(Effect.scoped))
  })
})

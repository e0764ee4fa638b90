/**
 * Refusals a newcomer meets first, named (docs/getting-started.md's first run): a stream whose
 * subjects overlap another stream's names both streams and the subjects (nats-server answers only
 * "subjects overlap with an existing stream"), and a server without JetStream names the server
 * (host:port, never credentials) and how to enable JetStream, instead of a bare "jetstream is not
 * enabled". Both against real servers: the shared one, and a private one without JetStream.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Contract, JetStreamSource, NatsConnection, type NatsError, Publisher, Topology } from "@jetworker/nats"
import { NatsServer, TestStream } from "@jetworker/testing"
import { Effect, Layer, Logger } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

describe("a stream whose subjects overlap another stream's", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("is refused on create naming the stream, its subjects that overlap, and the stream that has them", () =>
      Effect.gen(function*() {
        const taken = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const name = `${taken.stream}_OVERLAP`
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        const overlapping = `${taken.subjectPrefix}.orders.*`
        const error = yield* Effect.flip(Topology.ensureStream({ name, subjects: [`${taken.subjectPrefix}-own.>`, overlapping] }))
        assert.strictEqual(error._tag, "NatsError")
        assert.strictEqual(error.reason, "ApiError")
        assert.strictEqual(error.code, 10065)
        assert.include(error.message, `stream ${name}`)
        assert.include(error.message, `subject ${overlapping} overlaps stream ${taken.stream} (${taken.subjectPrefix}.>)`)
        assert.notInclude(error.message, `${taken.subjectPrefix}-own.>`, "a subject no other stream has is not named")
        const created = yield* Effect.promise(() => manager.streams.info(name).then(() => true, () => false))
        assert.isFalse(created)
      }).pipe(Effect.scoped))

    it.effect("is refused on update (a subject added) with the same names, and the live subjects stay", () =>
      Effect.gen(function*() {
        const taken = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const name = `${taken.stream}_GROWS`
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        const own = `${taken.subjectPrefix}-grows.>`
        yield* Topology.ensureStream({ name, subjects: [own] })
        const overlapping = taken.subject("x")
        const error = yield* Effect.flip(Topology.ensureStream({ name, subjects: [own, overlapping], subjectsMode: "add" }))
        assert.strictEqual(error.reason, "ApiError")
        assert.strictEqual(error.code, 10065)
        assert.include(error.message, `stream ${name}`)
        assert.include(error.message, `subject ${overlapping} overlaps stream ${taken.stream} (${taken.subjectPrefix}.>)`)
        const live = yield* Effect.promise(() => manager.streams.info(name))
        assert.deepStrictEqual(live.config.subjects, [own])
      }).pipe(Effect.scoped))
  })
})

describe("a server without JetStream", () => {
  /** Every line logged, by its message's text. */
  const captureLogs = () => {
    const lines: Array<string> = []
    const logger = Logger.make(({ message }) => void lines.push(String(Array.isArray(message) ? message[0] : message)))
    return { lines, layer: Logger.layer([logger]) }
  }

  it.live("is named (host:port, no credentials) with how to enable JetStream, by Topology, Contract, JetStreamSource and Publisher; the errors stay retryable NoResponders", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({
        config: ["jetstream: disabled", "authorization { user: alice, password: s3cret-pw }"].join("\n")
      })
      const nats = yield* Layer.build(
        NatsConnection.layer({ servers: `nats://alice:s3cret-pw@127.0.0.1:${server.port}`, apiTimeout: "1 second" })
      )
      const named = (message: string) => {
        assert.include(message, `NATS server at 127.0.0.1:${server.port}`, message)
        assert.include(message, "does not run JetStream", message)
        assert.include(message, "nats-server -js", message)
        assert.include(message, "jetstream {}", message)
        assert.notInclude(message, "s3cret-pw", message)
        assert.notInclude(message, "alice", message)
      }
      const calls: ReadonlyArray<Effect.Effect<unknown, NatsError.NatsError, NatsConnection.NatsConnection>> = [
        Topology.ensureStream({ name: "ORDERS", subjects: ["orders.>"] }),
        Topology.ensureConsumer({ stream: "ORDERS", name: "shipping" }),
        Contract.check({ version: "1", ownership: "service", stream: { name: "ORDERS", subjects: ["orders.>"] }, consumers: [] }),
        Publisher.publish("orders.created", new Uint8Array(), { msgId: "o-1", stream: "ORDERS", attempts: 1 })
      ]
      for (const effect of calls) {
        const error = yield* Effect.flip(Effect.provide(effect, nats))
        assert.strictEqual(error.reason, "NoResponders", error.message)
        assert.isTrue(error.isRetryable)
        named(error.message)
      }

      const logged = captureLogs()
      const failed = yield* Effect.flip(
        JetStreamSource.make({ stream: "ORDERS", consumer: "shipping", openRetryTimeout: "400 millis" })
          .open({ consumer: "shipping", prefetch: 4, attempts: 3, ordering: "Unordered" })
          .pipe(Effect.provide(nats), Effect.provide(logged.layer), Effect.scoped)
      )
      named(failed.message)
      const retries = logged.lines.filter((line) => line.includes("retrying"))
      assert.isAbove(retries.length, 0)
      for (const line of retries) {
        named(line)
        assert.notInclude(line, "electing a leader", line)
      }
    }).pipe(Effect.scoped), 30_000)
})

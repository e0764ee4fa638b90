/**
 * The dead-letter stream's limits. `DeadLetter.ensure` (run by every `JetStreamSource` as it opens)
 * brought a live stream's limits to 30 days and 1 GiB when no option named them: an operator's
 * raised limits (or another source's, sharing the stream) were reset at each worker start, and a
 * lower limit deleted stored dead letters with only a WARN. Now the defaults are for a stream it
 * creates, and a limit that would delete stored dead letters is refused unless `allowDataLoss`.
 * The same for the MaxDeliver capture stream's age (7 days when created).
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, MaxDeliveries, NatsConnection } from "@jetworker/nats"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222", name: "jetworker-test-dead-letter-limits" })
const nanosPerDay = 86_400 * 1e9

describe("DeadLetter.ensure and the dead-letter stream's limits", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    const fresh = Effect.gen(function*() {
      const { manager } = yield* NatsConnection.NatsConnection
      const id = crypto.randomUUID().slice(0, 8)
      const options: DeadLetter.Options = { stream: `DLQLIM_${id}`.toUpperCase(), subjectPrefix: `dlqlim_${id}` }
      const destination = DeadLetter.destination(`SRC_${id}`.toUpperCase(), "worker", options)
      yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(destination.stream).catch(() => false)))
      const limits = Effect.map(Effect.promise(() => manager.streams.info(destination.stream)), (info) => ({
        days: info.config.max_age / nanosPerDay,
        bytes: info.config.max_bytes,
        messages: info.state.messages
      }))
      return { manager, options, destination, limits }
    })

    it.effect("creates the stream with 30 days and 1 GiB; a live stream keeps limits no option names", () =>
      Effect.gen(function*() {
        const { manager, options, destination, limits } = yield* fresh
        yield* DeadLetter.ensure(destination, options)
        assert.deepStrictEqual(yield* limits, { days: 30, bytes: 1024 * 1024 * 1024, messages: 0 })
        // An operator raises them.
        const info = yield* Effect.promise(() => manager.streams.info(destination.stream))
        yield* Effect.promise(() => manager.streams.update(destination.stream, { ...info.config, max_age: 90 * nanosPerDay, max_bytes: 2 * 1024 ** 3 }))
        yield* DeadLetter.ensure(destination, options)
        assert.deepStrictEqual(yield* limits, { days: 90, bytes: 2 * 1024 ** 3, messages: 0 }, "the operator's limits are kept")
        // Named limits are applied.
        yield* DeadLetter.ensure(destination, { ...options, maxAge: "60 days" })
        assert.strictEqual((yield* limits).days, 60)
      }).pipe(Effect.scoped))

    it.effect("a maxBytes below what the stream holds is refused, the dead letters kept; allowDataLoss applies it", () =>
      Effect.gen(function*() {
        const { options, destination, limits } = yield* fresh
        yield* DeadLetter.ensure(destination, options)
        const { jetstream } = yield* NatsConnection.NatsConnection
        for (let i = 0; i < 3; i++) {
          yield* Effect.promise(() => jetstream.publish(destination.subject, new Uint8Array(2000)))
        }
        const error = yield* Effect.flip(DeadLetter.ensure(destination, { ...options, maxBytes: 3000 }))
        assert.include(error.message, "max_bytes", error.message)
        assert.include(error.message, "allowDataLoss", error.message)
        assert.deepStrictEqual(yield* limits, { days: 30, bytes: 1024 * 1024 * 1024, messages: 3 })
        yield* DeadLetter.ensure(destination, { ...options, maxBytes: 3000, allowDataLoss: true })
        const after = yield* limits
        assert.strictEqual(after.bytes, 3000)
        assert.isBelow(after.messages, 3)
      }).pipe(Effect.scoped))

    it.effect("the MaxDeliver capture stream: 7 days when created, a live stream keeps the age an operator gave it", () =>
      Effect.gen(function*() {
        const { manager } = yield* NatsConnection.NatsConnection
        const source = `CAPLIM_${crypto.randomUUID().slice(0, 8)}`.toUpperCase()
        const name = MaxDeliveries.captureStream(source, "worker")
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        const days = Effect.map(Effect.promise(() => manager.streams.info(name)), (info) => info.config.max_age / nanosPerDay)
        yield* MaxDeliveries.ensure(source, "worker")
        assert.strictEqual(yield* days, 7)
        const info = yield* Effect.promise(() => manager.streams.info(name))
        yield* Effect.promise(() => manager.streams.update(name, { ...info.config, max_age: 30 * nanosPerDay }))
        yield* MaxDeliveries.ensure(source, "worker")
        assert.strictEqual(yield* days, 30)
      }).pipe(Effect.scoped))
  })
})

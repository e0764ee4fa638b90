import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Topology } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A throw-away stream name, deleted with the scope. */
const streamName = Effect.gen(function*() {
  const { manager } = yield* NatsConnection.NatsConnection
  const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
  const name = `TL_${id}`
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, prefix: `tl_${id}` }
})

const exists = (f: () => Promise<unknown>) => Effect.promise(() => f().then(() => true, () => false))

describe("Topology", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a stream with a max age under 2 minutes and no duplicate window gets a window equal to its max age (as nats-server does), and a second ensure changes nothing", () =>
      Effect.gen(function*() {
        const { name, prefix } = yield* streamName
        const declared = { name, subjects: [`${prefix}.>`], maxAge: "1 minute" } as const
        const info = yield* Topology.ensureStream(declared)
        assert.strictEqual(info.config.duplicate_window, 60_000_000_000)
        assert.strictEqual(info.config.max_age, 60_000_000_000)
        assert.deepStrictEqual(Topology.streamChanges(declared, info.config), [])
        // A longer max age keeps the 2-minute default.
        assert.strictEqual(Topology.streamConfig({ name, subjects: [`${prefix}.>`], maxAge: "1 hour" }).duplicate_window, 120_000_000_000)
        assert.strictEqual(Topology.streamConfig({ name, subjects: [`${prefix}.>`] }).duplicate_window, 120_000_000_000)
        // Shortening the max age of the live stream brings the default window down with it.
        const shorter = yield* Topology.ensureStream({ ...declared, maxAge: "30 seconds" })
        assert.strictEqual(shorter.config.duplicate_window, 30_000_000_000)
      }).pipe(Effect.scoped))

    it.effect("a declared duplicate window longer than the max age is refused, naming both, before anything is sent", () =>
      Effect.gen(function*() {
        const { name, prefix } = yield* streamName
        const { manager } = yield* NatsConnection.NatsConnection
        const error = yield* Effect.flip(
          Topology.ensureStream({ name, subjects: [`${prefix}.>`], maxAge: "1 minute", duplicateWindow: "2 minutes" })
        )
        assert.deepInclude(error, { reason: "ApiError", operation: `ensure stream ${name}` })
        assert.include(error.message, "duplicateWindow")
        assert.include(error.message, "maxAge")
        assert.include(error.message, "2m")
        assert.include(error.message, "1m")
        assert.notInclude(error.message, "can not be larger")
        assert.isFalse(yield* exists(() => manager.streams.info(name)), `stream ${name} was created`)
      }).pipe(Effect.scoped))

    it.effect("a consumer filter outside the stream's subjects is refused before the consumer is created or updated; one inside, or a wildcard wider than them, is taken", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        const outside = yield* Effect.flip(Topology.ensureConsumer({ stream: stream.stream, name: "outside", filterSubject: "billing.>" }))
        assert.deepInclude(outside, { reason: "ApiError", operation: `ensure consumer ${stream.stream}/outside` })
        assert.include(outside.message, "filterSubject \"billing.>\"")
        assert.include(outside.message, `${stream.subjectPrefix}.>`)
        assert.notInclude(outside.message, "not a valid subset")
        assert.isFalse(yield* exists(() => manager.consumers.info(stream.stream, "outside")), "consumer outside was created")
        // An existing consumer is not moved outside either.
        yield* Topology.ensureConsumer({ stream: stream.stream, name: "inside", filterSubject: stream.subject("eu.>") })
        const moved = yield* Effect.flip(Topology.ensureConsumer({ stream: stream.stream, name: "inside", filterSubject: "billing.eu" }))
        assert.include(moved.message, "filterSubject \"billing.eu\"")
        const live = yield* Effect.promise(() => manager.consumers.info(stream.stream, "inside"))
        assert.strictEqual(live.config.filter_subject, stream.subject("eu.>"))
        const wider = yield* Topology.ensureConsumer({ stream: stream.stream, name: "wider", filterSubject: ">" })
        assert.strictEqual(wider.config.filter_subject, ">")
      }).pipe(Effect.scoped))
  })
})

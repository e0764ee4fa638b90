import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection } from "@jetworker/nats"
import { Duration, Effect } from "effect"

const NatsLive = NatsConnection.layer({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  name: "jetworker-test-deadletter-max-age"
})

describe("DeadLetter.ensure with a short maxAge", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "30 seconds" })((it) => {
    it.effect("a dead-letter stream keeping letters under 2 minutes is created, its duplicate window no longer than its max age", () =>
      Effect.gen(function*() {
        const { manager } = yield* NatsConnection.NatsConnection
        const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
        const stream = `DLQ_SHORT_${id}`
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => manager.streams.delete(stream).catch(() => false)).pipe(Effect.timeoutOption(Duration.seconds(5)))
        )
        const options: DeadLetter.Options = { stream, subjectPrefix: `dlq_short_${id}`, maxAge: "1 minute" }
        yield* DeadLetter.ensure(DeadLetter.destination(`SRC_${id}`, "worker", options), options)
        const info = yield* Effect.promise(() => manager.streams.info(stream))
        assert.strictEqual(info.config.max_age, 60_000_000_000)
        assert.strictEqual(info.config.duplicate_window, 60_000_000_000)
      }))
  })
})

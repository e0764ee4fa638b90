/**
 * `Publisher.publish` without a `stream` caches the stream that captures a subject, once per
 * subject and connection (INT-NATS-007). Before: when the subject had since moved to another
 * stream (an operator's migration: the old stream deleted, a new one created for the same
 * subjects), the next publish sent `Nats-Expected-Stream` of the cached, stale stream, the new
 * stream refused it (10060, "expected stream does not match") and the publish failed with a final
 * `ApiError`, not retried: a handler dead-lettered its message as permanent, the outbox relay
 * logged a false `outbox.relay_blocked`. The cache was dropped only after the retries ended. Now
 * the refusal drops it and the stream is looked up again within the same attempt (with
 * `attempts: 1` it failed once more, the next publish succeeding), with the same `Nats-Msg-Id`.
 */
import { assert, describe, layer } from "@effect/vitest"
import { NatsConnection, Publisher } from "@jetworker/nats"
import { Effect } from "effect"

const natsUrl = new URL(process.env.NATS_URL ?? "nats://127.0.0.1:4222")
const NatsLive = NatsConnection.layer({ servers: natsUrl.href })
const encoder = new TextEncoder()

describe("Publisher: a subject moved to another stream", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    /** Stream A captures the subject and is cached; then A is deleted and B created with its subjects. */
    const moved = Effect.gen(function*() {
      const { manager } = yield* NatsConnection.NatsConnection
      const tag = Math.random().toString(36).slice(2, 10)
      const subjects = [`stale.${tag}.>`]
      const subject = `stale.${tag}.x`
      const [first, second] = [`STALE_A_${tag}`.toUpperCase(), `STALE_B_${tag}`.toUpperCase()]
      const remove = (name: string) => Effect.promise(() => manager.streams.delete(name).catch(() => false))
      yield* Effect.addFinalizer(() => Effect.andThen(remove(first), remove(second)))
      yield* Effect.promise(() => manager.streams.add({ name: first, subjects }))
      assert.strictEqual((yield* Publisher.publish(subject, encoder.encode("1"), { msgId: `${tag}-1` })).stream, first)
      yield* remove(first)
      yield* Effect.promise(() => manager.streams.add({ name: second, subjects }))
      const stored = Effect.map(Effect.promise(() => manager.streams.info(second)), (info) => info.state.messages)
      return { tag, subject, first, second, stored }
    })

    it.effect("INT-NATS-007: with default options the publish that meets the stale cached stream looks the stream up again and is stored, once", () =>
      Effect.gen(function*() {
        const { second, stored, subject, tag } = yield* moved
        const result = yield* Effect.result(Publisher.publish(subject, encoder.encode("2"), { msgId: `${tag}-2` }))
        assert.strictEqual(
          result._tag,
          "Success",
          result._tag === "Failure"
            ? `failed with ${result.failure.reason} (code ${result.failure.code}, retryable ${result.failure.isRetryable}): ${result.failure.message}`
            : ""
        )
        if (result._tag === "Success") {
          assert.strictEqual(result.success.stream, second)
          assert.isFalse(result.success.duplicate)
        }
        assert.strictEqual(yield* stored, 1, "the publish is stored in the stream that now captures the subject")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: with attempts: 1 the stale cached stream costs no attempt: looked up again within it, stored once", () =>
      Effect.gen(function*() {
        const { second, stored, subject, tag } = yield* moved
        const result = yield* Effect.result(Publisher.publish(subject, encoder.encode("2"), { msgId: `${tag}-2`, attempts: 1 }))
        assert.strictEqual(result._tag, "Success", result._tag === "Failure" ? `${result.failure.reason}: ${result.failure.message}` : "")
        if (result._tag === "Success") assert.strictEqual(result.success.stream, second)
        assert.strictEqual(yield* stored, 1)
      }).pipe(Effect.scoped))

    it.effect("a stream named in the options is the caller's: its refusal (10060) stays final, not retried, and nothing is stored", () =>
      Effect.gen(function*() {
        const { first, stored, subject, tag } = yield* moved
        const error = yield* Effect.flip(Publisher.publish(subject, encoder.encode("2"), { msgId: `${tag}-2`, stream: first }))
        assert.strictEqual(error.reason, "ApiError")
        assert.strictEqual(error.code, 10060)
        assert.isFalse(error.isRetryable)
        assert.notInclude(error.message, "looked up again")
        assert.strictEqual(yield* stored, 0)
      }).pipe(Effect.scoped))
  })
})

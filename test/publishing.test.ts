/**
 * Confirmed JetStream publishing (INT-NATS-007) against the real NATS server: a publish counts
 * only on a positive PubAck from the expected stream; a PubAck lost in flight (the reply held back
 * by the loopback fault proxy, then the connection cut and restored) is retried with the same
 * message and the same `Nats-Msg-Id`, and the stream stores it once; a retry inside the duplicate
 * window is a duplicate, one after it a second copy, which the consumer's dedup row turns into a
 * `Duplicate` with no second effect; the republish horizon is compared with the stream's window.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Outbox } from "@jetworker/core"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { Eventually, FaultProxy, NatsServer, OutcomeLog, TestStream } from "@jetworker/testing"
import { Context, Duration, Effect, Fiber, Layer, Result } from "effect"
import * as LedgerWorker from "../examples/ledger/src/LedgerWorker.ts"
import { balances, ledgerStream, transfer, transferCounts, twoAccounts } from "./support/ledger.ts"
import { LedgerTestLive, natsUrl } from "./support/services.ts"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** The error `effect` fails with; a test failure saying what was expected when it succeeds. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>, expected: string) =>
  Effect.flip(Effect.andThen(effect, Effect.die(new Error(`it succeeded; expected a failure: ${expected}`))))

/** Every message published on `subject` from now on (a core subscription): its `Nats-Msg-Id` and body. */
const watchSubject = (subject: string) =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const seen: Array<{ readonly msgId: string | undefined; readonly body: string }> = []
    const subscription = connection.subscribe(subject, {
      callback: (_error, msg) => {
        seen.push({ msgId: msg.headers?.get("Nats-Msg-Id"), body: decoder.decode(msg.data) })
      }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => subscription.unsubscribe()))
    yield* Effect.promise(() => connection.flush())
    return seen
  })

describe("publishing (INT-NATS-007)", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("INT-NATS-007: positive and negative PubAck: a stored publish gives its stream and sequence; another stream's subject, and a subject no stream captures, fail and count as not published", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const other = yield* TestStream.make()
        const ack = yield* Publisher.publish(stream.subject("a"), encoder.encode("{}"), { msgId: "p1", stream: stream.stream })
        assert.deepInclude(ack, { stream: stream.stream, seq: 1, duplicate: false })

        // The subject belongs to another stream: the server refuses it (expected stream), nothing stored.
        const wrong = yield* Effect.flip(
          Publisher.publish(other.subject("a"), encoder.encode("{}"), { msgId: "p2", stream: stream.stream, attempts: 1 })
        )
        assert.strictEqual(wrong._tag, "NatsError")
        assert.isFalse(wrong.isRetryable, wrong.message)
        assert.deepStrictEqual([yield* stream.stored, yield* other.stored], [1, 0])

        // No stream captures the subject: a readable failure, not "JetStream not enabled", and a
        // final one (retrying cannot help), though the publish names its stream.
        const nowhere = `nowhere_${crypto.randomUUID().slice(0, 8)}.created`
        const lost = yield* Effect.flip(
          Publisher.publish(nowhere, encoder.encode("{}"), { msgId: "p3", stream: stream.stream, attempts: 3 })
        )
        assert.strictEqual(lost.reason, "StreamNotFound")
        assert.isFalse(lost.isRetryable)
        assert.include(lost.message, `no stream captures subject ${nowhere} (expected stream ${stream.stream}`)

        // A header that would switch deduplication off on NATS 2.9 is refused before sending.
        const header = yield* Effect.flip(
          Publisher.publish(stream.subject("a"), encoder.encode("{}"), {
            msgId: "p4",
            stream: stream.stream,
            headers: [["X-Original-Nats-Msg-Id", "old"]]
          })
        )
        assert.include(header.message, "is not allowed")
        assert.strictEqual(yield* stream.stored, 1)
      }))

    it.effect("INT-NATS-007: timeout and reconnect after a publish that was in fact stored: the retry with the same id and the same Nats-Msg-Id is stored once", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const subject = stream.subject("created")
        const copies = yield* watchSubject(subject)
        const parsed = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: parsed.hostname, port: Number(parsed.port || 4222) } })
        const proxied = yield* Layer.build(NatsConnection.layer({
          servers: `nats://${proxy.address.host}:${proxy.address.port}`,
          name: "publishing-via-proxy",
          reconnectTimeWait: "100 millis"
        }))
        // The server's replies are held back: the publish reaches the stream, its PubAck does not.
        yield* proxy.pauseToClient
        const publishing = yield* Publisher.publish(subject, encoder.encode(`{"id":"order-1"}`), {
          msgId: "order-1",
          stream: stream.stream,
          attempts: 10,
          timeout: "500 millis"
        }).pipe(Effect.provideService(NatsConnection.NatsConnection, Context.get(proxied, NatsConnection.NatsConnection)), Effect.forkChild)
        yield* Eventually.holds("the first attempt stored", Effect.map(stream.stored, (n) => n === 1), "10 seconds")
        yield* Eventually.holds("a retry after the timeout", Effect.sync(() => copies.length >= 2), "10 seconds")
        // Then the connection breaks; the client reconnects and retries again.
        yield* proxy.cut
        yield* proxy.resume
        yield* proxy.restore
        const ack = yield* Fiber.join(publishing).pipe(Effect.timeout("20 seconds"))
        assert.deepInclude(ack, { stream: stream.stream, seq: 1, duplicate: true }, "the retry was recognised as the stored message")
        assert.strictEqual(yield* stream.stored, 1, "stored once")
        assert.isAtLeast(copies.length, 2)
        assert.deepStrictEqual([...new Set(copies.map((c) => `${c.msgId} ${c.body}`))], [`order-1 {"id":"order-1"}`], "every attempt the same message and id")
      }))

    it.effect("INT-NATS-007: retry before and after the duplicate window boundary: inside, a duplicate; after, a second copy that the consumer's dedup row ends as Duplicate, applied once", () =>
      Effect.gen(function*() {
        const { stream, settings } = yield* ledgerStream({ ackWait: Duration.seconds(30) })
        yield* Topology.ensureStream({ name: stream.stream, subjects: [`${stream.subjectPrefix}.>`], duplicateWindow: "1 second" })
        const { p, a, b } = yield* twoAccounts("window")
        const id = `${p}.t1`
        const body = encoder.encode(transfer(id, a, b, 10_00))
        const first = yield* Publisher.publish(stream.subject("eur"), body, { msgId: id, stream: stream.stream })
        const inside = yield* Publisher.publish(stream.subject("eur"), body, { msgId: id, stream: stream.stream })
        assert.deepStrictEqual([inside.seq, inside.duplicate], [first.seq, true], "inside the window: the same message")
        // The window passes (the scenario's own time, not a wait for a result).
        yield* Effect.sleep("1500 millis")
        const after = yield* Publisher.publish(stream.subject("eur"), body, { msgId: id, stream: stream.stream })
        assert.deepStrictEqual([after.seq, after.duplicate], [first.seq + 1, false], "after the window: a second copy")
        const log = yield* OutcomeLog.make
        const fiber = yield* Effect.forkChild(Consumer.run(LedgerWorker.consumer(settings, log.record)))
        const outcomes = yield* log.waitUntil((all) => all.length >= 2, "15 seconds")
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(outcomes.map((o) => [o.message.sequence, o._tag]), [[first.seq, "Committed"], [after.seq, "Duplicate"]])
        assert.deepStrictEqual([...(yield* transferCounts([id])).values()], [1])
        assert.deepStrictEqual(yield* balances([a, b]), { [a]: 90_00n, [b]: 10_00n })
      }))

    it.effect("INT-NATS-007: the republish horizon compared with the dedup setting: covered by the default window, not by a short one, with a warning", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        // Five attempts of 5 s plus their jittered delays.
        assert.strictEqual(Duration.toMillis(Result.getOrThrow(Publisher.republishHorizon({ attempts: 5, timeout: "5 seconds" }))), 25_000 + 1_800)
        const covered = yield* Publisher.checkHorizon(stream.stream, { attempts: 5, timeout: "5 seconds" })
        assert.deepInclude(covered, { covered: true })
        assert.strictEqual(Duration.toMillis(covered.duplicateWindow), 120_000)
        yield* Topology.ensureStream({ name: stream.stream, subjects: [`${stream.subjectPrefix}.>`], duplicateWindow: "10 seconds" })
        const short = yield* Publisher.checkHorizon(stream.stream, { attempts: 5, timeout: "5 seconds" })
        assert.deepInclude(short, { covered: false })
        assert.strictEqual(Duration.toMillis(short.duplicateWindow), 10_000)
        assert.isTrue(yield* Effect.map(Publisher.checkHorizon(stream.stream, { attempts: 1, timeout: "2 seconds" }), (c) => c.covered))
      }))

    it.effect("INT-NATS-007: a publish nobody answers because JetStream is down stays retryable (it may succeed later), unlike one no stream captures", () =>
      Effect.gen(function*() {
        const server = yield* NatsServer.make({ config: "jetstream: disabled" })
        const withoutJetStream = yield* Layer.build(NatsConnection.layer({ servers: server.url, name: "publishing-no-jetstream" }))
        const error = yield* Effect.flip(
          Publisher.publish("orders.created", encoder.encode("{}"), { msgId: "down-1", stream: "ORDERS", attempts: 2, timeout: "1 second" }).pipe(
            Effect.provideService(NatsConnection.NatsConnection, Context.get(withoutJetStream, NatsConnection.NatsConnection))
          )
        )
        assert.strictEqual(error.reason, "NoResponders")
        assert.isTrue(error.isRetryable)
        assert.include(error.message, "JetStream did not answer the publish to orders.created nor the look-up of its stream")
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: publish options are checked before anything is sent, and by outboxPublisher when its layer is built: attempts from 1 to 100, a timeout that parses, from 1 ms to 2^31 - 1 ms (nats.js would turn a longer one into 1 ms and report a stored publish as timed out)", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const refused: Array<readonly [{ readonly attempts?: number; readonly timeout?: Duration.Input }, string]> = [
          [{ attempts: 0 }, "attempts must be an integer from 1 to 100, got 0"],
          [{ attempts: 101 }, "attempts must be an integer from 1 to 100, got 101"],
          [{ attempts: 1.5 }, "attempts must be an integer from 1 to 100, got 1.5"],
          [{ timeout: "soon" as Duration.Input }, `timeout must be a duration from 1 millis to 2147483647 millis (about 24.8 days), such as "5 seconds", got "soon"`],
          [{ timeout: 0 }, "timeout must be a duration from 1 millis"],
          [{ timeout: "30 days" }, `timeout must be a duration from 1 millis to 2147483647 millis (about 24.8 days), such as "5 seconds", got "30 days"`]
        ]
        for (const [options, expected] of refused) {
          const built = yield* failureOf(Layer.build(Publisher.outboxPublisher(options)), `outboxPublisher(${JSON.stringify(options)}) refused: ${expected}`)
          assert.deepInclude(built, { reason: "ApiError", operation: "Publisher.outboxPublisher" })
          assert.include(built.message, expected)
          const published = yield* failureOf(
            Publisher.publish(stream.subject("a"), encoder.encode("{}"), { ...options, msgId: "opt-1", stream: stream.stream }),
            `publish with ${JSON.stringify(options)} refused: ${expected}`
          )
          assert.isFalse(published.isRetryable)
          assert.include(published.message, expected)
        }
        assert.strictEqual(yield* stream.stored, 0, "nothing was sent")

        // A long timeout inside the range is honoured: a PubAck held back until the message is
        // stored still confirms the publish (with a timer overflowed to 1 ms it would fail first).
        const parsed = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: parsed.hostname, port: Number(parsed.port || 4222) } })
        const proxied = yield* Layer.build(NatsConnection.layer({ servers: `nats://${proxy.address.host}:${proxy.address.port}`, name: "publishing-long-timeout" }))
        yield* proxy.pauseToClient
        const publishing = yield* Publisher.publish(stream.subject("a"), encoder.encode("{}"), { msgId: "opt-20d", stream: stream.stream, attempts: 1, timeout: "20 days" }).pipe(
          Effect.provideService(NatsConnection.NatsConnection, Context.get(proxied, NatsConnection.NatsConnection)),
          Effect.forkChild
        )
        yield* Eventually.holds("the publish is stored", Effect.map(stream.stored, (n) => n === 1), "10 seconds")
        yield* proxy.resume
        const ack = yield* Fiber.join(publishing).pipe(Effect.timeout("10 seconds"))
        assert.deepInclude(ack, { stream: stream.stream, seq: 1, duplicate: false })
      }).pipe(Effect.scoped))

    it.effect("INT-NATS-007: a subject longer than a NATS control line takes (Outbox.maxSubjectBytes) is refused before it is sent, for good, and the connection stays up", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { connection } = yield* NatsConnection.NatsConnection
        const subject = stream.subject("x".repeat(Outbox.maxSubjectBytes))
        const error = yield* Effect.flip(Publisher.publish(subject, encoder.encode("{}"), { msgId: "long-1", stream: stream.stream }))
        assert.deepInclude(error, { reason: "ApiError", operation: `publish ${subject}` })
        assert.isFalse(error.isRetryable)
        assert.include(error.message, `bytes, more than the ${Outbox.maxSubjectBytes} that fit a NATS control line`)
        yield* Effect.promise(() => connection.flush())
        assert.isFalse(connection.isClosed())
        assert.strictEqual(yield* stream.stored, 0)
      }).pipe(Effect.scoped))
  })
})

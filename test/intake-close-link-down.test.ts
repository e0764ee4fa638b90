/**
 * The JetStream intake's close and the state of its NATS link (real NATS behind a fault proxy).
 * Over a live link, close naks what is still buffered, confirmed before it returns, so those
 * messages go to another instance at once. Over a link that is down, nothing can be sent or
 * answered: close sends nothing and waits for nothing (the server redelivers the buffered
 * messages after their ack wait, and a line says how many), and a link lost while close waits
 * ends the wait.
 *
 * Failed before: close sent two flushes and a consumer info over the dead connection and waited
 * out `settleTimeout` for each (see worker-stop-dependency-outage.test.ts for the worker's view:
 * exit 3 with a 6 s budget and nothing in flight).
 */
import { assert, describe, layer } from "@effect/vitest"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, TestStream } from "@jetworker/testing"
import { Clock, Context, type Duration, Effect, Fiber, Layer, Logger } from "effect"
import { NatsLive, natsUrl } from "./support/services.ts"

const collecting = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => void lines.push(String(Array.isArray(message) ? message[0] : message)))
  return { lines, layer: Logger.layer([logger]) }
}

/** A stream with three messages, buffered by an intake on a connection through a proxy (no take). */
const threeBuffered = (settleTimeout: Duration.Input) =>
  Effect.gen(function*() {
    const test = yield* TestStream.make({ ackWait: "60 seconds" })
    const target = new URL(natsUrl)
    const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
    const worker = yield* Layer.build(
      NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, reconnectTimeWait: "100 millis" })
    )
    const connection = Context.get(worker, NatsConnection.NatsConnection)
    const logged = collecting()
    for (let n = 1; n <= 3; n++) yield* test.publish("a", `m${n}`, `m${n}`)
    const intake = yield* JetStreamSource.make({ stream: test.stream, consumer: test.consumer, captureMaxDeliveries: false, settleTimeout })
      .open({ consumer: test.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
      .pipe(Effect.provide(worker), Effect.provide(logged.layer))
    yield* Eventually.holds("three handed out", Effect.map(test.info, (i) => i.num_ack_pending === 3), "10 seconds")
    // A round trip on the worker's connection: what the server sent before its answer has arrived.
    yield* Effect.promise(() => connection.connection.flush())
    // Resolves at the client's next disconnect, as the intake's own status watch sees it.
    const disconnected = Effect.promise(async () => {
      for await (const status of connection.connection.status()) if (status.type === "disconnect") return
    })
    return { test, proxy, intake, logged, disconnected }
  })

describe("the JetStream intake's close and its NATS link", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("over a live link, close naks the buffered messages before it returns: the server hands them out again at once", () =>
      Effect.gen(function*() {
        const { intake, logged, test } = yield* threeBuffered("5 seconds")
        yield* intake.close.pipe(Effect.provide(logged.layer))
        assert.include(logged.lines, `${test.stream}/${test.consumer}: released 3 buffered messages`)
        // Handed out again at once (their ack wait is a minute), as their second delivery.
        const { jetstream } = yield* NatsConnection.NatsConnection
        const raw = yield* Effect.promise(() => jetstream.consumers.get(test.stream, test.consumer))
        const again = yield* Effect.promise(() => raw.fetch({ max_messages: 3, expires: 2_000 }).then(async (messages) => {
          const counts: Array<number> = []
          for await (const message of messages) counts.push(message.info.deliveryCount)
          return counts
        }))
        assert.deepStrictEqual(again, [2, 2, 2])
      }).pipe(Effect.scoped))

    it.effect("BE-SHUT-002: over a link reset with reconnects refused, close returns at once and says the buffered messages were not released", () =>
      Effect.gen(function*() {
        const { disconnected, intake, logged, proxy } = yield* threeBuffered("5 seconds")
        const down = yield* Effect.forkChild(disconnected)
        yield* proxy.cut
        yield* Fiber.join(down)
        const start = yield* Clock.currentTimeMillis
        yield* intake.close.pipe(Effect.provide(logged.layer))
        const took = (yield* Clock.currentTimeMillis) - start
        assert.isBelow(took, 1_000, "close waits on no round trip over a link that is down")
        assert.isTrue(logged.lines.some((l) => l.includes("3 buffered messages not released")), JSON.stringify(logged.lines))
      }).pipe(Effect.scoped))

    it.effect("BE-SHUT-002: a link lost while close waits on the broker ends the wait", () =>
      Effect.gen(function*() {
        const { disconnected, intake, proxy } = yield* threeBuffered("20 seconds")
        const down = yield* Effect.forkChild(disconnected)
        // A frozen link: close's first round trip waits (up to the 20 s settle timeout).
        yield* proxy.pause
        const closing = yield* Effect.forkChild(intake.close)
        yield* Effect.sleep("300 millis")
        assert.isUndefined(closing.pollUnsafe(), "close waits on the frozen link")
        yield* proxy.cut
        yield* Fiber.join(down)
        const lostAt = yield* Clock.currentTimeMillis
        yield* Fiber.join(closing)
        assert.isBelow((yield* Clock.currentTimeMillis) - lostAt, 1_000, "close ends once the link is down")
      }).pipe(Effect.scoped))
  })
})

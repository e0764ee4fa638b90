/**
 * The JetStream intake's buffered messages during a dependency pause (BE-JOB-003, INT-NATS-002)
 * when the NATS link fails or another instance of the same durable takes them over.
 *
 * A one-second cut of the worker's connection in a pause of three ack waits, and its reconnect,
 * hand no buffered message back: each runs once, on its first delivery, after the pause. The ack
 * wait is 4 s: an extension sent during the cut waits a third of it for its answer, so it outlasts
 * the cut and is answered after the reconnect. With 2 s it timed out during the cut, and the next
 * came too late (past 90% of the lease) in most runs, for the held message or the buffered ones.
 * One lost at the cut's start (its request or reply dropped) is sent again as soon as its wait
 * ends: when the keepers waited for their next check instead, that came past 90% of the lease in
 * the worst phase, and a CI run gave up all four buffered messages.
 *
 * Past `dependencies.maxHold` the buffered messages' leases run out and the broker hands them to
 * another instance of the same durable, while the paused instance still holds the stale
 * deliveries, and its close naks every buffered one. The nats-server does not apply an old owner's
 * nak to the new delivery, so the other instance runs each message once. The case keeps the
 * consumer's ack floor below those deliveries (a third holder works on an earlier message
 * throughout, as a long job elsewhere in a shared durable would), where such a nak could matter.
 *
 * A NATS connection closed for good during a pause (its reconnect attempts spent) raises no
 * uncaught exception from the intake. A closed connection answers a lease extension at once,
 * before the call that sent it returns; the intake's keeper of buffered leases then threw a
 * `ReferenceError` out of its timer, an uncaught exception that ends a Node process.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, CurrentDelivery, Lifecycle } from "@jetworker/core"
import { NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, NatsServer, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Layer, Logger } from "effect"
import { job, jobsOf, pausedLifecycle, runPaused, summary } from "./support/pausedIntake.ts"
import { NatsLive, natsUrl } from "./support/services.ts"

describe("the intake's buffered messages during a dependency pause, under faults", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("a 1 s cut of the worker's connection in a pause of three ack waits hands no buffered message back", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "4 seconds", maxDeliver: 10 })
        const target = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
        // The worker's own connection, through the proxy.
        const worker = yield* Layer.build(
          NatsConnection.layer({ servers: `nats://${proxy.address.host}:${proxy.address.port}`, reconnectTimeWait: "100 millis" })
        )
        const { db, handled, outcomes, fiber } = yield* runPaused(test, "5 minutes").pipe(Effect.provide(worker))
        db.up = false
        for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
        yield* Eventually.holds("five delivered", Effect.map(test.info, (i) => i.num_ack_pending === 5), "10 seconds")
        // One ack wait into the pause, the cut; the pause ends two ack waits after it.
        yield* Effect.sleep("4 seconds")
        yield* proxy.cut
        yield* Effect.sleep("1 second")
        yield* proxy.restore
        yield* Effect.sleep("7 seconds")
        db.up = true
        yield* Eventually.holds("committed", Effect.sync(() => outcomes.filter((o) => o._tag === "Committed").length === 5), "30 seconds")
        const info = yield* test.info
        yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"))
        assert.deepStrictEqual(
          handled.filter((h) => h.up).map((h) => `${h.n}@${h.deliveryCount}`).sort(),
          [1, 2, 3, 4, 5].map((n) => `${n}@1`).sort(),
          `${JSON.stringify(handled)} ${summary(outcomes)}`
        )
        assert.strictEqual(info.num_redelivered, 0, JSON.stringify(info))
      }).pipe(Effect.scoped), 90_000)

    it.effect("closing an instance paused past maxHold, whose buffered messages went to another instance, runs none twice: that instance runs each once", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 20 })
        // A third holder (a raw pull) works on an earlier message for the whole test, keeping it in
        // progress (+WPI every half second): a long job elsewhere, as is usual in a shared durable.
        // It keeps the consumer's ack floor below the deliveries that follow.
        const { jetstream } = yield* NatsConnection.NatsConnection
        yield* test.publish("a", job(0), "j0")
        const raw = yield* Effect.promise(() => jetstream.consumers.get(test.stream, test.consumer))
        const held = yield* Effect.promise(() => raw.next({ expires: 5_000 }))
        assert.isNotNull(held)
        const working = setInterval(() => held!.working(), 500)
        yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(working)))
        // Instance A: paused on its database, holds at most 1 s.
        const { lifecycle, db, query } = yield* pausedLifecycle()
        const aLines: Array<string> = []
        const a = yield* Effect.forkChild(
          Consumer.run(Consumer.make({
            ...jobsOf(test),
            name: `${test.consumer}-a`,
            handle: () => query,
            classify: { DatabaseDown: "transient" },
            concurrency: 1,
            prefetch: 4,
            dependencies: { maxHold: "1 second" }
          })).pipe(
            Effect.provideService(Lifecycle.Lifecycle, lifecycle),
            Effect.provide(Logger.layer([Logger.make(({ message }) => void aLines.push(String(Array.isArray(message) ? message[0] : message)))]))
          )
        )
        yield* Eventually.holds("A ready", Effect.sync(() => lifecycle.readiness().ready), "15 seconds")
        // A's database goes down: message 1 is held (the pause begins), 2 to 5 wait in A's buffer.
        db.up = false
        for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`)
        yield* Eventually.holds("A holds all five", Effect.map(test.info, (i) => i.num_ack_pending === 6), "10 seconds")
        // Instance B of the same durable: healthy, its handler 1 s (within the ack wait).
        const runs: Array<{ readonly n: number; readonly deliveryCount: number; readonly at: number }> = []
        const started = Date.now()
        const b = yield* Effect.forkChild(
          Consumer.run(Consumer.make({
            ...jobsOf(test),
            name: `${test.consumer}-b`,
            handle: (event) =>
              CurrentDelivery.CurrentDelivery.use((delivery) =>
                Effect.andThen(
                  Effect.sync(() => void runs.push({ n: event.data.n, deliveryCount: delivery.deliveryCount, at: Date.now() - started })),
                  Effect.sleep("1 second")
                )
              ),
            classify: {},
            concurrency: 1,
            prefetch: 1
          })).pipe(Effect.provide(Logger.layer([])))
        )
        // Past A's maxHold the leases of what A buffered run out, and B gets them: once B runs
        // one of them, A stops (a deploy, a scale-in).
        yield* Eventually.holds("B runs a message A still buffers", Effect.sync(() => runs.some((r) => r.n >= 2 && r.n <= 5)), "20 seconds")
        const stopAt = Date.now() - started
        yield* Fiber.interrupt(a).pipe(Effect.timeout("15 seconds"))
        const stoppedAt = Date.now() - started
        yield* Eventually.holds(
          "everything acked",
          Effect.map(test.info, (i) => i.num_ack_pending === 1 && i.num_pending === 0),
          "30 seconds"
        )
        // Quiet for a while: a second run of a message would show now.
        yield* Effect.sleep("3 seconds")
        yield* Fiber.interrupt(b).pipe(Effect.timeout("15 seconds"))
        const times = (n: number) => runs.filter((r) => r.n === n).length
        const twice = [1, 2, 3, 4, 5].filter((n) => times(n) > 1)
        assert.deepStrictEqual([1, 2, 3, 4, 5].filter((n) => times(n) === 0), [], `messages B never ran: ${JSON.stringify(runs)}`)
        assert.deepStrictEqual(twice, [], `A's lines: ${aLines.join(" | ")}; A stopped at +${stopAt}..${stoppedAt} ms; messages run twice by B: ${runs.map((r) => `${r.n}@${r.deliveryCount}(+${r.at} ms)`).join(", ")}`)
      }).pipe(Effect.scoped), 90_000)
  })

  it.live("a NATS connection closed for good during a dependency pause raises no uncaught exception from the intake", () =>
    Effect.gen(function*() {
      const uncaught: Array<string> = []
      const onUncaught = (error: unknown) => void uncaught.push(error instanceof Error ? `${error.name}: ${error.message}\n${error.stack}` : String(error))
      process.on("uncaughtException", onUncaught)
      yield* Effect.addFinalizer(() => Effect.sync(() => void process.off("uncaughtException", onUncaught)))

      const server = yield* NatsServer.make()
      const admin = yield* Layer.build(NatsConnection.layer({ servers: server.url }))
      const test = yield* TestStream.make({ ackWait: "2 seconds", maxDeliver: 10 }).pipe(Effect.provide(admin))
      // The worker's connection gives up after one reconnect attempt: closed for good.
      const worker = yield* Layer.build(NatsConnection.layer({ servers: server.url, maxReconnectAttempts: 1, reconnectTimeWait: "100 millis" }))
      const { db, fiber } = yield* runPaused(test, "5 minutes").pipe(Effect.provide(worker))
      // The pause begins (message 1 held); messages 2 to 5 wait in the intake's buffer, their
      // leases kept by the intake.
      db.up = false
      for (let n = 1; n <= 5; n++) yield* test.publish("a", job(n), `j${n}`).pipe(Effect.provide(admin))
      yield* Eventually.holds(
        "all five delivered",
        Effect.map(test.info.pipe(Effect.provide(admin)), (i) => i.num_ack_pending === 5),
        "10 seconds"
      )
      // NATS goes away; the worker's connection gives up and closes.
      yield* server.stop("SIGKILL")
      const connection = yield* NatsConnection.NatsConnection.pipe(Effect.provide(worker))
      yield* Eventually.holds("the worker's connection closed", Effect.sync(() => connection.connection.isClosed()), "10 seconds")
      // Two ack waits of the pause with the connection closed (the window watched).
      yield* Effect.sleep("4 seconds")
      yield* Fiber.interrupt(fiber).pipe(Effect.timeout("15 seconds"), Effect.ignore)
      // Back, so that the stream's clean-up finds it.
      yield* server.start
      assert.deepStrictEqual(uncaught, [], `uncaught exceptions while the connection was closed:\n${uncaught.join("\n")}`)
    }).pipe(Effect.scoped), 90_000)
})

/**
 * A stalled JetStream intake on the readiness probe (a copy of `cluster-intake.test.ts`'s stall,
 * on the NATS under test, with a consumer running under a managed lifecycle): while the consumer
 * answers no pull (`intake.stalled`) the consumer's component is down with a reason an operator
 * can read, and it is up again once the intake pulls again (`intake.resumed`). The log lines stay
 * as they were. Pulls that NATS refuses (a user denied `$JS.API.CONSUMER.MSG.NEXT.>`) stop the
 * consumer at once, naming the subject to grant, and readiness is down. (Before, those pulls
 * went unanswered while the consumer's info answered, and readiness came up again after each info.)
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Consumer, Envelope, Lifecycle } from "@jetworker/core"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, NatsServer, TestStream } from "@jetworker/testing"
import { type Context, Effect, Fiber, Layer, Logger, Result, Schema } from "effect"
import { NatsLive, natsUrl } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))

/** Log lines with their level and annotations, and the layer that collects them (replacing the others). */
const collecting = () => {
  const lines: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
  const logger = Logger.map(Logger.formatStructured, (entry) => {
    lines.push({ level: entry.level, message: entry.message, annotations: entry.annotations })
  })
  return { lines, layer: Logger.layer([logger]), events: (event: string) => lines.filter((l) => l.annotations.event === event) }
}

/**
 * Runs a consumer of `consumer` on `stream` through `worker`'s connection under `lifecycle`, its
 * pulls expiring after 2 s (heartbeats every 1 s: a pull is silent after 2.5 s); `handled` counts
 * what its handler ran.
 */
const runConsumer = (
  names: { readonly stream: string; readonly consumer: string },
  worker: Context.Context<NatsConnection.NatsConnection>,
  lifecycle: Lifecycle.LifecycleShape,
  logs: Layer.Layer<never>,
  handled: { count: number } = { count: 0 }
) =>
  Effect.forkChild(
    Consumer.run(Consumer.make({
      name: names.consumer,
      source: JetStreamSource.make({ ...names, captureMaxDeliveries: false, pullExpires: "2 seconds" }),
      schema: Event,
      handle: () => Effect.sync(() => void handled.count++),
      classify: {},
      concurrency: 1,
      prefetch: 4
    })).pipe(
      Effect.provideService(Lifecycle.Lifecycle, lifecycle),
      Effect.provide(worker),
      Effect.provide(logs)
    )
  )

describe("a stalled JetStream intake on the readiness probe", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("while the intake is stalled (intake.stalled) its consumer is down with the reason, and up again once it pulls again (intake.resumed)", () =>
      Effect.gen(function*() {
        const test = yield* TestStream.make({ ackWait: "60 seconds" })
        const { consumer, stream } = test
        const target = new URL(natsUrl)
        // A link that freezes without breaking: the server keeps the pull, the intake hears nothing.
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
        const worker = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}` }))
        const logged = collecting()
        const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "30 seconds" })
        yield* lifecycle.started
        const component = () => lifecycle.readiness().components.find((c) => c.name === consumer)
        const running = yield* runConsumer({ stream, consumer }, worker, lifecycle, logged.layer)
        yield* Eventually.holds("the consumer ready", Effect.sync(() => lifecycle.readiness().ready), "15 seconds")
        yield* Eventually.holds("the intake's pull waits on the server", Effect.map(test.info, (i) => i.num_waiting >= 1), "10 seconds")
        yield* proxy.pause
        yield* Eventually.holds("the stall logged", Effect.sync(() => logged.events("intake.stalled").length > 0), "15 seconds")
        // Reported as the stall is logged: no poll needed.
        const down = component()
        assert.isFalse(lifecycle.readiness().ready, JSON.stringify(lifecycle.readiness()))
        assert.strictEqual(down?.up, false, JSON.stringify(down))
        assert.match(
          down?.reason ?? "",
          new RegExp(`^intake stalled: the consumer ${stream}/${consumer} has not answered a pull for \\d+ ms`),
          JSON.stringify(down)
        )
        yield* proxy.resume
        yield* Eventually.holds("the resumption logged", Effect.sync(() => logged.events("intake.resumed").length > 0), "15 seconds")
        assert.deepStrictEqual(component(), { name: consumer, kind: "consumer", up: true, reason: undefined })
        assert.isTrue(lifecycle.readiness().ready)

        // The lines themselves (level, silenceMs, stalledMs) are cluster-intake.test.ts's.
        yield* Fiber.interrupt(running).pipe(Effect.timeout("15 seconds"))
      }).pipe(Effect.scoped), 60_000)
  })
})

describe("an intake whose pulls NATS refuses, on the readiness probe", () => {
  it.live("the consumer stops at once with NotAuthorized naming the pull subject, and readiness is down once it has", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({
        config: [
          "authorization {",
          "  users: [",
          "    { user: admin, password: admin }",
          "    { user: worker, password: worker, permissions: { publish: { deny: [\"$JS.API.CONSUMER.MSG.NEXT.>\"] } } }",
          "  ]",
          "}"
        ].join("\n")
      })
      const at = `127.0.0.1:${server.port}`
      const admin = yield* Layer.build(NatsConnection.layer({ servers: `nats://admin:admin@${at}` }))
      const test = yield* TestStream.make({ ackWait: "60 seconds" }).pipe(Effect.provide(admin))
      const { consumer, stream } = test
      const worker = yield* Layer.build(NatsConnection.layer({ servers: `nats://worker:worker@${at}` }))
      const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "30 seconds" })
      yield* lifecycle.started
      const component = () => lifecycle.readiness().components.find((c) => c.name === consumer)
      const handled = { count: 0 }
      yield* test.publish("a", JSON.stringify({ n: 1 }), "m1")
      const running = yield* runConsumer({ stream, consumer }, worker, lifecycle, Logger.layer([]), handled)
      // Before, the pulls went unanswered for ever: the intake stalled and checked the consumer
      // again and again. (The consumer may be up for the moment between its start and the
      // server's refusal of its first pull, which comes on the connection.)
      const stopped = yield* Fiber.join(running).pipe(Effect.timeout("10 seconds"), Effect.flip)
      assert.strictEqual(stopped._tag, "SourceError", String(stopped))
      const failure = stopped as { readonly reason?: string; readonly message: string }
      assert.strictEqual(failure.reason, "NotAuthorized")
      assert.include(failure.message, `publish permission on "$JS.API.CONSUMER.MSG.NEXT.${stream}.${consumer}"`)
      const info = yield* test.info
      assert.strictEqual(handled.count, 0, "a message was handled after all")
      assert.strictEqual(info.delivered.consumer_seq, 0, "a pull was answered after all")
      assert.notStrictEqual(component()?.up, true, JSON.stringify(component()))
      assert.isFalse(lifecycle.readiness().ready, JSON.stringify(lifecycle.readiness()))
    }).pipe(Effect.scoped), 60_000)
})

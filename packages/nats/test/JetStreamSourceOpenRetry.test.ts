/**
 * Opening a `JetStreamSource` across a NATS blip: the opening requests (consumer info, the
 * dead-letter and MaxDeliver-capture streams) are retried while the failure may pass (a request
 * lost while the link reconnects is retried when the link is back, not when its API timeout
 * ends), within a bound on the monotonic clock (a step of the wall clock neither stretches nor
 * cuts it); a final answer (a missing consumer) and a connection closed for good still fail at once.
 */
import { assert, describe, it } from "@effect/vitest"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Eventually, FaultProxy, TestStream } from "@jetworker/testing"
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Logger, Scope, Stream } from "effect"

const natsUrl = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const NatsLive = NatsConnection.layer({ servers: natsUrl })

/** A logger that keeps each message's text, and its layer (which replaces the default loggers). */
const captureLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push(String(Array.isArray(message) ? message[0] : message))
  })
  return { lines, layer: Logger.layer([logger]) }
}

const retryLine = (line: string) => line.includes("retrying")

/**
 * The live clock with a wall time that can be stepped (as NTP, a resumed VM or `date -s` step it)
 * while its monotonic time and its sleeps go on as before. (`TestClock` cannot show this: its
 * sleeps wake on its wall time, so a step back holds them too, and moving it forward again moves
 * the monotonic time with it.)
 */
const steppedClock = (live: Clock.Clock) => {
  let offsetMillis = 0
  const wallMillis = () => live.currentTimeMillisUnsafe() + offsetMillis
  const wallNanos = () => live.currentTimeNanosUnsafe() + BigInt(offsetMillis) * 1_000_000n
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: wallMillis,
    currentTimeMillis: Effect.sync(wallMillis),
    currentTimeNanosUnsafe: wallNanos,
    currentTimeNanos: Effect.sync(wallNanos),
    monotonicTimeNanosUnsafe: () => live.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: Effect.sync(() => live.monotonicTimeNanosUnsafe()),
    sleep: (duration) => live.sleep(duration)
  }
  return { clock, step: (millis: number) => Effect.sync(() => void (offsetMillis += millis)) }
}

/**
 * Opens a source through a link that stays cut (its requests time out after 200 ms), with
 * `openRetryTimeout` 1500 ms, and steps the wall clock by `stepMillis` once the first retry is
 * logged; returns how long `open` took to fail (real time) and the retry lines logged.
 */
const openWithWallStep = (stepMillis: number) =>
  Effect.gen(function*() {
    const stream = yield* TestStream.make()
    const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: Number(new URL(natsUrl).port || 4222) } })
    const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, apiTimeout: "200 millis" }))
    const logged = captureLogs()
    const wall = steppedClock(yield* Clock.Clock)
    yield* proxy.cut
    const started = performance.now()
    const opening = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, openRetryTimeout: "1500 millis" })
      .open({ consumer: stream.consumer, prefetch: 1, attempts: 3, ordering: "Unordered" })
      .pipe(
        Effect.scoped,
        Effect.provide(viaProxy),
        Effect.provide(logged.layer),
        Effect.provideService(Clock.Clock, wall.clock),
        Effect.flip,
        Effect.forkChild
      )
    yield* Eventually.holds("the first retry", Effect.sync(() => logged.lines.some(retryLine)), "5 seconds")
    yield* wall.step(stepMillis)
    // Bounded well past what the retries may take (1500 ms, then a last try of at most 2 s + 200 ms).
    const error = yield* Fiber.join(opening).pipe(Effect.timeout("10 seconds"))
    return { elapsed: performance.now() - started, error, retries: logged.lines.filter(retryLine), stream }
  })

describe("JetStreamSource.open across a NATS blip", () => {
  it.live("a link cut while the source opens is waited out: open retries after the reconnect and then delivers", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make({ maxDeliver: 10 })
      const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: Number(new URL(natsUrl).port || 4222) } })
      // A short API timeout, so that the request lost in the outage times out soon.
      const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, apiTimeout: "1 second" }))
      const logged = captureLogs()
      yield* proxy.cut
      const opening = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer })
        .open({ consumer: stream.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.provide(viaProxy), Effect.provide(logged.layer), Effect.forkChild)
      // The outage lasts until the opening consumer info, lost in it, has timed out and is retried.
      yield* Eventually.holds("the lost request retried", Effect.sync(() => logged.lines.some(retryLine)), "10 seconds")
      yield* proxy.restore
      const opened = yield* Fiber.await(opening).pipe(Effect.timeout("25 seconds"))
      assert.isTrue(Exit.isSuccess(opened), `open failed: ${String(opened)}\n${logged.lines.join("\n")}`)
      if (!Exit.isSuccess(opened)) return
      const intake = opened.value
      const seq = yield* stream.publish("a", "after the blip", "blip-1")
      const delivery = yield* intake.take.pipe(Effect.timeout("10 seconds"))
      assert.strictEqual(delivery.sequence, seq)
      const retries = logged.lines.filter(retryLine)
      assert.isAbove(retries.length, 0, logged.lines.join("\n"))
      assert.include(retries[0], `JetStreamSource ${stream.stream}/${stream.consumer}: consumer info`)
      assert.include(retries[0], "NATS link may be reconnecting")
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 60_000)

  it.live("a link cut while the dead-letter stream is ensured is waited out too", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make({ maxDeliver: 10 })
      const { connection } = yield* NatsConnection.NatsConnection
      const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: Number(new URL(natsUrl).port || 4222) } })
      const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, apiTimeout: "1 second" }))
      const logged = captureLogs()
      // The dead-letter stream's ensure starts with the source stream's info (its replicas): the
      // link is cut as the server reads that request, after the consumer info was answered.
      const cutAt = yield* Deferred.make<void>()
      // Once: the retries read the same stream's info.
      const tap = connection.subscribe(`$JS.API.STREAM.INFO.${stream.stream}`, {
        max: 1,
        callback: () => {
          Effect.runSync(Effect.andThen(proxy.cut, Deferred.succeed(cutAt, undefined)))
        }
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => tap.unsubscribe()))
      yield* Effect.promise(() => connection.flush())
      // The outage lasts until the request lost in it has timed out and is retried.
      yield* Effect.forkChild(Effect.andThen(
        Deferred.await(cutAt),
        Effect.andThen(Eventually.holds("the lost request retried", Effect.sync(() => logged.lines.some(retryLine)), "10 seconds"), proxy.restore)
      ))
      const intake = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer })
        .open({ consumer: stream.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.provide(viaProxy), Effect.provide(logged.layer), Effect.timeout("25 seconds"))
      assert.isTrue(yield* Deferred.isDone(cutAt))
      const seq = yield* stream.publish("a", "after the blip", "blip-2")
      const delivery = yield* intake.take.pipe(Effect.timeout("10 seconds"))
      assert.strictEqual(delivery.sequence, seq)
      const retries = logged.lines.filter(retryLine)
      assert.isAbove(retries.length, 0, logged.lines.join("\n"))
      assert.include(retries[0], `JetStreamSource ${stream.stream}/${stream.consumer}: dead-letter stream ${stream.deadLetterStream}`)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 60_000)

  it.live("a link that stays cut fails open once openRetryTimeout has passed, saying it was retried", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make()
      const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: Number(new URL(natsUrl).port || 4222) } })
      const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, apiTimeout: "200 millis" }))
      const logged = captureLogs()
      yield* proxy.cut
      const started = Date.now()
      const error = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer, openRetryTimeout: "1500 millis" })
        .open({ consumer: stream.consumer, prefetch: 1, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.scoped, Effect.provide(viaProxy), Effect.provide(logged.layer), Effect.flip, Effect.timeout("15 seconds"))
      const elapsed = Date.now() - started
      assert.include(error.message, `consumer info ${stream.stream}/${stream.consumer}: timeout (after `)
      assert.isAbove(logged.lines.filter(retryLine).length, 1, logged.lines.join("\n"))
      // No retry starts past the bound; the last one runs to its API timeout.
      assert.isAtLeast(elapsed, 1_000)
      assert.isBelow(elapsed, 1_500 + 2_000 + 200 + 1_000)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 30_000)

  it.live("the retry bound is on the monotonic clock: a step back of the wall clock does not stretch it", () =>
    Effect.gen(function*() {
      // An hour back: on the wall clock the bound would be an hour away.
      const { elapsed, error, stream } = yield* openWithWallStep(-3_600_000)
      assert.include(error.message, `consumer info ${stream.stream}/${stream.consumer}: timeout (after `)
      assert.isBelow(elapsed, 1_500 + 2_000 + 200 + 1_000)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 30_000)

  it.live("the retry bound is on the monotonic clock: a step forward of the wall clock does not cut it", () =>
    Effect.gen(function*() {
      // An hour ahead: on the wall clock the bound would be past at the next failure.
      const { elapsed, error, retries } = yield* openWithWallStep(3_600_000)
      assert.include(error.message, "timeout (after ")
      assert.isAbove(retries.length, 1, retries.join("\n"))
      assert.isAtLeast(elapsed, 1_000)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 30_000)

  it.live("a request lost as the link drops and comes back is retried at the reconnect, not at its API timeout", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make({ maxDeliver: 10 })
      const { connection } = yield* NatsConnection.NatsConnection
      const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: Number(new URL(natsUrl).port || 4222) } })
      // A long API timeout: waited for, the lost request would hold open for 10 s.
      const viaProxy = yield* Layer.build(NatsConnection.layer({ servers: `nats://127.0.0.1:${proxy.port}`, apiTimeout: "10 seconds" }))
      const proxied = Context.get(viaProxy, NatsConnection.NatsConnection).connection
      const reconnectedAt = yield* Deferred.make<number>()
      yield* Stream.fromAsyncIterable(proxied.status(), (error) => error).pipe(
        Stream.filter((status) => status.type === "reconnect"),
        Stream.runForEach(() => Deferred.succeed(reconnectedAt, performance.now())),
        Effect.ignore,
        Effect.forkScoped
      )
      const logged = captureLogs()
      // The consumer info reaches the server, its reply waits in the proxy; once the server has
      // the request, the link is reset (the reply lost with it) and new connections let through.
      const cutAt = yield* Deferred.make<number>()
      const tap = connection.subscribe(`$JS.API.CONSUMER.INFO.${stream.stream}.${stream.consumer}`, {
        max: 1,
        callback: () => {
          Effect.runSync(proxy.cut.pipe(
            Effect.andThen(proxy.resume),
            Effect.andThen(proxy.restore),
            Effect.andThen(Deferred.succeed(cutAt, performance.now()))
          ))
        }
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => tap.unsubscribe()))
      yield* Effect.promise(() => connection.flush())
      yield* proxy.pauseToClient
      const intake = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer })
        .open({ consumer: stream.consumer, prefetch: 4, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.provide(viaProxy), Effect.provide(logged.layer), Effect.timeout("25 seconds"))
      const openedAt = performance.now()
      const cut = yield* Eventually.deferred("the link cut", cutAt, "1 second")
      const reconnected = yield* Eventually.deferred("the reconnect", reconnectedAt, "1 second")
      // Open ends soon after the link is back (the retry is at once), well before the 10 s timeout.
      assert.isBelow(openedAt - reconnected, 2_000, `cut at ${cut}, reconnected at ${reconnected}, opened at ${openedAt}\n${logged.lines.join("\n")}`)
      const retries = logged.lines.filter(retryLine)
      assert.isAbove(retries.length, 0, logged.lines.join("\n"))
      assert.include(retries[0], `JetStreamSource ${stream.stream}/${stream.consumer}: consumer info`)
      assert.include(retries[0], "reconnected")
      const seq = yield* stream.publish("a", "after the blip", "blip-3")
      const delivery = yield* intake.take.pipe(Effect.timeout("10 seconds"))
      assert.strictEqual(delivery.sequence, seq)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 60_000)

  it.live("an openRetryTimeout that cannot work fails open before any request", () =>
    Effect.gen(function*() {
      const error = yield* JetStreamSource.make({ stream: "ANY", consumer: "any", openRetryTimeout: "-1 second" })
        .open({ consumer: "any", prefetch: 1, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.scoped, Effect.flip)
      assert.strictEqual(error.reason, "ContractMismatch")
      assert.include(error.message, "openRetryTimeout must be a duration from 0 to 2147483647 ms")
    }).pipe(Effect.provide(NatsLive)), 30_000)

  it.live("a missing consumer still fails at once, with the step that declares it", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make()
      const logged = captureLogs()
      const started = Date.now()
      const error = yield* JetStreamSource.make({ stream: stream.stream, consumer: "nobody" })
        .open({ consumer: "nobody", prefetch: 1, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.scoped, Effect.provide(logged.layer), Effect.flip, Effect.timeout("10 seconds"))
      const elapsed = Date.now() - started
      assert.strictEqual(error.reason, "ConsumerNotFound")
      assert.include(error.message, `stream ${stream.stream} has no durable consumer nobody`)
      assert.deepStrictEqual(logged.lines.filter(retryLine), [])
      assert.isBelow(elapsed, 2_000)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 30_000)

  it.live("a connection closed for good is not retried: open fails at once", () =>
    Effect.gen(function*() {
      const stream = yield* TestStream.make()
      // A connection whose scope has closed: drained and closed, for good.
      const scope = yield* Scope.make()
      const closed = yield* Layer.buildWithScope(NatsConnection.layer({ servers: natsUrl }), scope)
      yield* Scope.close(scope, Exit.void)
      assert.isTrue(Context.get(closed, NatsConnection.NatsConnection).connection.isClosed())
      const logged = captureLogs()
      const started = Date.now()
      const error = yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer })
        .open({ consumer: stream.consumer, prefetch: 1, attempts: 3, ordering: "Unordered" })
        .pipe(Effect.scoped, Effect.provide(closed), Effect.provide(logged.layer), Effect.flip, Effect.timeout("10 seconds"))
      const elapsed = Date.now() - started
      assert.strictEqual(error.reason, "ConnectionClosed")
      assert.deepStrictEqual(logged.lines.filter(retryLine), [])
      assert.isBelow(elapsed, 2_000)
    }).pipe(Effect.provide(NatsLive), Effect.scoped), 30_000)
})

/**
 * A source's health reports (`OpenOptions.onHealth`) on the readiness probe: a stalled intake
 * makes its consumer's component down with the source's reason, a healthy one up again; a stall
 * reported while opening shows once the consumer has started; a report once the consumer is
 * stopping changes nothing.
 */
import { assert, describe, it } from "@effect/vitest"
import { Consumer, Envelope, Lifecycle, type Source } from "@jetworker/core"
import { Deferred, Duration, Effect, Fiber, Result, Schema } from "effect"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const stallReason = "intake stalled: the consumer S/c has not answered a pull for 2600 ms"

/**
 * A source whose intake never delivers: it keeps the engine's `onHealth`, says when the engine
 * first takes (the consumer has started), and closes once `closable` is done.
 */
const fakeSource = (options: { readonly stallWhileOpening?: boolean } = {}) =>
  Effect.gen(function*() {
    const taking = yield* Deferred.make<void>()
    const closing = yield* Deferred.make<void>()
    const closable = yield* Deferred.make<void>()
    // A test that fails early still lets its consumer stop.
    yield* Effect.addFinalizer(() => Deferred.succeed(closable, undefined))
    const reports: { onHealth: Source.OpenOptions["onHealth"] } = { onHealth: undefined }
    const source: Source.Source = {
      name: "S/c",
      open: (open) =>
        Effect.gen(function*() {
          reports.onHealth = open.onHealth
          if (options.stallWhileOpening === true && open.onHealth !== undefined) {
            yield* open.onHealth({ _tag: "Stalled", reason: stallReason })
          }
          return {
            lease: Duration.seconds(30),
            maxDeliver: undefined,
            take: Effect.andThen(Deferred.succeed(taking, undefined), Effect.never),
            close: Effect.andThen(Deferred.succeed(closing, undefined), Deferred.await(closable))
          } satisfies Source.Intake
        })
    }
    const report = (health: Source.Health) =>
      Effect.suspend(() => {
        assert.isDefined(reports.onHealth, "the engine gives the source an onHealth callback")
        return reports.onHealth!(health)
      })
    return { source, report, taking, closing, closable }
  })

/** A managed lifecycle whose start-up is over, and a consumer of `source` on it. */
const started = (source: Source.Source) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.makeManaged({ budget: Result.getOrThrow(Lifecycle.makeBudget()), startupTimeout: "10 seconds" })
    yield* lifecycle.started
    const consumer = Consumer.make({ name: "c", source, schema: Event, handle: () => Effect.void, classify: {}, concurrency: 1, prefetch: 1 })
    const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle)))
    const component = () => lifecycle.readiness().components.find((c) => c.name === "c")
    return { lifecycle, fiber, component }
  })

const bounded = <A, E>(what: string, effect: Effect.Effect<A, E>) =>
  effect.pipe(Effect.timeoutOrElse({ duration: "5 seconds", orElse: () => Effect.die(new Error(`${what}: not within 5 s`)) }))

describe("a source's health on the readiness probe", () => {
  it.live("a stalled intake makes its consumer down with the source's reason, and up again once healthy", () =>
    Effect.gen(function*() {
      const fake = yield* fakeSource()
      const { component, fiber, lifecycle } = yield* started(fake.source)
      yield* bounded("the consumer takes", Deferred.await(fake.taking))
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: true, reason: undefined })
      assert.isTrue(lifecycle.readiness().ready)

      yield* fake.report({ _tag: "Stalled", reason: stallReason })
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: false, reason: stallReason })
      assert.isFalse(lifecycle.readiness().ready)

      yield* fake.report({ _tag: "Healthy" })
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: true, reason: undefined })
      assert.isTrue(lifecycle.readiness().ready)

      yield* Deferred.succeed(fake.closable, undefined)
      yield* bounded("the consumer stops", Fiber.interrupt(fiber))
    }).pipe(Effect.scoped), 20_000)

  it.live("a stall reported while the source opens shows once the consumer has started", () =>
    Effect.gen(function*() {
      const fake = yield* fakeSource({ stallWhileOpening: true })
      const { component, fiber, lifecycle } = yield* started(fake.source)
      yield* bounded("the consumer takes", Deferred.await(fake.taking))
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: false, reason: stallReason })
      assert.isFalse(lifecycle.readiness().ready)
      yield* fake.report({ _tag: "Healthy" })
      assert.isTrue(lifecycle.readiness().ready)
      yield* Deferred.succeed(fake.closable, undefined)
      yield* bounded("the consumer stops", Fiber.interrupt(fiber))
    }).pipe(Effect.scoped), 20_000)

  it.live("a healthy report once the consumer is stopping does not make it up again", () =>
    Effect.gen(function*() {
      const fake = yield* fakeSource()
      const { component, fiber, lifecycle } = yield* started(fake.source)
      yield* bounded("the consumer takes", Deferred.await(fake.taking))
      yield* fake.report({ _tag: "Stalled", reason: stallReason })
      yield* lifecycle.begin
      const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
      // The engine is closing its intake: it has marked the consumer down.
      yield* bounded("the intake closes", Deferred.await(fake.closing))
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: false, reason: "stopping" })
      yield* fake.report({ _tag: "Healthy" })
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: false, reason: "stopping" })
      yield* fake.report({ _tag: "Stalled", reason: stallReason })
      assert.deepStrictEqual(component(), { name: "c", kind: "consumer", up: false, reason: "stopping" })
      yield* Deferred.succeed(fake.closable, undefined)
      yield* bounded("the consumer stops", Fiber.join(stopping))
    }).pipe(Effect.scoped), 20_000)
})

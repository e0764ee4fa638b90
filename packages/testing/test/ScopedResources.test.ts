/**
 * The harness's scoped resources leave nothing behind when their scope closes: TestStream its
 * streams, TestDatabase its schema, FaultProxy its port. Found sound by a review (kept as they
 * are cheap): nothing here failed before.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { JetStreamSource, NatsConnection } from "@jetworker/nats"
import { Effect, Exit, Redacted, Scope } from "effect"
import * as Net from "node:net"
import { Eventually, FaultProxy, TestDatabase, TestStream } from "../src/index.ts"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222", name: "testing-scoped-resources" })

/** A free loopback port (held, then released). */
const freePort = Effect.callback<number>((resume) => {
  const server = Net.createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as Net.AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** Whether something listens on 127.0.0.1:`port`. */
const listening = (port: number) =>
  Effect.callback<boolean>((resume) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed(true))
    })
    socket.once("error", () => resume(Effect.succeed(false)))
  })

/** The names of the streams starting with `prefix`, sorted. */
const streamsStartingWith = (prefix: string) =>
  Effect.gen(function*() {
    const { manager } = yield* NatsConnection.NatsConnection
    return yield* Effect.promise(async () => {
      const names: Array<string> = []
      for await (const name of manager.streams.names()) if (name.startsWith(prefix)) names.push(name)
      return names.sort()
    })
  })

describe("scoped resources clean up and release", () => {
  layer(NatsLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("sound: TestStream deletes its stream, its dead-letter stream and its MaxDeliver capture stream", () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const stream = yield* TestStream.make({ maxDeliver: 3 }).pipe(Scope.provide(scope))
        // The source opening it creates the dead-letter and MaxDeliver capture streams.
        yield* JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }).open({
          consumer: stream.consumer,
          prefetch: 1,
          attempts: 2,
          ordering: "Unordered"
        }).pipe(Scope.provide(scope))
        assert.strictEqual((yield* streamsStartingWith(stream.stream)).length, 3)
        yield* Scope.close(scope, Exit.void)
        assert.deepStrictEqual(yield* streamsStartingWith(stream.stream), [])
      }))

    it.effect("sound: TestStream with an ackWait that is not a duration fails typed and leaves no stream", () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const exit = yield* TestStream.make({ ackWait: "banana" as never, prefix: "SCOPEDBAD" }).pipe(Scope.provide(scope), Effect.exit)
        yield* Scope.close(scope, Exit.void)
        assert.isTrue(Exit.isFailure(exit))
        const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
        assert.strictEqual(reason?._tag, "Fail", `a typed failure, not a defect: ${String(exit)}`)
        assert.include(String((reason as { error?: { message?: string } } | undefined)?.error?.message), "banana")
        assert.deepStrictEqual(yield* streamsStartingWith("SCOPEDBAD_"), [])
      }))
  })

  it.live("sound: TestDatabase drops its schema when the scope closes", () =>
    Effect.gen(function*() {
      const name = yield* Effect.gen(function*() {
        const { name } = yield* TestDatabase.TestSchema
        const sql = yield* PgClient.PgClient
        yield* sql.unsafe("CREATE TABLE t (id int)")
        yield* sql.unsafe("INSERT INTO t VALUES (1)")
        return name
      }).pipe(Effect.provide(TestDatabase.layer()))
      const rows = yield* Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        return yield* sql.unsafe<{ n: number }>(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = '${name}'`)
      }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(TestDatabase.defaultUrl()), maxConnections: 1 })))
      assert.match(name, /^jw_[0-9a-f]{12}$/)
      assert.deepStrictEqual(rows.map((r) => r.n), [0])
    }))

  it.live("sound: FaultProxy releases its fixed port when its scope closes, even with connections open and while cut", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      for (const cutFirst of [false, true]) {
        yield* Effect.scoped(Effect.gen(function*() {
          const proxy = yield* FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 }, listenPort: port })
          const socket = Net.connect({ host: "127.0.0.1", port })
          socket.on("error", () => {})
          yield* Eventually.holds("a connection through the proxy", proxy.connections.pipe(Effect.map((n) => n === 1)), "5 seconds")
          if (cutFirst) yield* proxy.cut
        }))
        assert.isFalse(yield* listening(port), "nothing listens on the proxy's port after its scope")
      }
      // The same fixed port can be taken again at once.
      yield* Effect.scoped(FaultProxy.make({ target: { host: "127.0.0.1", port: 4222 }, listenPort: port }))
    }))
})

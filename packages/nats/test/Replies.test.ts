import { assert, describe, it } from "@effect/vitest"
import { connect } from "@nats-io/transport-node"
import { Deferred, Effect, Fiber } from "effect"
import { vi } from "vitest"
import * as Replies from "../src/internal/replies.ts"

// The confirmed requests behind every ack, nak, term and extension, against the real server.
const servers = process.env.NATS_URL ?? "nats://127.0.0.1:4222"
const encoder = new TextEncoder()
const decoder = new TextDecoder()
const subject = () => `replies.test.${Math.random().toString(36).slice(2)}`

type Connection = Awaited<ReturnType<typeof connect>>

/** A subject on which `connection` answers every request with its payload. */
const echoOn = (connection: Connection): string => {
  const echo = subject()
  connection.subscribe(echo, { callback: (_, msg) => {
    msg.respond(msg.data)
  } })
  return echo
}

/** A subject on which `connection` takes every request and never answers. */
const silentOn = (connection: Connection): string => {
  const silent = subject()
  connection.subscribe(silent, { callback: () => undefined })
  return silent
}

/** Counts what nats.js hands the socket of `connection` from now on: one `send` per write. */
const countWrites = (connection: Connection): (() => number) => {
  const transport = Reflect.get(Reflect.get(connection, "protocol") as object, "transport") as {
    send: (frame: Uint8Array) => void
  }
  const send = transport.send.bind(transport)
  let writes = 0
  transport.send = (frame) => {
    writes++
    send(frame)
  }
  return () => writes
}

const withConnection = <A, E>(f: (connection: Connection) => Effect.Effect<A, E>) =>
  Effect.acquireUseRelease(
    Effect.promise(() => connect({ servers, noAsyncTraces: true })),
    f,
    (connection) => Effect.promise(() => connection.close().catch(() => undefined))
  )

/**
 * `f` with the replies of a connection, an echo subject answered from a connection of its own (so
 * that only the requests write on the first), and the count of the first connection's writes from
 * after a first request (which also opens the reply subscription: a write of its own).
 */
const withCountedWrites = <A, E>(
  f: (setup: { readonly echo: string; readonly replies: Replies.Replies; readonly writes: () => number }) => Effect.Effect<A, E>
) =>
  withConnection((connection) =>
    withConnection((responder) =>
      Effect.gen(function*() {
        const echo = echoOn(responder)
        yield* Effect.promise(() => responder.flush())
        const replies = Replies.make(connection)
        yield* replies.request("echo", echo, encoder.encode("first"), 5000)
        return yield* f({ echo, replies, writes: countWrites(connection) })
      })
    )
  )

describe("Replies (confirmed requests)", () => {
  it.live("a reply confirms: each request gets its own reply, also when many are in flight", () =>
    withConnection((connection) =>
      Effect.gen(function*() {
        const echo = echoOn(connection)
        yield* Effect.promise(() => connection.flush())
        const replies = Replies.make(connection)
        const answers = yield* Effect.forEach(
          Array.from({ length: 200 }, (_, i) => i),
          (i) => Effect.map(replies.request("echo", echo, encoder.encode(`${i}`), 5000), (msg) => decoder.decode(msg.data)),
          { concurrency: "unbounded" }
        )
        assert.deepStrictEqual(answers, Array.from({ length: 200 }, (_, i) => `${i}`))
      })))

  it.live("no responders is NoResponders; no reply within the bound is a Timeout, and later requests still work", () =>
    withConnection((connection) =>
      Effect.gen(function*() {
        const replies = Replies.make(connection)
        const nobody = yield* Effect.flip(replies.request("ack", subject(), encoder.encode("+ACK"), 2000))
        assert.strictEqual(nobody.reason, "NoResponders")
        assert.strictEqual(nobody.operation, "ack")
        const silent = silentOn(connection)
        const echo = echoOn(connection)
        yield* Effect.promise(() => connection.flush())
        const started = Date.now()
        const timeout = yield* Effect.flip(replies.request("ack", silent, encoder.encode("+ACK"), 300))
        const waited = Date.now() - started
        assert.strictEqual(timeout.reason, "Timeout")
        assert.isAtLeast(waited, 290)
        assert.isBelow(waited, 3000)
        const after = yield* replies.request("echo", echo, encoder.encode("again"), 2000)
        assert.strictEqual(decoder.decode(after.data), "again")
      })))

  it.live("the bound is measured on a monotonic clock: the wall clock stepping back does not stretch it", () =>
    withConnection((connection) =>
      Effect.gen(function*() {
        const replies = Replies.make(connection)
        const silent = silentOn(connection)
        yield* Effect.promise(() => connection.flush())
        const started = performance.now()
        const waiting = yield* Effect.forkChild(Effect.flip(replies.request("ack", silent, encoder.encode("+ACK"), 500)), { startImmediately: true })
        // An NTP step or a resumed VM: the wall clock goes back 30 s while the ack waits.
        const wall = Date.now
        const stepped = vi.spyOn(Date, "now").mockImplementation(() => wall() - 30_000)
        const timeout = yield* Fiber.join(waiting).pipe(Effect.ensuring(Effect.sync(() => stepped.mockRestore())))
        const waited = performance.now() - started
        assert.strictEqual(timeout.reason, "Timeout")
        assert.isAtLeast(waited, 490)
        assert.isBelow(waited, 3000, "the bound followed the wall clock back")
      })))

  it.live("send: the callback form gets each reply or error once; a withdrawn request never calls back", () =>
    withConnection((connection) =>
      Effect.gen(function*() {
        const echo = echoOn(connection)
        const silent = silentOn(connection)
        yield* Effect.promise(() => connection.flush())
        const replies = Replies.make(connection)
        const answers = new Map<number, Array<string>>()
        // Every request but the withdrawn one answers: 100 echoes, no responders, a timeout, a last echo.
        const all = Deferred.makeUnsafe<void>()
        const calledBack = (i: number) => (result: unknown) => {
          const seen = answers.get(i) ?? []
          seen.push(result instanceof Error ? `error ${(result as { readonly reason?: string }).reason}` : decoder.decode((result as { readonly data: Uint8Array }).data))
          answers.set(i, seen)
          if (answers.size === 103) Deferred.doneUnsafe(all, Effect.void)
        }
        for (let i = 0; i < 100; i++) replies.send("echo", echo, encoder.encode(`${i}`), 5000, calledBack(i))
        replies.send("ack", subject(), encoder.encode("+ACK"), 5000, calledBack(100))
        const withdraw = replies.send("echo", echo, encoder.encode("withdrawn"), 5000, calledBack(101))
        withdraw()
        replies.send("ack", silent, encoder.encode("+ACK"), 200, calledBack(102))
        // Echoed after the withdrawn one: once it is back, the withdrawn reply has arrived and been dropped.
        replies.send("echo", echo, encoder.encode("last"), 5000, calledBack(103))
        yield* Deferred.await(all).pipe(Effect.timeout("5 seconds"))
        for (let i = 0; i < 100; i++) assert.deepStrictEqual(answers.get(i), [`${i}`])
        assert.deepStrictEqual(answers.get(100), ["error NoResponders"])
        assert.isUndefined(answers.get(101), "a withdrawn request never calls back")
        assert.deepStrictEqual(answers.get(103), ["last"])
        assert.deepStrictEqual(answers.get(102), ["error Timeout"])
      })))

  it.live("requests sent from separate macrotasks of one turn of the event loop leave in one write", () =>
    withCountedWrites(({ echo, replies, writes }) =>
      Effect.gen(function*() {
        const answered = Deferred.makeUnsafe<ReadonlyArray<string>>()
        const answers: Array<string> = []
        const done = (result: unknown) => {
          answers.push(result instanceof Error ? `error ${result.message}` : decoder.decode((result as { readonly data: Uint8Array }).data))
          if (answers.length === 3) Deferred.doneUnsafe(answered, Effect.succeed(answers))
        }
        // Immediates queued in one tick run in one check phase, each its own macrotask (nats.js alone
        // would write after each), and one queued while they run waits for the next turn. Timers
        // were not deterministic: under load the loop that made them crossed a millisecond, and the
        // later one fired a turn after the first had been written.
        for (const text of ["a", "b", "c"]) setImmediate(() => replies.send("echo", echo, encoder.encode(text), 5000, done))
        const received = yield* Deferred.await(answered).pipe(Effect.timeout("5 seconds"))
        assert.deepStrictEqual(received, ["a", "b", "c"])
        assert.strictEqual(writes(), 1)
      })))

  it.live("on nats.js's own connection, the 8th request queued in one run of code is written before that run ends", () =>
    withCountedWrites(({ echo, replies, writes }) =>
        Effect.gen(function*() {
          const answered = Deferred.makeUnsafe<number>()
          let answers = 0
          const done = () => {
            if (++answers === 9) Deferred.doneUnsafe(answered, Effect.succeed(answers))
          }
          const counted: Array<number> = []
          for (let i = 0; i < 9; i++) {
            replies.send("echo", echo, encoder.encode(`m${i}`), 5000, done)
            counted.push(writes())
          }
          // Nothing leaves for the first 7; the 8th writes all 8 at once (the server can work on
          // them while this code goes on); the 9th waits for the end of the poll phase.
          assert.deepStrictEqual(counted, [0, 0, 0, 0, 0, 0, 0, 1, 1])
          assert.strictEqual(yield* Deferred.await(answered).pipe(Effect.timeout("5 seconds")), 9)
          assert.strictEqual(writes(), 2, "the 9th in a write of its own, at the end of the poll phase")
        })))

  it.live("closing the connection fails what is pending with ConnectionClosed; an interrupted request drops its reply", () =>
    withConnection((connection) =>
      Effect.gen(function*() {
        const replies = Replies.make(connection)
        const silent = silentOn(connection)
        yield* Effect.promise(() => connection.flush())
        const interrupted = yield* Effect.forkChild(replies.request("nak", silent, encoder.encode("-NAK"), 60_000))
        yield* Fiber.interrupt(interrupted)
        const pending = yield* Effect.forkChild(replies.request("term", silent, encoder.encode("+TERM"), 60_000))
        yield* Effect.promise(() => connection.close())
        const error = yield* Effect.flip(Fiber.join(pending)).pipe(Effect.timeout("5 seconds"))
        assert.strictEqual(error.reason, "ConnectionClosed")
        assert.strictEqual(error.operation, "term")
        const closed = yield* Effect.flip(replies.request("ack", silent, encoder.encode("+ACK"), 1000))
        assert.strictEqual(closed.reason, "ConnectionClosed")
      })))
})

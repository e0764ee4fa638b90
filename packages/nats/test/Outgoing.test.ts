import { assert, describe, it } from "@effect/vitest"
import type { NatsConnection } from "@nats-io/transport-node"
import { Effect } from "effect"
import * as Outgoing from "../src/internal/outgoing.ts"

// The queue's own logic, over a connection double that records what it is asked to publish, and
// what nats.js would have written when asked to write at once (`protocol.flushPending`); what the
// server sees of it is tested in Replies.test.ts.
const recording = (refuse: (subject: string) => boolean = () => false) => {
  const published: Array<string> = []
  const written: Array<Array<string>> = []
  let buffered: Array<string> = []
  const connection = {
    publish: (subject: string, _payload: Uint8Array, options: { readonly reply: string }) => {
      if (refuse(subject)) throw new Error(`refused ${subject}`)
      published.push(`${subject} ${options.reply}`)
      buffered.push(subject)
    },
    protocol: {
      flushPending() {
        // Called as a method, as nats.js does: `this` must be the protocol.
        assert.strictEqual(this, connection.protocol)
        if (buffered.length > 0) written.push(buffered)
        buffered = []
      }
    }
  }
  return { connection: connection as unknown as NatsConnection, published, written }
}

const nextTurn = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
const payload = new Uint8Array()
const unexpected = (error: unknown) => assert.fail(`unexpected failure: ${String(error)}`)

describe("Outgoing (publishes held until the end of the poll phase, or until a few wait)", () => {
  it.effect("nothing leaves before the poll phase is over; then everything, in the order queued", () =>
    Effect.gen(function*() {
      const { connection, published } = recording()
      const outgoing = Outgoing.make(connection)
      outgoing.publish("a", payload, "r1", unexpected)
      outgoing.publish("b", payload, "r2", unexpected)
      yield* Effect.promise(() => Promise.resolve()) // a microtask later: still held
      outgoing.publish("c", payload, "r3", unexpected)
      assert.deepStrictEqual(published, [])
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3"])
      outgoing.publish("d", payload, "r4", unexpected)
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3", "d r4"])
    }))

  it.effect("once `eager` publishes wait, they are published and written at once; the rest wait for the poll phase's end", () =>
    Effect.gen(function*() {
      const { connection, published, written } = recording()
      const outgoing = Outgoing.make(connection, 3)
      outgoing.publish("a", payload, "r1", unexpected)
      outgoing.publish("b", payload, "r2", unexpected)
      assert.deepStrictEqual(published, [])
      outgoing.publish("c", payload, "r3", unexpected)
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3"])
      assert.deepStrictEqual(written, [["a", "b", "c"]], "written now, not in nats.js's microtask after the socket read")
      outgoing.publish("d", payload, "r4", unexpected)
      assert.strictEqual(published.length, 3)
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3", "d r4"])
      assert.deepStrictEqual(written, [["a", "b", "c"]], "at the poll phase's end nats.js writes, in its microtask")
    }))

  it.effect("the default sends 8 at a time", () =>
    Effect.gen(function*() {
      const { connection, published, written } = recording()
      const outgoing = Outgoing.make(connection)
      for (let i = 0; i < 7; i++) outgoing.publish(`s${i}`, payload, `r${i}`, unexpected)
      assert.deepStrictEqual(published, [])
      outgoing.publish("s7", payload, "r7", unexpected)
      assert.strictEqual(Outgoing.defaultEager, 8)
      assert.strictEqual(published.length, 8)
      assert.strictEqual(written.length, 1)
      yield* nextTurn
    }))

  it.effect("`together` holds its publishes past `eager` and writes them at once as it returns", () =>
    Effect.gen(function*() {
      const { connection, published, written } = recording()
      const outgoing = Outgoing.make(connection, 2)
      const result = outgoing.together(() => {
        for (const subject of ["a", "b", "c", "d"]) outgoing.publish(subject, payload, "r", unexpected)
        // Nested: the outer one decides.
        outgoing.together(() => outgoing.publish("e", payload, "r", unexpected))
        assert.deepStrictEqual(published, [], "nothing leaves inside `together`")
        return "returned"
      })
      assert.strictEqual(result, "returned")
      assert.deepStrictEqual(written, [["a", "b", "c", "d", "e"]], "one write")
      // Fewer than `eager`: they wait for the poll phase's end, like any publish.
      outgoing.together(() => outgoing.publish("f", payload, "r", unexpected))
      assert.strictEqual(published.length, 5)
      yield* nextTurn
      assert.strictEqual(published.length, 6)
    }))

  it.effect("`together` sends what waits even when its function throws", () =>
    Effect.gen(function*() {
      const { connection, written } = recording()
      const outgoing = Outgoing.make(connection, 2)
      assert.throws(() =>
        outgoing.together(() => {
          outgoing.publish("a", payload, "r", unexpected)
          outgoing.publish("b", payload, "r", unexpected)
          throw new Error("boom")
        })
      )
      assert.deepStrictEqual(written, [["a", "b"]])
      // Not left holding: the next publishes leave two at a time again.
      outgoing.publish("c", payload, "r", unexpected)
      outgoing.publish("d", payload, "r", unexpected)
      assert.deepStrictEqual(written, [["a", "b"], ["c", "d"]])
    }))

  it.effect("without nats.js's write (another nats.js), publishes still leave at `eager`, written in its microtask", () =>
    Effect.gen(function*() {
      const published: Array<string> = []
      const connection = { publish: (subject: string) => published.push(subject) } as unknown as NatsConnection
      const outgoing = Outgoing.make(connection, 2)
      outgoing.publish("a", payload, "r", unexpected)
      outgoing.publish("b", payload, "r", unexpected)
      assert.deepStrictEqual(published, ["a", "b"])
      yield* nextTurn
    }))

  it.effect("flush sends what waits at once, and the poll phase's end then finds nothing left", () =>
    Effect.gen(function*() {
      const { connection, published } = recording()
      const outgoing = Outgoing.make(connection)
      outgoing.publish("a", payload, "r1", unexpected)
      outgoing.publish("b", payload, "r2", unexpected)
      outgoing.flush()
      assert.deepStrictEqual(published, ["a r1", "b r2"])
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "b r2"])
    }))

  it.effect("a refused publish calls its own `failed`, once; the others still leave", () =>
    Effect.gen(function*() {
      const { connection, published } = recording((subject) => subject === "b")
      const outgoing = Outgoing.make(connection)
      const failures: Array<string> = []
      outgoing.publish("a", payload, "r1", unexpected)
      outgoing.publish("b", payload, "r2", (error) => failures.push(String(error)))
      outgoing.publish("c", payload, "r3", unexpected)
      assert.deepStrictEqual(failures, [], "below the limit, a failure is reported when the queue is sent, not from inside `publish`")
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "c r3"])
      assert.deepStrictEqual(failures, ["Error: refused b"])
    }))
})

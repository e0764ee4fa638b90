import { assert, describe, it } from "@effect/vitest"
import type { NatsConnection } from "@nats-io/transport-node"
import { Effect } from "effect"
import * as Outgoing from "../src/internal/outgoing.ts"

// The queue's own logic, over a connection double that records what it is asked to publish (what
// the server sees of it is tested in Replies.test.ts).
const recording = (refuse: (subject: string) => boolean = () => false) => {
  const published: Array<string> = []
  const connection = {
    publish: (subject: string, _payload: Uint8Array, options: { readonly reply: string }) => {
      if (refuse(subject)) throw new Error(`refused ${subject}`)
      published.push(`${subject} ${options.reply}`)
    }
  } as unknown as NatsConnection
  return { connection, published }
}

const nextTurn = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
const payload = new Uint8Array()
const unexpected = (error: unknown) => assert.fail(`unexpected failure: ${String(error)}`)

describe("Outgoing (publishes held until the end of the poll phase)", () => {
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

  it.effect("at its limit the queue sends what it holds at once", () =>
    Effect.gen(function*() {
      const { connection, published } = recording()
      const outgoing = Outgoing.make(connection, 3)
      outgoing.publish("a", payload, "r1", unexpected)
      outgoing.publish("b", payload, "r2", unexpected)
      assert.deepStrictEqual(published, [])
      outgoing.publish("c", payload, "r3", unexpected)
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3"])
      outgoing.publish("d", payload, "r4", unexpected)
      assert.strictEqual(published.length, 3)
      yield* nextTurn
      assert.deepStrictEqual(published, ["a r1", "b r2", "c r3", "d r4"])
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

/**
 * A confirmed request (an ack, nak, term or lease extension) whose publish the server refuses for
 * lack of permission. The server answers a refused publish only on the connection, with
 * `-ERR 'Permissions Violation for Publish to "<subject>"'`; nats.js reports it as the
 * connection's `error` status. Before, the request waited out its whole bound and failed as a
 * `Timeout` ("no reply within ... ms"), which says nothing of the permission (and is retried as
 * if the link were slow). Now the requests pending on that subject fail at once with
 * `NotAuthorized`, in the server's words (the subject named); the others wait as before. The same
 * for the reply subscription refused (no permission to subscribe to `_INBOX.>`): what is pending
 * fails with `NotAuthorized`.
 *
 * Against a private nats-server whose user may publish only on `allowed.>` (and may not subscribe
 * to `_INBOX.>`, for the second user). Then what the source's failure says once such a refusal
 * ends its intake (the whole consumer's path: test/nats-permissions.test.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsServer } from "@jetworker/testing"
import { connect } from "@nats-io/transport-node"
import { Deferred, Effect } from "effect"
import * as NatsError from "../src/NatsError.ts"
import * as Replies from "../src/internal/replies.ts"
import { refusedSettling } from "../src/internal/sourceErrors.ts"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

const config = [
  "authorization {",
  "  users: [",
  "    { user: admin, password: admin }",
  "    { user: limited, password: limited, permissions: { publish: { allow: [\"allowed.>\"] }, subscribe: { allow: [\"_INBOX.>\"] } } }",
  "    { user: noinbox, password: noinbox, permissions: { publish: { allow: [\"allowed.>\"] }, subscribe: { allow: [\"other.>\"] } } }",
  "  ]",
  "}"
].join("\n")

/** A connection to `url` as `user` (password = user), closed with the scope. */
const as = (url: string, user: string) =>
  Effect.acquireRelease(
    Effect.promise(() => connect({ servers: url, user, pass: user, noAsyncTraces: true })),
    (connection) => Effect.promise(() => connection.close().catch(() => undefined))
  )

/** The bound every request here gets: a refusal must come long before it. */
const boundMillis = 20_000

describe("Replies: a request the server refuses for lack of permission", () => {
  it.live("fails at once with NotAuthorized naming the subject; the requests on other subjects are not touched", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config })
      const admin = yield* as(server.url, "admin")
      // Answers on allowed.echo; allowed.silent takes requests and never answers.
      admin.subscribe("allowed.echo", { callback: (_, msg) => void msg.respond(msg.data) })
      admin.subscribe("allowed.silent", { callback: () => undefined })
      yield* Effect.promise(() => admin.flush())
      const limited = yield* as(server.url, "limited")
      const replies = Replies.make(limited)

      const denied = "$JS.ACK.ORDERS.shipping.1.6.6.1700000000000000000.0"
      const started = performance.now()
      // Two requests on the refused subject (an extension, then the ack), one elsewhere left waiting.
      const silentResult = Deferred.makeUnsafe<unknown>()
      const withdrawSilent = replies.send("Extend ORDERS#1", "allowed.silent", encoder.encode("+WPI"), boundMillis, (result) => {
        Deferred.doneUnsafe(silentResult, Effect.succeed(result))
      })
      const sent = Deferred.makeUnsafe<NatsError.NatsError | string>()
      replies.send("Extend ORDERS#6", denied, encoder.encode("+WPI"), boundMillis, (result) => {
        Deferred.doneUnsafe(sent, Effect.succeed(result instanceof NatsError.NatsError ? result : decoder.decode(result.data)))
      })
      const acked = yield* Effect.flip(replies.request("Ack ORDERS#6", denied, encoder.encode("+ACK"), boundMillis)).pipe(
        Effect.timeout("5 seconds")
      )
      const extended = yield* Deferred.await(sent).pipe(Effect.timeout("5 seconds"))
      const elapsed = performance.now() - started

      assert.strictEqual(acked.reason, "NotAuthorized")
      assert.strictEqual(acked.operation, "Ack ORDERS#6")
      assert.strictEqual(acked.message, `Permissions Violation for Publish to "${denied}"`)
      assert.isFalse(acked.isRetryable)
      assert.instanceOf(extended, NatsError.NatsError)
      assert.strictEqual((extended as NatsError.NatsError).reason, "NotAuthorized")
      assert.strictEqual((extended as NatsError.NatsError).operation, "Extend ORDERS#6")
      assert.isBelow(elapsed, 5_000, "refused at once, not after the bound")

      // The request on the allowed subject still waits; the connection still works.
      assert.isFalse(Deferred.isDoneUnsafe(silentResult), "the silent request is not settled by another subject's refusal")
      withdrawSilent()
      const echoed = yield* replies.request("echo", "allowed.echo", encoder.encode("hi"), boundMillis)
      assert.strictEqual(decoder.decode(echoed.data), "hi")
      // And a later request on the refused subject is refused again.
      const again = yield* Effect.flip(replies.request("Ack ORDERS#6", denied, encoder.encode("+ACK"), boundMillis)).pipe(Effect.timeout("5 seconds"))
      assert.strictEqual(again.reason, "NotAuthorized")
    }).pipe(Effect.scoped), 60_000)

  it.live("without permission to subscribe to the reply inbox, what is pending fails with NotAuthorized naming it", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config })
      const admin = yield* as(server.url, "admin")
      admin.subscribe("allowed.echo", { callback: (_, msg) => void msg.respond(msg.data) })
      yield* Effect.promise(() => admin.flush())
      const noInbox = yield* as(server.url, "noinbox")
      const replies = Replies.make(noInbox)
      const refused = yield* Effect.flip(replies.request("Ack ORDERS#7", "allowed.echo", encoder.encode("+ACK"), boundMillis)).pipe(
        Effect.timeout("5 seconds")
      )
      assert.strictEqual(refused.reason, "NotAuthorized")
      assert.strictEqual(refused.operation, "Ack ORDERS#7")
      assert.match(refused.message, /^Permissions Violation for Subscription to "_INBOX\.\S+\.\*"/)
    }).pipe(Effect.scoped), 60_000)
})

describe("the source's failure once a settling command is refused", () => {
  it("names the refused command and subject, and the subject to allow: the consumer's acks, or the dead-letter subject", () => {
    const refusal = (operation: string, subject: string) =>
      new NatsError.NatsError({ reason: "NotAuthorized", operation, message: `Permissions Violation for Publish to "${subject}"` })
    const short = "$JS.ACK.ORDERS.shipping.1.6.6.1700000000000000000.0"
    const ack = refusedSettling("ORDERS/shipping", "Ack", short, refusal("Ack ORDERS#6", short))
    assert.strictEqual(ack.reason, "NotAuthorized")
    assert.include(ack.message, `ORDERS/shipping: NATS refuses this connection's acks`)
    assert.include(ack.message, `(Ack ORDERS#6: Permissions Violation for Publish to "${short}")`)
    assert.include(ack.message, `publish permission on "$JS.ACK.ORDERS.shipping.>"`)
    // The long form, with a domain and an account hash.
    const long = "$JS.ACK.hub.ACCHASH.ORDERS.shipping.1.6.6.1700000000000000000.0.token"
    assert.include(refusedSettling("ORDERS/shipping", "Extend", long, refusal("Extend ORDERS#6", long)).message, `"$JS.ACK.hub.ACCHASH.ORDERS.shipping.>"`)
    const dlq = "jetworker.dlq.ORDERS.shipping"
    const dead = refusedSettling("ORDERS/shipping", "DeadLetter", dlq, refusal("dead-letter publish to ORDERS_DLQ", dlq))
    assert.include(dead.message, "NATS refuses this connection's dead letters")
    assert.include(dead.message, `publish permission on "${dlq}"`)
  })
})

/**
 * A server URL whose password holds an unescaped `/` (common in generated, base64 passwords) or a
 * comma (which separates the URLs): the password is never shown, neither in the failed
 * connection's message nor by `describeServers`. A `/` in the password is taken as part of it (the
 * credentials end at the last `@`); a comma cuts the URL in two, and the part whose port is no
 * number is refused, its "port" hidden, with the hint to encode the comma (`%2C`).
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, type NatsError } from "@jetworker/nats"
import { Effect, Layer } from "effect"

const SECRET = "Zm9v/YmFy"

const failure = (servers: string) =>
  Effect.flip(Layer.build(NatsConnection.layer({ servers, connectTimeout: "2 seconds" }))).pipe(
    Effect.scoped,
    Effect.timeout("10 seconds")
  )

describe("NatsConnection: secrets in server URLs that nats.js would misread", () => {
  it.live("a password with an unescaped / or , is shown by no message, and an unescaped comma is refused with the hint to encode it", () =>
    Effect.gen(function*() {
      const shown: Array<string> = []
      for (
        const servers of [
          // Nothing listens on port 1.
          `nats://alice:${SECRET}@127.0.0.1:1`,
          `alice:${SECRET}@127.0.0.1:1`,
          `nats://alice:4${SECRET}@127.0.0.1:1`,
          // An unescaped comma splits the URL in two (serverList), and the first half keeps the password's start.
          `nats://alice:Zm9v,YmFy@127.0.0.1:1`
        ]
      ) {
        const error = (yield* failure(servers)) as NatsError.NatsError
        shown.push(`${servers} -> [${error.reason}] ${error.message}`)
        shown.push(`describeServers -> ${NatsConnection.describeServers(servers)}`)
      }
      for (const line of shown) {
        for (const part of ["Zm9v", "YmFy"]) assert.notInclude(line.slice(line.indexOf("->")), part, `a secret is shown:\n${shown.join("\n")}`)
      }
      // The credentials with a "/" are taken out: nats.js gets a valid URL, and nothing listens there.
      for (const servers of [`nats://alice:${SECRET}@127.0.0.1:1`, `alice:${SECRET}@127.0.0.1:1`]) {
        assert.strictEqual((yield* failure(servers)).reason, "ConnectionRefused", servers)
      }
      const comma = yield* failure(`nats://alice:Zm9v,YmFy@127.0.0.1:1`)
      assert.strictEqual(comma.reason, "ApiError")
      assert.include(comma.message, "the server URL nats://alice:*** has a port that is no number")
      assert.include(comma.message, "%2C")
    }), 40_000)
})

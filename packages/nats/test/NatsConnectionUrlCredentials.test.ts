/**
 * Credentials in a server URL (`nats://user:password@host:port`, `nats://token@host:port`), as NATS
 * users write them in `NATS_URL` (the Go client and the nats CLI honour them). nats.js drops them
 * without a word (and reads a numeric password as the port), so the login was refused, or went
 * through as nobody: the connection takes them out of the URLs and logs in with them, refuses two
 * different sets, and never shows the password or the token in an error or a log line.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, NatsError } from "@jetworker/nats"
import { Eventually, NatsServer } from "@jetworker/testing"
import { ConfigProvider, Context, Effect, Layer, Logger, Redacted } from "effect"

// Secrets that must never be shown (numeric ones are left out: a timestamp may hold their digits).
const SECRETS = ["s3cret", "wr0ng-pass", "p@ss/w:rd", "p%40ss", "t0k@en", "t0k%40en", "wr0ng-t0ken", "other-pw"]

const assertNoSecret = (text: string, what: string) => {
  for (const secret of SECRETS) assert.notInclude(text, secret, `${what} shows a secret`)
}

/** Every log line, as JSON (message, annotations, cause), for the no-secret check. */
const capturing = () => {
  const lines: Array<string> = []
  const layer = Logger.layer([Logger.map(Logger.formatJson, (line) => void lines.push(line))])
  return { lines, layer }
}

const userServer = NatsServer.make({
  config: [
    "authorization {",
    "  users: [",
    "    { user: alice, password: s3cret }",
    "    { user: bob, password: \"p@ss/w:rd 1\" }",
    "    { user: carol, password: \"2468\" }",
    "  ]",
    "}"
  ].join("\n")
})

const tokenServer = NatsServer.make({ config: "authorization { token: \"t0k@en\" }" })

/** A JetStream request on a connection made with `options`, which needs an authenticated login. */
const accountInfo = (layer: Layer.Layer<NatsConnection.NatsConnection, unknown>) =>
  Effect.gen(function*() {
    const nats = yield* Layer.build(layer)
    const { manager } = Context.get(nats, NatsConnection.NatsConnection)
    return yield* NatsError.tryPromise("account info", () => manager.getAccountInfo())
  }).pipe(Effect.scoped, Effect.timeout("15 seconds"))

const connect = (options: NatsConnection.Options) => accountInfo(NatsConnection.layer({ connectTimeout: "5 seconds", ...options }))

const fromEnv = (env: Record<string, string>) =>
  Layer.provide(
    NatsConnection.layerConfig({ connectTimeout: "5 seconds" }),
    ConfigProvider.layer(ConfigProvider.fromEnv({ env }))
  )

/** The failure of building a connection with `options`. */
const refusal = (layer: Layer.Layer<NatsConnection.NatsConnection, unknown>) =>
  Effect.flip(Layer.build(layer)).pipe(Effect.scoped, Effect.timeout("15 seconds"))

const assertRefused = (error: unknown, text: string, what: string) => {
  assert.strictEqual((error as { _tag?: unknown })._tag, "NatsError", what)
  const natsError = error as NatsError.NatsError
  assert.include(natsError.message, text, what)
  assert.isFalse(natsError.isRetryable, what)
  assertNoSecret(natsError.message, what)
}

describe("NatsConnection with credentials in the server URL", () => {
  it.live("user:password@ logs in with them (percent-decoded, a numeric password too, from NATS_URL too), also after a reconnect, and no log line shows the password", () =>
    Effect.gen(function*() {
      const server = yield* userServer
      const logs = capturing()
      yield* Effect.gen(function*() {
        const at = `127.0.0.1:${server.port}`
        const alice = yield* connect({ servers: `nats://alice:s3cret@${at}` })
        assert.isAtLeast(alice.streams, 0)
        // Percent-encoded: an `@`, a `/`, a `:` and a space in the password.
        yield* connect({ servers: `nats://bob:p%40ss%2Fw%3Ard%201@${at}` })
        // Unescaped: an `@`, a `/` (a base64 password may hold one) and a `:`.
        yield* connect({ servers: `nats://bob:p@ss/w:rd 1@${at}` })
        // nats.js read the digits after `carol:` as the port.
        yield* connect({ servers: `nats://carol:2468@${at}` })
        // The same credentials in every URL of the list, and none in another: one login.
        yield* connect({ servers: [`nats://alice:s3cret@${at}`, `nats://alice:s3cret@${at}`, `nats://${at}`] })
        // The same credentials given twice, in the URL and in the options, are no conflict.
        yield* connect({ servers: `nats://alice:s3cret@${at}`, user: "alice", password: Redacted.make("s3cret") })
        yield* accountInfo(fromEnv({ NATS_URL: `nats://alice:s3cret@${at}` }))
        yield* accountInfo(fromEnv({ NATS_URL: ` nats://bob:p%40ss%2Fw%3Ard%201@${at} , ` }))

        // The credentials are used again by the reconnect after a crash of the server.
        yield* Effect.gen(function*() {
          const nats = yield* Layer.build(NatsConnection.layer({ servers: `nats://alice:s3cret@${at}` }))
          const { manager } = Context.get(nats, NatsConnection.NatsConnection)
          yield* server.restart("SIGKILL")
          yield* Eventually.holds(
            "the reconnect logged",
            Effect.sync(() => logs.lines.some((line) => line.includes("nats connection reconnect"))),
            "15 seconds"
          )
          yield* NatsError.tryPromise("account info", () => manager.getAccountInfo()).pipe(Effect.timeout("10 seconds"))
        }).pipe(Effect.scoped)
      }).pipe(Effect.provide(logs.layer))
      assert.isTrue(logs.lines.some((line) => line.includes("nats connection disconnect")), logs.lines.join("\n"))
      assertNoSecret(logs.lines.join("\n"), "a log line")
    }).pipe(Effect.scoped), 60_000)

  it.live("a lone token@ logs in with the token (percent-decoded, or with an unescaped @)", () =>
    Effect.gen(function*() {
      const server = yield* tokenServer
      const at = `127.0.0.1:${server.port}`
      yield* connect({ servers: `nats://t0k%40en@${at}` })
      yield* connect({ servers: `nats://t0k@en@${at}` })
      yield* accountInfo(fromEnv({ NATS_URL: `nats://t0k%40en@${at}` }))
    }).pipe(Effect.scoped), 30_000)

  it.live("a wrong password or token in the URL is refused at once, with a typed error that names the URL's credentials and shows neither the secret nor the user", () =>
    Effect.gen(function*() {
      const users = yield* userServer
      const tokens = yield* tokenServer
      const logs = capturing()
      yield* Effect.gen(function*() {
        for (
          const [servers, where] of [
            [`nats://alice:wr0ng-pass@127.0.0.1:${users.port}`, `nats://127.0.0.1:${users.port}`],
            [`nats://wr0ng-t0ken@127.0.0.1:${tokens.port}`, `nats://127.0.0.1:${tokens.port}`]
          ] as const
        ) {
          const natsError = (yield* refusal(NatsConnection.layer({ servers, connectTimeout: "5 seconds" }))) as NatsError.NatsError
          assert.strictEqual(natsError._tag, "NatsError", NatsConnection.describeServers(servers))
          assert.strictEqual(natsError.reason, "NotAuthorized", natsError.message)
          assert.isFalse(natsError.isRetryable)
          assert.include(natsError.message, where)
          assert.include(natsError.message, "in the server URL")
          assertNoSecret(natsError.message, "the refusal")
        }
      }).pipe(Effect.provide(logs.layer))
      assertNoSecret(logs.lines.join("\n"), "a log line")
    }).pipe(Effect.scoped), 30_000)

  it.live("two sets of credentials are refused before connecting, saying which settings clash, without the secrets", () =>
    Effect.gen(function*() {
      // Nothing listens there: what is not refused first ends in "could not connect".
      const nowhere = "127.0.0.1:1"
      for (
        const [options, text] of [
          [{ servers: [`nats://alice:s3cret@${nowhere}`, `nats://bob:other-pw@127.0.0.1:2`] }, "different credentials"],
          [{ servers: `nats://alice:s3cret@${nowhere},nats://alice:other-pw@127.0.0.1:2` }, "different credentials"],
          [{ servers: [`nats://alice:s3cret@${nowhere}`, `nats://t0k%40en@127.0.0.1:2`] }, "different credentials"],
          [{ servers: `nats://alice:s3cret@${nowhere}`, user: "alice", password: Redacted.make("other-pw") }, "NATS_USER"],
          [{ servers: `nats://alice:s3cret@${nowhere}`, token: Redacted.make("t0k@en") }, "NATS_TOKEN"],
          [{ servers: `nats://t0k%40en@${nowhere}`, token: Redacted.make("other-pw") }, "NATS_TOKEN"],
          [{ servers: `nats://t0k%40en@${nowhere}`, nkeySeed: Redacted.make("SUAother-pw") }, "NATS_NKEY_SEED"],
          [{ servers: `nats://alice:s3cret@${nowhere}`, credentialsFile: "/nonexistent.creds" }, "NATS_CREDS"],
          // Malformed percent-encoding, and a password without a user.
          [{ servers: `nats://alice:s3cret%E0%A4%A@${nowhere}` }, "percent-encoding"],
          [{ servers: `nats://:s3cret@${nowhere}` }, "no user"],
          // Both empty (a template of empty variables): said as it is, not as "a password".
          [{ servers: `nats://:@${nowhere}` }, "an empty user and an empty password"]
        ] as const
      ) {
        const error = yield* refusal(NatsConnection.layer({ connectTimeout: "2 seconds", ...options }))
        assertRefused(error, text, JSON.stringify({ ...options, servers: NatsConnection.describeServers(options.servers) }))
      }
      // From the environment: NATS_URL's password against NATS_PASSWORD's.
      const error = yield* refusal(
        fromEnv({ NATS_URL: `nats://alice:s3cret@${nowhere}`, NATS_USER: "alice", NATS_PASSWORD: "other-pw" })
      )
      assertRefused(error, "NATS_PASSWORD", "NATS_URL and NATS_PASSWORD")
    }), 30_000)
})

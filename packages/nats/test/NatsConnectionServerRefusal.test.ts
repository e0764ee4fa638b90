/**
 * A server that turns the client away with an `-ERR` during the handshake other than a refused
 * login (nats.js reports that one): its connection limit (`max_connections`), or the account's
 * (`limits.conn` of an account JWT, said after the login). nats.js records the `-ERR` and waits for
 * the handshake's PONG until its connect timeout, so the failure read "did not complete the NATS
 * handshake", blaming the network. The connection names the server's words instead, and, under a
 * worker that is starting, waits for a free connection until the start-up deadline, each try
 * saying why. Real nats-servers on loopback.
 */
import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { NatsConnection, type NatsError } from "@jetworker/nats"
import { Eventually, NatsServer } from "@jetworker/testing"
import { createAccount, createOperator, createUser, type KeyPair } from "@nats-io/nkeys"
import { connect } from "@nats-io/transport-node"
import { Duration, Effect, Fiber, Layer, Logger, Result } from "effect"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connectNextStep, refusedBy } from "../src/internal/connectSettings.ts"

const secret = "pw-never-printed-51ab"

/** A plain nats.js connection to `url`, held until the scope closes: it takes the one free slot. */
const holdConnection = (url: string, options: Record<string, unknown> = {}) =>
  Effect.acquireRelease(
    Effect.promise(() => connect({ servers: url, maxReconnectAttempts: 0, ...options })),
    (connection) => Effect.promise(() => connection.close().catch(() => undefined))
  )

/** The first connection's failure, bounded. */
const failure = (options: NatsConnection.Options) =>
  Effect.flip(Layer.build(NatsConnection.layer({ maxReconnectAttempts: 0, ...options }))).pipe(
    Effect.scoped,
    Effect.timed,
    Effect.timeout("20 seconds")
  )

const b64url = (data: Uint8Array | string) => Buffer.from(data).toString("base64url")

/** A NATS JWT (v2) with `nats` claims about `subject`, signed by `issuer`. */
const natsJwt = (issuer: KeyPair, subject: string, name: string, nats: Record<string, unknown>): string => {
  const header = b64url(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" }))
  const claims = b64url(JSON.stringify({
    jti: crypto.randomUUID().replaceAll("-", "").toUpperCase(),
    iat: Math.floor(Date.now() / 1000),
    iss: issuer.getPublicKey(),
    name,
    sub: subject,
    nats: { ...nats, version: 2 }
  }))
  return `${header}.${claims}.${b64url(issuer.sign(new TextEncoder().encode(`${header}.${claims}`)))}`
}

/** An operator-mode server whose application account allows one connection; a `.creds` file of one of its users. */
const accountLimitServer = Effect.gen(function*() {
  const [operator, system, account, user] = [createOperator(), createAccount(), createAccount(), createUser()]
  const limits = { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 }
  const server = yield* NatsServer.make({
    config: [
      `operator: ${natsJwt(operator, operator.getPublicKey(), "jetworker-test", { type: "operator", system_account: system.getPublicKey() })}`,
      `system_account: ${system.getPublicKey()}`,
      `resolver: MEMORY`,
      `resolver_preload: {`,
      `  ${system.getPublicKey()}: ${natsJwt(operator, system.getPublicKey(), "SYS", { type: "account", limits })}`,
      `  ${account.getPublicKey()}: ${natsJwt(operator, account.getPublicKey(), "app", { type: "account", limits: { ...limits, conn: 1 } })}`,
      `}`
    ].join("\n")
  })
  const dir = yield* Effect.acquireRelease(
    Effect.sync(() => mkdtempSync(join(tmpdir(), "jw-creds-"))),
    (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )
  const creds = join(dir, "svc.creds")
  const userJwt = natsJwt(account, user.getPublicKey(), "svc", { type: "user", pub: {}, sub: {}, subs: -1, data: -1, payload: -1 })
  writeFileSync(
    creds,
    `-----BEGIN NATS USER JWT-----\n${userJwt}\n------END NATS USER JWT------\n\n` +
      `-----BEGIN USER NKEY SEED-----\n${new TextDecoder().decode(user.getSeed())}\n------END USER NKEY SEED------\n`
  )
  return { server, creds }
})

/** What a named refusal says, whatever the limit: the server, its words, no secret, no blaming the network. */
const namesRefusal = (error: NatsError.NatsError, url: string, words: string) => {
  assert.include(error.message, words, error.message)
  assert.include(error.message, url)
  assert.notInclude(error.message, secret)
  assert.notInclude(error.message, "did not complete the NATS handshake")
  assert.strictEqual(error.reason, "ConnectionRefused", error.message)
  assert.isTrue(error.isRetryable)
}

describe("NatsConnection: a server that turns the client away during the handshake", () => {
  it.live("at the server's connection limit (max_connections): the failure names it, right after the connect timeout, without the URL's password", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config: `max_connections: 1\nauthorization { user: op, password: "${secret}" }` })
      yield* holdConnection(server.url, { user: "op", pass: secret })
      const [elapsed, error] = yield* failure({ servers: `nats://op:${secret}@127.0.0.1:${server.port}`, connectTimeout: "2 seconds" })
      namesRefusal(error, server.url, "maximum connections exceeded")
      assert.include(error.message, "max_connections")
      // nats.js's own failure comes at the connect timeout; the server's answer is read within a few seconds after it.
      assert.isBelow(Duration.toMillis(elapsed), 2_000 + 5_000)
    }).pipe(Effect.scoped), 30_000)

  it.live("at the account's connection limit (an account JWT's limits.conn, said after the login): the failure names it", () =>
    Effect.gen(function*() {
      const { creds, server } = yield* accountLimitServer
      // The account's one connection, held until the scope closes.
      yield* Layer.build(NatsConnection.layer({ servers: server.url, credentialsFile: creds }))
      const [, error] = yield* failure({ servers: server.url, credentialsFile: creds, connectTimeout: "2 seconds" })
      namesRefusal(error, server.url, "maximum account active connections exceeded")
    }).pipe(Effect.scoped), 30_000)

  it("another -ERR is final, in the server's words; a refused login heard so is worded as nats.js's own (check the credentials)", () => {
    const options = { servers: "nats://127.0.0.1:4999" }
    const other = connectNextStep(refusedBy("nats://127.0.0.1:4999", "Unknown Protocol Operation"), options)
    assert.strictEqual(other.reason, "Unknown")
    assert.isFalse(other.isRetryable)
    assert.include(other.message, "the server refused the connection: nats://127.0.0.1:4999 turned the connection away during the handshake (-ERR 'Unknown Protocol Operation')")
    const login = connectNextStep(refusedBy("nats://127.0.0.1:4999", "Authorization Violation"), options)
    assert.strictEqual(login.reason, "NotAuthorized")
    assert.include(login.message, "Authorization Violation: nats://127.0.0.1:4999 refused the credentials")
    const throttled = connectNextStep(refusedBy("nats://127.0.0.1:4999", "Connection throttling is active. Please try again later."), options)
    assert.isTrue(throttled.isRetryable)
  })

  it.live("under a worker that is starting: each try says the server is at its limit (startup.waiting), and the start-up connects once a connection is free", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config: "max_connections: 1" })
      const holder = yield* Effect.promise(() => connect({ servers: server.url, maxReconnectAttempts: 0 }))
      const lines: Array<{ readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
      const logger = Logger.map(Logger.formatStructured, (entry) => void lines.push({ message: entry.message, annotations: entry.annotations }))
      const lifecycle = yield* Lifecycle.makeManaged({
        budget: Result.getOrThrow(Lifecycle.makeBudget({})),
        startupTimeout: "30 seconds"
      })
      const connecting = yield* Effect.forkChild(
        Layer.build(NatsConnection.layer({ servers: server.url, connectTimeout: "1 second" })).pipe(
          Effect.provideService(Lifecycle.Lifecycle, lifecycle),
          Effect.provide(Logger.layer([logger]))
        )
      )
      const waiting = yield* Eventually.poll(
        "a startup.waiting line",
        Effect.sync(() => lines.find((l) => l.message === "startup.waiting")),
        (line) => line !== undefined || connecting.pollUnsafe() !== undefined,
        { timeout: "15 seconds", interval: "50 millis" }
      )
      assert.isUndefined(connecting.pollUnsafe(), "start-up ended while the server was at its limit")
      assert.strictEqual(waiting!.annotations.dependency, "nats")
      assert.include(String(waiting!.annotations.error), "maximum connections exceeded")
      yield* Effect.promise(() => holder.close())
      const context = yield* Fiber.join(connecting).pipe(Effect.timeout("20 seconds"))
      const { connection } = yield* NatsConnection.NatsConnection.pipe(Effect.provideContext(context))
      assert.isFalse(connection.isClosed())
    }).pipe(Effect.scoped), 60_000)
})

/**
 * NATS security against a private nats-server on loopback that requires TLS with client
 * certificates (mutual TLS) and authenticates users by password or NKey, and one in operator mode
 * that authenticates a credentials file (user JWT and seed): the connection's TLS
 * files and credentials come from its options or the environment, secrets are `Redacted` and
 * never printed, and a refused credential or certificate is a clear start-up error, not a retry
 * loop. The certificates are made for the test with openssl.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsConnection, Publisher, Topology } from "@jetworker/nats"
import { ChildWorker, NatsServer } from "@jetworker/testing"
import { createAccount, createOperator, createUser, type KeyPair } from "@nats-io/nkeys"
import { ConfigProvider, Effect, Layer, Redacted } from "effect"
import { execFileSync } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const workerFixture = fileURLToPath(new URL("./fixtures/ledger-worker.ts", import.meta.url))
const password = "pw-never-printed-7c1d"

/** A CA, a server certificate for 127.0.0.1 and a client certificate, in a directory removed with the scope. */
const certificates = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = mkdtempSync(join(tmpdir(), "jw-tls-"))
    const openssl = (...args: Array<string>) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" })
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=jetworker test CA")
    const sign = (name: string, extensions: string) => {
      openssl("req", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`)
      writeFileSync(join(dir, `${name}.ext`), extensions)
      openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${name}.pem`, "-days", "2", "-extfile", `${name}.ext`)
    }
    sign("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    sign("client", "extendedKeyUsage=clientAuth\n")
    const file = (name: string) => join(dir, name)
    return { dir, ca: file("ca.pem"), serverCert: file("server.pem"), serverKey: file("server.key"), clientCert: file("client.pem"), clientKey: file("client.key") }
  }),
  (certs) => Effect.sync(() => rmSync(certs.dir, { recursive: true, force: true }))
)

/** The secured server: mutual TLS, and users `svc` (password) and one NKey user. */
const securedServer = Effect.gen(function*() {
  const certs = yield* certificates
  const nkeyUser = createUser()
  const server = yield* NatsServer.make({
    config: [
      `tls { cert_file: "${certs.serverCert}", key_file: "${certs.serverKey}", ca_file: "${certs.ca}", verify: true, timeout: 2 }`,
      `authorization { users: [ { user: "svc", password: "${password}" }, { nkey: "${nkeyUser.getPublicKey()}" } ] }`
    ].join("\n")
  })
  const seed = new TextDecoder().decode(nkeyUser.getSeed())
  return { certs, server, seed }
})

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

/** A `.creds` file's text for a user JWT and the user's seed, as `nsc` writes it. */
const credsFile = (userJwt: string, user: KeyPair): string =>
  `-----BEGIN NATS USER JWT-----\n${userJwt}\n------END NATS USER JWT------\n\n` +
  `-----BEGIN USER NKEY SEED-----\n${new TextDecoder().decode(user.getSeed())}\n------END USER NKEY SEED------\n`

/**
 * A server in operator mode (decentralized auth): an operator, a system account and an application
 * account with JetStream, preloaded in a memory resolver; and a user of the application account.
 */
const operatorServer = Effect.gen(function*() {
  const [operator, system, account, user] = [createOperator(), createAccount(), createAccount(), createUser()]
  const limits = { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 }
  const server = yield* NatsServer.make({
    config: [
      `operator: ${natsJwt(operator, operator.getPublicKey(), "jetworker-test", { type: "operator", system_account: system.getPublicKey() })}`,
      `system_account: ${system.getPublicKey()}`,
      `resolver: MEMORY`,
      `resolver_preload: {`,
      `  ${system.getPublicKey()}: ${natsJwt(operator, system.getPublicKey(), "SYS", { type: "account", limits })}`,
      `  ${account.getPublicKey()}: ${natsJwt(operator, account.getPublicKey(), "app", { type: "account", limits: { ...limits, mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1 } })}`,
      `}`
    ].join("\n")
  })
  const userClaims = { type: "user", pub: {}, sub: {}, subs: -1, data: -1, payload: -1 }
  const dir = yield* Effect.acquireRelease(
    Effect.sync(() => mkdtempSync(join(tmpdir(), "jw-creds-"))),
    (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )
  const good = join(dir, "svc.creds")
  writeFileSync(good, credsFile(natsJwt(account, user.getPublicKey(), "svc", userClaims), user))
  // A user signed by an account the server does not know.
  const strangerUser = createUser()
  const stranger = join(dir, "stranger.creds")
  writeFileSync(stranger, credsFile(natsJwt(createAccount(), strangerUser.getPublicKey(), "stranger", userClaims), strangerUser))
  return { server, good, stranger }
})

/** The environment a worker reads to connect to `server` with the TLS files, as user `svc` with `pw`. */
const natsEnv = (server: NatsServer.NatsServer, certs: { readonly ca: string; readonly clientCert: string; readonly clientKey: string }, pw: string) => ({
  NATS_URL: server.url,
  NATS_TLS_CA: certs.ca,
  NATS_TLS_CERT: certs.clientCert,
  NATS_TLS_KEY: certs.clientKey,
  NATS_USER: "svc",
  NATS_PASSWORD: pw
})

/** Connects with `options` and round-trips a confirmed publish through a stream. */
const roundTrip = (options: NatsConnection.Options) =>
  Effect.gen(function*() {
    const stream = `SEC_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
    yield* Topology.ensureStream({ name: stream, subjects: [`${stream.toLowerCase()}.>`] })
    const ack = yield* Publisher.publish(`${stream.toLowerCase()}.hello`, new TextEncoder().encode("{}"), { msgId: "m1", stream })
    return ack.seq
  }).pipe(Effect.provide(NatsConnection.layer(options)))

describe("NATS security", () => {
  it.effect("TLS with a client certificate and a password, or an NKey seed: the connection is made, and a publish is stored", () =>
    Effect.gen(function*() {
      const { certs, server, seed } = yield* securedServer
      const tls = { caFile: certs.ca, certFile: certs.clientCert, keyFile: certs.clientKey }
      assert.strictEqual(yield* roundTrip({ servers: server.url, tls, user: "svc", password: Redacted.make(password) }), 1)
      assert.strictEqual(yield* roundTrip({ servers: server.url, tls, nkeySeed: Redacted.make(seed) }), 1)

      // The same from the environment (NATS_TLS_*, NATS_USER, NATS_PASSWORD), as a worker reads it.
      const fromEnv = yield* Effect.gen(function*() {
        const { connection } = yield* NatsConnection.NatsConnection
        return connection.info?.tls_required === true
      }).pipe(
        Effect.provide(NatsConnection.layerConfig().pipe(Layer.provide(Layer.succeed(
          ConfigProvider.ConfigProvider,
          ConfigProvider.fromEnv({ env: natsEnv(server, certs, password) })
        ))))
      )
      assert.isTrue(fromEnv)
    }).pipe(Effect.scoped), 60_000)

  it.effect("a wrong password, an unknown NKey and an unreadable credentials file fail at once, a missing client certificate at the connect timeout; each says what to check and prints no secret", () =>
    Effect.gen(function*() {
      const { certs, server } = yield* securedServer
      const tls = { caFile: certs.ca, certFile: certs.clientCert, keyFile: certs.clientKey }
      const refused = (options: NatsConnection.Options) =>
        Effect.flip(Effect.scoped(Layer.build(NatsConnection.layer({ connectTimeout: "3 seconds", ...options }))))

      const wrongPassword = yield* refused({ servers: server.url, tls, user: "svc", password: Redacted.make("not-the-password") })
      assert.strictEqual(wrongPassword.reason, "NotAuthorized")
      assert.include(wrongPassword.message, "refused the credentials")
      assert.notInclude(wrongPassword.message, "not-the-password")

      const stranger = new TextDecoder().decode(createUser().getSeed())
      const unknownKey = yield* refused({ servers: server.url, tls, nkeySeed: Redacted.make(stranger) })
      assert.strictEqual(unknownKey.reason, "NotAuthorized")
      assert.notInclude(unknownKey.message, stranger)

      const noClientCert = yield* refused({ servers: server.url, tls: { caFile: certs.ca }, user: "svc", password: Redacted.make(password) })
      assert.notStrictEqual(noClientCert.reason, "ConnectionRefused")
      assert.include(noClientCert.message, "NATS_TLS_CERT")

      const noCreds = yield* refused({ servers: server.url, tls, credentialsFile: join(certs.dir, "missing.creds") })
      assert.include(noCreds.message, `cannot read the credentials file ${join(certs.dir, "missing.creds")}`)
    }).pipe(Effect.scoped), 60_000)

  it.effect("a missing CA file, a certificate without its key, TLS against a server without TLS and a malformed NKey seed fail a worker at once, not retried until its start-up timeout, naming the setting and printing no secret", () =>
    Effect.gen(function*() {
      const { certs, server } = yield* securedServer
      const plain = yield* NatsServer.make({})
      const seed = new TextDecoder().decode(createUser().getSeed())
      // One character changed: the checksum no longer matches.
      const badSeed = `${seed.slice(0, 10)}${seed[10] === "A" ? "B" : "A"}${seed.slice(11)}`
      const secured: Record<string, string> = natsEnv(server, certs, password)
      const without = (env: Record<string, string>, name: string) => Object.fromEntries(Object.entries(env).filter(([key]) => key !== name))
      /** Runs the worker with `env` (start-up timeout 60 s); its output, once it has exited. */
      const fails = (env: Record<string, string>) =>
        Effect.gen(function*() {
          const started = Date.now()
          const child = yield* ChildWorker.spawn({
            script: workerFixture,
            env: { ...env, STARTUP_TIMEOUT: "60 seconds", HEALTH_PORT: "0", HEALTH_HOST: "127.0.0.1" }
          })
          const exit = yield* child.waitForExit("45 seconds")
          const elapsed = Date.now() - started
          const output = [...(yield* child.lines), ...(yield* child.stderr)].join("\n")
          assert.notStrictEqual(exit.code, 0, output)
          // Half the start-up timeout: five workers start at once, and a loaded machine (CI) took
          // 15.7 s once; the attempts themselves are checked below.
          assert.isBelow(elapsed, 30_000, "not retried until the start-up timeout")
          assert.match(output, /worker\.failed/)
          // Start-up logs each failed try; a failure that will not pass is tried once.
          assert.notMatch(output, /"message":"startup\.waiting"[^\n]*"attempt":2/, "not retried")
          assert.notInclude(output, password)
          return output
        })
      const missing = join(certs.dir, "missing-ca.pem")
      const [missingCa, certWithoutKey, keyWithoutCert, plainServer, malformedSeed] = yield* Effect.all([
        fails({ ...secured, NATS_TLS_CA: missing }),
        fails(without(secured, "NATS_TLS_KEY")),
        fails(without(secured, "NATS_TLS_CERT")),
        fails({ ...secured, NATS_URL: plain.url }),
        fails({ NATS_URL: server.url, NATS_TLS_CA: certs.ca, NATS_TLS_CERT: certs.clientCert, NATS_TLS_KEY: certs.clientKey, NATS_NKEY_SEED: badSeed })
      ], { concurrency: "unbounded" })
      assert.include(missingCa, `cannot read the CA file (NATS_TLS_CA, tls.caFile) ${missing}`)
      assert.include(certWithoutKey, "set NATS_TLS_CERT and NATS_TLS_KEY")
      assert.include(certWithoutKey, `only the certificate ${certs.clientCert} is set`)
      assert.include(keyWithoutCert, `only the key ${certs.clientKey} is set`)
      assert.include(plainServer, "does not offer TLS")
      assert.include(plainServer, "NATS_TLS_CA")
      assert.include(malformedSeed, "NATS_NKEY_SEED")
      assert.notInclude(malformedSeed, badSeed)
      assert.notInclude(malformedSeed, seed)
    }).pipe(Effect.scoped), 60_000)

  it.effect("a worker without a client certificate for a server that verifies clients stops at its start-up timeout with the TLS next step, not a bare StartupTimeout", () =>
    Effect.gen(function*() {
      const { certs, server } = yield* securedServer
      const child = yield* ChildWorker.spawn({
        script: workerFixture,
        env: {
          NATS_URL: server.url,
          NATS_TLS_CA: certs.ca,
          NATS_USER: "svc",
          NATS_PASSWORD: password,
          STARTUP_TIMEOUT: "4 seconds",
          HEALTH_PORT: "0",
          HEALTH_HOST: "127.0.0.1"
        }
      })
      const exit = yield* child.waitForExit("30 seconds")
      const output = [...(yield* child.lines), ...(yield* child.stderr)].join("\n")
      assert.notStrictEqual(exit.code, 0, output)
      const failed = output.split("\n").find((line) => line.includes(`"message":"worker.failed"`)) ?? ""
      assert.include(failed, "NATS_TLS_CERT and NATS_TLS_KEY", output)
      assert.notInclude(output, password)
    }).pipe(Effect.scoped), 60_000)

  it.effect("a credentials file (user JWT and NKey seed) authenticates against a server in operator mode; one signed by an account the server does not know is refused at once", () =>
    Effect.gen(function*() {
      const { server, good, stranger } = yield* operatorServer
      assert.strictEqual(yield* roundTrip({ servers: server.url, credentialsFile: good }), 1)
      const refused = yield* Effect.flip(Effect.scoped(Layer.build(NatsConnection.layer({ servers: server.url, credentialsFile: stranger }))))
      assert.strictEqual(refused.reason, "NotAuthorized")
      assert.include(refused.message, "refused the credentials")
    }).pipe(Effect.scoped), 60_000)

  it.effect("a worker whose password is wrong stops at start-up with worker.failed naming what to check, long before its start-up timeout, and never prints the password", () =>
    Effect.gen(function*() {
      const { certs, server } = yield* securedServer
      const wrong = "wrong-pw-never-printed-91ab"
      const started = Date.now()
      const child = yield* ChildWorker.spawn({
        script: workerFixture,
        env: {
          ...natsEnv(server, certs, wrong),
          STARTUP_TIMEOUT: "60 seconds",
          HEALTH_PORT: "0",
          HEALTH_HOST: "127.0.0.1"
        }
      })
      const exit = yield* child.waitForExit("30 seconds")
      const elapsed = Date.now() - started
      assert.notStrictEqual(exit.code, 0)
      assert.isBelow(elapsed, 30_000, "not retried until the start-up timeout")
      const output = [...(yield* child.lines), ...(yield* child.stderr)].join("\n")
      assert.match(output, /worker\.failed/)
      assert.include(output, "refused the credentials")
      assert.notInclude(output, wrong)
    }).pipe(Effect.scoped), 60_000)
})

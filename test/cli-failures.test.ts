/**
 * The `jetworker` command's failures as an operator meets them: a child process against real
 * servers (the shared NATS, private nats-servers without JetStream or with an account without it,
 * a TCP listener that is no NATS server), its exit code, its stderr, and how long it took.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { DeadLetter, NatsConnection, NatsError, Topology } from "@jetworker/nats"
import { Migrations } from "@jetworker/sql-pg"
import { ChildWorker, NatsServer, TestDatabase } from "@jetworker/testing"
import { headers as natsHeaders } from "@nats-io/transport-node"
import { type Duration, Effect, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as Net from "node:net"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const bin = fileURLToPath(new URL("../packages/cli/src/bin/jetworker.ts", import.meta.url))
const ledgerContract = fileURLToPath(new URL("../examples/ledger/contract.json", import.meta.url))

/** Runs the command with `env` laid over the test's environment; keeps the last `maxLines` lines of each output. */
const jetworkerEnv = (env: Record<string, string>, args: ReadonlyArray<string>, maxLines = 10_000, timeout: Duration.Input = "150 seconds") =>
  Effect.gen(function*() {
    const started = Date.now()
    const child = yield* ChildWorker.spawn({ script: bin, args, env, maxLines })
    const exit = yield* child.waitForExit(timeout)
    return {
      code: exit.code,
      stdout: (yield* child.lines).join("\n"),
      stderr: (yield* child.stderr).join("\n"),
      millis: Date.now() - started
    }
  }).pipe(Effect.scoped)

const jetworker = (...args: ReadonlyArray<string>) => jetworkerEnv({}, args)

/** A TCP listener on a free loopback port that answers every connection with `reply` (an HTTP server's refusal). */
const notNats = (reply: string) =>
  Effect.acquireRelease(
    Effect.callback<Net.Server>((resume) => {
      const listener = Net.createServer((socket) => {
        socket.on("error", () => undefined)
        socket.end(reply)
      })
      listener.listen(0, "127.0.0.1", () => resume(Effect.succeed(listener)))
    }),
    (listener) => Effect.sync(() => listener.close())
  ).pipe(Effect.map((listener) => `127.0.0.1:${(listener.address() as Net.AddressInfo).port}`))

// The account `nojs` logs in to has no JetStream, on a server that runs JetStream.
const accountWithoutJetStream = `accounts {
  NOJS: { users: [ { user: nojs, password: "nojs-pw-never-printed" } ] }
}`

describe("jetworker CLI failures", () => {
  it.live("NatsError: 'JetStream not enabled for account' (10039) is a final ApiError with its code, not the retryable NoResponders; a server without JetStream stays NoResponders", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({ config: accountWithoutJetStream })
      const connection = yield* NatsConnection.make({ servers: server.url, user: "nojs", password: Redacted.make("nojs-pw-never-printed") })
      const error = yield* Effect.flip(NatsError.tryPromise("stream info X", () => connection.manager.streams.info("X")))
      assert.strictEqual(error.reason, "ApiError", error.message)
      assert.strictEqual(error.code, 10039)
      assert.isFalse(error.isRetryable, "an account's setting does not change by retrying")
      assert.include(error.message, "not enabled for account")

      const withoutJetStream = yield* NatsServer.make({ config: "jetstream: disabled" })
      const plain = yield* NatsConnection.make({ servers: withoutJetStream.url })
      const unanswered = yield* Effect.flip(NatsError.tryPromise("stream info X", () => plain.manager.streams.info("X")))
      assert.strictEqual(unanswered.reason, "NoResponders", unanswered.message)
    }).pipe(Effect.scoped), 60_000)

  it.live("no JetStream: a server without it tells the operator to run it with -js, an account without it names the account's setting; both exit 2 within the connect and request bounds, the password never printed", () =>
    Effect.gen(function*() {
      const withoutJetStream = yield* NatsServer.make({ config: "jetstream: disabled" })
      for (const args of [["dlq", "list", "--stream", "X_DLQ"], ["dlq", "show", "--stream", "X_DLQ", "--sequence", "1"]]) {
        const run = yield* jetworker(...args, "--server", withoutJetStream.url)
        assert.strictEqual(run.code, 2, run.stdout + run.stderr)
        assert.include(run.stderr, "the server must run with JetStream (nats-server -js)")
        assert.isBelow(run.millis, 30_000)
      }

      const server = yield* NatsServer.make({ config: accountWithoutJetStream })
      const account = yield* jetworkerEnv(
        { NATS_USER: "nojs", NATS_PASSWORD: "nojs-pw-never-printed" },
        ["dlq", "list", "--stream", "X_DLQ", "--server", server.url]
      )
      assert.strictEqual(account.code, 2, account.stdout + account.stderr)
      assert.include(account.stderr, "JetStream not enabled for account")
      assert.include(account.stderr, "the account these credentials log in to has no JetStream")
      assert.notInclude(account.stderr, "nats-server -js", "the server does run JetStream: -js would send the operator the wrong way")
      assert.notInclude(account.stdout + account.stderr, "nojs-pw-never-printed")
      assert.isBelow(account.millis, 30_000)
    }).pipe(Effect.scoped), 120_000)

  it.live("a server that is not NATS (an HTTP server) is named in the failure, credentials hidden, with what to check; exit 2", () =>
    Effect.gen(function*() {
      const address = yield* notNats("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
      const run = yield* jetworker("dlq", "list", "--stream", "X_DLQ", "--server", `nats://op:url-pw-never-printed@${address}`)
      assert.strictEqual(run.code, 2, run.stdout + run.stderr)
      assert.include(run.stderr, `jetworker dlq list: `)
      assert.include(run.stderr, `nats://${address}`, "the server is named")
      assert.include(run.stderr, "is a nats-server running there")
      assert.notInclude(run.stdout + run.stderr, "url-pw-never-printed")
      assert.notInclude(run.stderr, "    at ", "no stack trace")
    }).pipe(Effect.scoped), 60_000)

  it.live("a failed connection's next step names --server when the flag gave the server (NATS_URL or --server when the environment did), never a library option; exit 2", () =>
    Effect.gen(function*() {
      const list = ["dlq", "list", "--stream", "X_DLQ"]
      // Nothing listens at port 1: refused.
      const refused = yield* jetworker(...list, "--server", "nats://127.0.0.1:1")
      assert.strictEqual(refused.code, 2, refused.stdout + refused.stderr)
      assert.include(refused.stderr, "could not connect to nats://127.0.0.1:1")
      assert.include(refused.stderr, "Set --server to where it runs")
      assert.notInclude(refused.stderr, "NATS_URL", "the flag, not the variable it replaced, gave the server")
      assert.notInclude(refused.stderr, "servers option")

      // A listener that closes every connection at once: nats.js's "node provided an undefined error", in words.
      const address = yield* notNats("")
      const closed = yield* jetworker(...list, "--server", `nats://op:url-pw-never-printed@${address}`)
      assert.strictEqual(closed.code, 2, closed.stdout + closed.stderr)
      assert.include(closed.stderr, `could not connect to nats://${address}`)
      assert.include(closed.stderr, "closed the connection before sending NATS's greeting (INFO)")
      assert.include(closed.stderr, "Set --server to where it runs")
      assert.notInclude(closed.stderr, "NATS_URL")
      assert.notInclude(closed.stderr, "node provided an undefined error")
      assert.notInclude(closed.stdout + closed.stderr, "url-pw-never-printed")

      // The URL's credentials refused: check them in --server.
      const server = yield* NatsServer.make({ config: accountWithoutJetStream })
      const wrong = yield* jetworker(...list, "--server", server.url.replace("nats://", "nats://nojs:not-the-pw-never-printed@"))
      assert.strictEqual(wrong.code, 2, wrong.stdout + wrong.stderr)
      assert.include(wrong.stderr, "refused the credentials; check the user and password in the server URL (--server;")
      assert.notInclude(wrong.stderr, "NATS_URL")
      assert.notInclude(wrong.stdout + wrong.stderr, "not-the-pw-never-printed")

      // Without the flag the server came from NATS_URL: that is named, and the flag that would replace it.
      const fromEnv = yield* jetworkerEnv({ NATS_URL: "nats://127.0.0.1:1" }, list)
      assert.strictEqual(fromEnv.code, 2, fromEnv.stdout + fromEnv.stderr)
      assert.include(fromEnv.stderr, "could not connect to nats://127.0.0.1:1")
      assert.include(fromEnv.stderr, "Set NATS_URL or --server to where it runs")
      assert.notInclude(fromEnv.stderr, "servers option")
    }).pipe(Effect.scoped), 90_000)

  it.live("a server that takes the connection and then stops answering fails the command (exit 2) saying it did not answer within 5 seconds; it ends within the request bound and a short close", () =>
    Effect.gen(function*() {
      // Speaks just enough NATS to be connected to (INFO, the first PONG), then nothing.
      const sockets: Array<Net.Socket> = []
      const listener = yield* Effect.acquireRelease(
        Effect.callback<Net.Server>((resume) => {
          const server = Net.createServer((socket) => {
            sockets.push(socket)
            socket.on("error", () => undefined)
            socket.write(`INFO {"server_id":"MUTE","version":"2.9.10","proto":1,"headers":true,"max_payload":1048576}\r\n`)
            let pongs = 0
            socket.on("data", (data) => {
              if (data.toString().includes("PING") && pongs++ === 0) socket.write("PONG\r\n")
            })
          })
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) => Effect.sync(() => {
          for (const socket of sockets) socket.destroy()
          server.close()
        })
      )
      const version = yield* jetworker("--version")
      const run = yield* jetworker("dlq", "list", "--stream", "X_DLQ", "--server", `nats://127.0.0.1:${(listener.address() as Net.AddressInfo).port}`)
      assert.strictEqual(run.code, 2, run.stdout + run.stderr)
      assert.include(run.stderr, "jetworker dlq list: list X_DLQ: timeout; the server did not answer within 5 seconds")
      // 5 s for the request and at most 1 s closing, beyond what starting the process takes
      // (measured just before); loose, for a loaded machine.
      assert.isBelow(run.millis - version.millis, 15_000)
    }).pipe(Effect.scoped), 60_000)

  it.live("a --server or NATS_URL that is no URL is named as the setting at fault (credentials hidden), exit 2, instead of a bare 'Invalid URL'; credentials in a URL are used (no note saying otherwise) and never printed", () =>
    Effect.gen(function*() {
      const flag = yield* jetworker("dlq", "list", "--stream", "X_DLQ", "--server", "op:url-pw-never-printed@not a host:4222")
      assert.strictEqual(flag.code, 2, flag.stdout + flag.stderr)
      assert.include(flag.stderr, `jetworker dlq list: --server "not a host:4222" is not a server URL (e.g. nats://127.0.0.1:4222)`)
      assert.notInclude(flag.stderr, "url-pw-never-printed")
      // A URL's credentials are the connection's (NatsConnection reads them): the failure names the
      // server without them, and the password is not shown.
      const inUrl = yield* jetworker("dlq", "list", "--stream", "X_DLQ", "--server", "nats://op:url-pw-never-printed@127.0.0.1:1")
      assert.strictEqual(inUrl.code, 2, inUrl.stdout + inUrl.stderr)
      assert.include(inUrl.stderr, "127.0.0.1:1")
      assert.notInclude(inUrl.stderr, "are not used")
      assert.notInclude(inUrl.stderr, "url-pw-never-printed")
      const env = yield* jetworkerEnv({ NATS_URL: "nats://127.0.0.1:4222, bad host" }, ["contract", "diff", "--contract", ledgerContract])
      assert.strictEqual(env.code, 2, env.stdout + env.stderr)
      assert.include(env.stderr, `jetworker contract diff: NATS_URL "bad host" is not a server URL`)
    }), 60_000)

  it.live("--sequence below 1 is a usage error (exit 2, saying what it takes) for show, replay, purge and recover, before any connection", () =>
    Effect.gen(function*() {
      for (
        const args of [
          ["dlq", "show", "--stream", "X_DLQ", "--sequence", "0"],
          ["dlq", "show", "--stream", "X_DLQ", "--sequence", "-1"],
          ["dlq", "replay", "--stream", "X_DLQ", "--sequence", "0"],
          ["dlq", "purge", "--stream", "X_DLQ", "--sequence", "-5", "--yes"],
          ["dlq", "recover", "--stream", "X", "--consumer", "c", "--sequence", "0"]
        ]
      ) {
        // An unreachable server: a usage error must not need one.
        const run = yield* jetworker(...args, "--server", "nats://127.0.0.1:1")
        assert.strictEqual(run.code, 2, `${args.join(" ")}: ${run.stdout}${run.stderr}`)
        assert.include(run.stderr, "--sequence takes a stream sequence, 1 or more", args.join(" "))
      }
    }), 120_000)

  it.live("a --stream or --consumer that can name no stream or consumer (a dot, a wildcard, white space, empty) is a usage error (exit 2), not a refusal by the server (exit 1)", () =>
    Effect.gen(function*() {
      for (
        const [args, named] of [
          [["dlq", "list", "--stream", "LEDGER.DLQ"], `--stream "LEDGER.DLQ"`],
          [["dlq", "show", "--stream", "", "--sequence", "1"], `--stream ""`],
          [["dlq", "purge", "--stream", "LEDGER DLQ", "--all", "--yes"], `--stream "LEDGER DLQ"`],
          [["dlq", "recover", "--stream", "LEDGER", "--consumer", "ledger.*", "--sequence", "1"], `--consumer "ledger.*"`]
        ] as const
      ) {
        const run = yield* jetworker(...args, "--server", natsUrl)
        assert.strictEqual(run.code, 2, `${args.join(" ")}: ${run.stdout}${run.stderr}`)
        assert.include(run.stderr, `${named} is not a NATS name`, args.join(" "))
      }
    }), 120_000)

  it.live("migrate gives up on a lock another session holds (a long transaction, another run) after 30 seconds: exit 1, nothing applied, what to do; it waited for ever", () =>
    Effect.gen(function*() {
      const schema = yield* TestDatabase.TestSchema
      const sql = yield* SqlClient.SqlClient
      yield* Migrations.run
      const url = `${Redacted.value(schema.url)}?options=${encodeURIComponent(`-csearch_path=${schema.name}`)}`
      // The lock is held for the whole run of the command, in this test's transaction.
      const run = yield* sql.withTransaction(
        Effect.andThen(
          sql`LOCK TABLE jetworker_migrations IN ACCESS EXCLUSIVE MODE`,
          jetworkerEnv({ DATABASE_URL: url }, ["migrate"], 100, "75 seconds")
        )
      )
      assert.strictEqual(run.code, 1, run.stdout + run.stderr)
      assert.include(run.stderr, "jetworker migrations failed: database error (LockTimeoutError)")
      assert.include(run.stderr, "another session held a lock on a table the migrations change for 30 seconds")
      assert.isBelow(run.millis, 65_000)
    }).pipe(Effect.provide(TestDatabase.layer({ maxConnections: 2 }))), 120_000)

  it.live("config check: a bad --ack-wait is reported as the command's own line", () =>
    Effect.gen(function*() {
      const manifest = fileURLToPath(new URL("../examples/ledger/deploy/deployment.yaml", import.meta.url))
      const run = yield* jetworker("config", "check", "--manifest", manifest, "--ack-wait", "soon")
      assert.strictEqual(run.code, 2)
      assert.include(run.stderr, `jetworker config check: --ack-wait "soon" is not a duration`)
    }))

  it.live("--help states the exit codes and how long a command waits for a server that does not answer", () =>
    Effect.gen(function*() {
      const root = yield* jetworker("--help")
      assert.strictEqual(root.code, 0)
      assert.include(root.stdout, "exit 0")
      assert.include(root.stdout, "2 bad arguments or no connection")
      for (
        const args of [
          ["dlq", "replay", "--help"],
          ["migrate", "--help"]
        ]
      ) {
        const run = yield* jetworker(...args)
        assert.strictEqual(run.code, 0, args.join(" "))
        assert.match(run.stdout, /exit 0 /, args.join(" "))
      }
      const list = yield* jetworker("dlq", "list", "--help")
      assert.match(list.stdout, /exit 0 /)
      assert.include(list.stdout, "5 seconds for connecting or for a request, then at most 1 second closing")
    }), 180_000)

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("dlq list --limit 100000 (the most) says that more dead letters match, and where the next ones start", () =>
      Effect.gen(function*() {
        const { jetstream, manager } = yield* NatsConnection.NatsConnection
        const stream = `CLIMORE_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
        const target = DeadLetter.destination(stream, "worker")
        yield* Effect.addFinalizer(() =>
          Effect.forEach([stream, target.stream], (name) => Effect.promise(() => manager.streams.delete(name).catch(() => false)), { discard: true })
        )
        yield* Topology.ensureStream({ name: stream, subjects: [`${stream.toLowerCase()}.>`] })
        yield* Topology.ensureConsumer({ stream, name: "worker", ackWait: "30 seconds", maxDeliver: -1, maxAckPending: 100 })
        const ack = yield* Effect.promise(() => jetstream.publish(`${stream.toLowerCase()}.e`, new TextEncoder().encode(`{"id":"e"}`)))
        yield* DeadLetter.recover({ stream, consumer: "worker", sequence: ack.seq })
        // 100 000 more copies of that dead letter (its headers, without its Nats-Msg-Id, which
        // would make them duplicates): one more than the most a listing shows.
        const first = yield* Effect.promise(() => manager.streams.getMessage(target.stream, { seq: 1 }))
        const copy = natsHeaders()
        for (const [name, values] of first!.header) if (name !== "Nats-Msg-Id") for (const value of values) copy.append(name, value)
        for (let batch = 0; batch < 100; batch++) {
          yield* Effect.promise(() =>
            Promise.all(Array.from({ length: 1000 }, () => jetstream.publish(target.subject, first!.data, { headers: copy, timeout: 30_000 })))
          )
        }
        assert.strictEqual((yield* Effect.promise(() => manager.streams.info(target.stream))).state.messages, 100_001)

        const run = yield* jetworkerEnv({}, ["dlq", "list", "--stream", target.stream, "--limit", "100000", "--server", natsUrl], 20)
        assert.strictEqual(run.code, 0, run.stderr)
        assert.include(run.stdout, "#100000 DeadLettered")
        assert.include(run.stdout, "more dead letters match than --limit 100000; the next from --from 100001")
      }).pipe(Effect.scoped), 240_000)
  })
})

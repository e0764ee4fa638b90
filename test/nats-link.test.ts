/**
 * The NATS link as an operator sees it: a link that freezes without breaking (a stalled proxy, a
 * half-open TCP connection) takes readiness down within three ping intervals and back up once the
 * client has reconnected; a server's error is logged with the error itself.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { NatsConnection } from "@jetworker/nats"
import { JsonLogger } from "@jetworker/node"
import { Eventually, FaultProxy, NatsServer, TestDatabase } from "@jetworker/testing"
import { Clock, Effect, Logger, Redacted } from "effect"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

describe("the NATS link", () => {
  layer(LedgerTestLive, { excludeTestServices: true, timeout: "90 seconds" })((it) => {
    it.effect("BE-SHUT-002: a broker link that goes silent with its socket open takes readiness down within three ping intervals (15 s), says so in the log, and readiness comes back once the link does", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const target = new URL(natsUrl)
        const proxy = yield* FaultProxy.make({ target: { host: target.hostname, port: Number(target.port || 4222) } })
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, databaseUrl, `nats://127.0.0.1:${proxy.port}`),
          HEALTH_HOST: "127.0.0.1"
        })
        yield* W.waitReady(worker)
        yield* proxy.pause
        const pausedAt = yield* Clock.currentTimeMillis
        const down = yield* Eventually.poll(
          "readiness 503 after the broker went silent",
          worker.get("/healthz/ready"),
          (r) => r.status === 503,
          { timeout: "25 seconds", interval: "250 millis" }
        )
        const after = (yield* Clock.currentTimeMillis) - pausedAt
        // Five seconds between pings, two unanswered: noticed at the third tick, 10 to 15 s after
        // the freeze; the slack covers the poll and a loaded machine's late timers.
        assert.isAtMost(after, 17_500, `readiness went down ${after} ms after the link froze`)
        assert.include(down.body, "no answer to pings (stale connection)", down.body)
        yield* Eventually.holds("the stale link in the log", Effect.map(worker.logs, (lines) => lines.some((l) => l.event === "nats.stale" && l.level === "WARN")), "5 seconds")
        yield* proxy.resume
        yield* W.waitReady(worker)
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
      }), 90_000)
  })

  it.live("a server error (-ERR, here a permissions violation) is logged with the error itself, not only that there was one", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make({
        config: `authorization { users = [ { user: "u", password: "p", permissions: { publish: { deny: ["forbidden.>"] } } } ] }`
      })
      const lines: Array<Record<string, unknown>> = []
      const logger = Logger.map(JsonLogger.formatter, (line) => void lines.push(JSON.parse(line) as Record<string, unknown>))
      yield* Effect.gen(function*() {
        const nats = yield* NatsConnection.NatsConnection
        nats.connection.publish("forbidden.x", "hello")
        yield* Eventually.holds("an error line", Effect.sync(() => lines.some((l) => l.event === "nats.error")), "5 seconds")
      }).pipe(
        Effect.provide(NatsConnection.layer({ servers: server.url, user: "u", password: Redacted.make("p") })),
        Effect.provide(Logger.layer([logger]))
      )
      const errorLine = lines.find((l) => l.event === "nats.error")!
      assert.strictEqual(errorLine.level, "WARN")
      assert.match(String(errorLine.message), /Permissions Violation for Publish to "forbidden\.x"/i, JSON.stringify(errorLine))
      assert.notInclude(JSON.stringify(lines), "\"p\"", "no password in the log")
    }).pipe(Effect.scoped), 30_000)

})

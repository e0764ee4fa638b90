/**
 * The worker's connection URLs as an operator gives them (the ledger worker as a child process,
 * real NATS and PostgreSQL): the passwords in `NATS_URL` and `DATABASE_URL` are never printed, and
 * a `DATABASE_URL` that cannot work is refused at once, as an unusable `NATS_URL` is.
 *
 * Failed before: a `DATABASE_URL` that is not a URL (a port `notaport`, `postgresql:/host/db`
 * without `//`, `host:port` without a scheme) reached the driver, which reports it as a
 * connection error: start-up retried it for the whole `STARTUP_TIMEOUT` (30 s here, 60 s by
 * default), logging a `startup.waiting` line per try, and stopped with the next step "the
 * database cannot be reached". Now the ledger checks it when it reads its settings and stops with
 * one `worker.failed` line naming `DATABASE_URL` and what is wrong, never the URL's password.
 *
 * Found sound and kept: the passwords appear in no line and no probe answer through an outage of
 * each dependency.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { ChildWorker, Eventually, FaultProxy, TestDatabase } from "@jetworker/testing"
import { Clock, Effect } from "effect"
import { databaseUrlProblem } from "../examples/ledger/src/LedgerWorker.ts"
import { ledgerStream, workerEnv } from "./support/ledger.ts"
import { databaseUrl, LedgerTestLive, natsUrl } from "./support/services.ts"
import * as W from "./support/worker.ts"

const natsSecret = "Nats5ecretPw"
const pgSecret = "Pg5ecretPw"

describe("the worker's connection URLs", () => {
  it("databaseUrlProblem: names DATABASE_URL and what is wrong, never the password; accepts what the driver reads", () => {
    const refused = [
      [`postgres://postgres:${pgSecret}@127.0.0.1:notaport/test`, "port that is not a number"],
      [`postgresql:/127.0.0.1/test`, "lacks the //"],
      [`127.0.0.1:5432`, "not a PostgreSQL URL"],
      [`http://u:${pgSecret}@host/db`, "not a PostgreSQL URL"],
      [`postgres://u:${pgSecret}/x@host/db`, "percent-encoded"],
      [`postgres://u:${pgSecret}%zz@host/db`, "percent-encoding in its password"],
      [`postgres://u@host:0/db`, "port out of range"],
      [`postgres://u@host/db?port=99999`, "port parameter"],
      [`postgres://u@host/db?sslmode=sometimes`, "sslmode"],
      [`postgres://u@host/db?connect_timeout=soon`, "connect_timeout"]
    ] as const
    for (const [url, problem] of refused) {
      const said = databaseUrlProblem(url)
      assert.include(said, "DATABASE_URL", url)
      assert.include(said, problem, url)
      assert.notInclude(said, pgSecret, url)
    }
    for (const url of ["postgres://postgres@127.0.0.1:5432/test", `postgresql://u:${pgSecret}@[::1]:5433/db?sslmode=require`, "POSTGRES://u@host/db"]) {
      assert.isUndefined(databaseUrlProblem(url), url)
    }
  })

  layer(LedgerTestLive, { excludeTestServices: true, timeout: "120 seconds" })((it) => {
    it.effect("a DATABASE_URL that is not a URL stops start-up at once with worker.failed naming DATABASE_URL and what to fix, not after STARTUP_TIMEOUT, and never prints its password", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const env = { ...workerEnv(settings, schema.name, databaseUrl, natsUrl), ...W.quickBudget, STARTUP_TIMEOUT: "30 seconds" }
        const urls = [`postgres://postgres:${pgSecret}@127.0.0.1:notaport/test`, "postgresql:/127.0.0.1/test", "127.0.0.1:5432"]
        yield* Effect.forEach(urls, (url) =>
          Effect.gen(function*() {
            const start = yield* Clock.currentTimeMillis
            const bad = yield* ChildWorker.spawn({ script: W.fixture, env: { ...env, DATABASE_URL: url } })
            const exit = yield* bad.waitForExit("45 seconds")
            const took = (yield* Clock.currentTimeMillis) - start
            const lines = [...(yield* bad.lines), ...(yield* bad.stderr)]
            const logs = W.jsonLines(lines)
            const waiting = W.withMessage(logs, "startup.waiting")
            const failed = W.withMessage(logs, "worker.failed")
            const detail = `${url}: exit ${JSON.stringify(exit)} after ${took} ms; ${waiting.length} startup.waiting lines, ` +
              `first: ${JSON.stringify(waiting[0])}; worker.failed: ${JSON.stringify(failed.map((l) => [l.error, l.nextStep]))}`
            assert.deepStrictEqual(exit, { code: 1, signal: null }, detail)
            assert.strictEqual(failed.length, 1, detail)
            assert.include(String(failed[0]!.error), "DATABASE_URL", detail)
            assert.include(String(failed[0]!.error), "write it as postgres://", detail)
            assert.notInclude(String(failed[0]!.nextStep), "cannot be reached", detail)
            // It will never parse: waiting for it would waste the whole start-up timeout.
            assert.strictEqual(waiting.length, 0, detail)
            assert.isBelow(took, 10_000, detail)
            assert.deepStrictEqual(lines.filter((line) => line.includes(pgSecret)), [], `${pgSecret} printed`)
          }), { concurrency: "unbounded", discard: true })
      }))

    it.effect("passwords in NATS_URL and DATABASE_URL appear in no line and no probe answer, through an outage of each", () =>
      Effect.gen(function*() {
        const { settings } = yield* ledgerStream()
        const schema = yield* TestDatabase.TestSchema
        const nats = new URL(natsUrl)
        const pg = new URL(databaseUrl)
        const natsProxy = yield* FaultProxy.make({ target: { host: nats.hostname, port: Number(nats.port || 4222) } })
        const pgProxy = yield* FaultProxy.make({ target: { host: pg.hostname, port: Number(pg.port || 5432) } })
        // The servers under test do not check passwords (nats without auth, PostgreSQL trust).
        const pgUrl = new URL(databaseUrl)
        pgUrl.hostname = "127.0.0.1"
        pgUrl.port = String(pgProxy.port)
        pgUrl.username = pgUrl.username || "postgres"
        pgUrl.password = pgSecret
        const worker = yield* W.start({
          ...workerEnv(settings, schema.name, pgUrl.toString(), `nats://jw:${natsSecret}@127.0.0.1:${natsProxy.port}`),
          ...W.quickBudget
        })
        yield* W.waitReady(worker)
        const bodies: Array<string> = []
        for (const proxy of [pgProxy, natsProxy]) {
          yield* proxy.cut
          const down = yield* Eventually.poll("readiness down", worker.get("/healthz/ready"), (r) => r.status === 503, {
            timeout: "30 seconds",
            interval: "100 millis"
          })
          bodies.push(down.body)
          bodies.push((yield* worker.get("/metrics")).body)
          yield* proxy.restore
          yield* W.waitReady(worker, "30 seconds")
        }
        yield* worker.child.kill("SIGTERM")
        assert.deepStrictEqual(yield* worker.child.waitForExit("15 seconds"), { code: 0, signal: null })
        const everything = [...(yield* worker.child.lines), ...(yield* worker.child.stderr), ...bodies]
        const logs = yield* worker.logs
        assert.isAbove(logs.filter((l) => String(l.event).startsWith("dependency.")).length, 0)
        for (const secret of [natsSecret, pgSecret]) {
          assert.deepStrictEqual(everything.filter((line) => line.includes(secret)), [], `${secret} printed`)
        }
      }).pipe(Effect.scoped))
  })
})

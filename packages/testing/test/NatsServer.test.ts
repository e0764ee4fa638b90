import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Eventually from "../src/Eventually.ts"
import * as NatsServer from "../src/NatsServer.ts"

const bound = "10 seconds"

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/**
 * A fake `nats-server` in a temporary directory: it records its pid (and, when given `-c`, its
 * configuration and, else, its store `-sd`), says it is ready (unless `ready: false`) and sleeps;
 * `ignoreTerm` makes it ignore SIGTERM. The scope's end kills whatever of its processes still runs and removes the
 * directory.
 */
const fakeBinary = (options: { readonly ignoreTerm: boolean; readonly ready?: boolean }) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const dir = mkdtempSync(join(tmpdir(), "jw-fake-nats-"))
      const binary = join(dir, "nats-server")
      writeFileSync(
        binary,
        [
          "#!/bin/sh",
          options.ignoreTerm ? "trap '' TERM" : "",
          `echo $$ >> "${dir}/pids"`,
          `if [ "$1" = "-c" ]; then cp "$2" "${dir}/conf.$$"; fi`,
          `if [ "$6" = "-sd" ]; then echo "$7" > "${dir}/store.$$"; fi`,
          options.ready === false ? "" : "echo '[1] Server is ready' >&2",
          // exec: the pid recorded is the sleeping process's, which keeps the ignored SIGTERM.
          "exec sleep 60"
        ].join("\n")
      )
      chmodSync(binary, 0o755)
      const pids = (): ReadonlyArray<number> => {
        const file = join(dir, "pids")
        return existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l !== "").map(Number) : []
      }
      const configs = (): ReadonlyArray<string> =>
        readdirSync(dir).filter((f) => f.startsWith("conf.")).map((f) => readFileSync(join(dir, f), "utf8"))
      const store = (pid: number): string => readFileSync(join(dir, `store.${pid}`), "utf8").trim()
      return { dir, binary, pids, configs, store }
    }),
    (fake) =>
      Effect.sync(() => {
        for (const pid of fake.pids()) {
          try {
            process.kill(pid, "SIGKILL")
          } catch {
            // already gone
          }
        }
        rmSync(fake.dir, { recursive: true, force: true })
      })
  )

const accepts = (port: number) =>
  Effect.callback<boolean>((resume) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed(true))
    })
    socket.once("error", () => resume(Effect.succeed(false)))
  })

describe("NatsServer", () => {
  it.live("stop(SIGTERM) kills a server that ignores SIGTERM once the wait runs out", () =>
    Effect.gen(function*() {
      const fake = yield* fakeBinary({ ignoreTerm: true })
      const scope = yield* Scope.make()
      const server = yield* NatsServer.make({ binary: fake.binary, stopTimeout: "500 millis" }).pipe(Scope.provide(scope))
      const [pid] = fake.pids()
      const store = fake.store(pid!)
      assert.isTrue(alive(pid!))
      yield* server.stop("SIGTERM").pipe(Effect.timeout("20 seconds"))
      assert.isFalse(alive(pid!), "stop(SIGTERM) left a server that ignores SIGTERM running")
      yield* Scope.close(scope, Exit.void)
      assert.isFalse(existsSync(store))
    }), { timeout: 30_000 })

  it.live("the scope's end kills the server even after an interrupted stop(SIGTERM)", () =>
    Effect.gen(function*() {
      const fake = yield* fakeBinary({ ignoreTerm: true })
      const scope = yield* Scope.make()
      const server = yield* NatsServer.make({ binary: fake.binary }).pipe(Scope.provide(scope))
      const [pid] = fake.pids()
      const store = fake.store(pid!)
      const stopping = yield* Effect.forkChild(server.stop("SIGTERM"))
      yield* Effect.sleep("100 millis")
      yield* Fiber.interrupt(stopping)
      yield* Scope.close(scope, Exit.void).pipe(Effect.timeout(bound))
      assert.isFalse(alive(pid!), "the scope's end left the server running")
      assert.isFalse(existsSync(store))
    }), { timeout: 30_000 })

  it.live("start starts a server again after it died on its own", () =>
    Effect.gen(function*() {
      const fake = yield* fakeBinary({ ignoreTerm: false })
      const server = yield* NatsServer.make({ binary: fake.binary })
      const [first] = fake.pids()
      process.kill(first!, "SIGKILL")
      yield* Eventually.poll("the server's exit", Effect.sync(() => alive(first!)), (a) => !a, { timeout: bound })
      yield* server.start.pipe(Effect.timeout(bound))
      const pids = fake.pids()
      assert.strictEqual(pids.length, 2, "start did not start the dead server again")
      assert.isTrue(alive(pids[1]!))
    }), { timeout: 30_000 })

  it.live("a server not ready in time is killed, and make fails", () =>
    Effect.gen(function*() {
      const fake = yield* fakeBinary({ ignoreTerm: true, ready: false })
      const error = yield* Effect.flip(Effect.scoped(NatsServer.make({ binary: fake.binary, readyTimeout: "300 millis" })))
      assert.strictEqual(error._tag, "NatsServerError")
      assert.include(error.message, "was not ready within")
      const [pid] = fake.pids()
      assert.isFalse(alive(pid!), "the server that was not ready still runs")
    }), { timeout: 30_000 })

  it.live("a real server stops, starts and restarts on its port", () =>
    Effect.gen(function*() {
      const server = yield* NatsServer.make()
      assert.isTrue(yield* accepts(server.port))
      yield* server.stop("SIGTERM").pipe(Effect.timeout("20 seconds"))
      assert.isFalse(yield* accepts(server.port))
      yield* server.start.pipe(Effect.timeout("20 seconds"))
      assert.isTrue(yield* accepts(server.port))
      yield* server.restart("SIGKILL").pipe(Effect.timeout("20 seconds"))
      assert.isTrue(yield* accepts(server.port))
    }), { timeout: 60_000 })

  it.live("the client and route ports of a cluster's nodes are distinct", () =>
    Effect.gen(function*() {
      // A collision is random (about 2% for 18 ports released one by one), so try many clusters.
      for (let i = 0; i < 100; i++) {
        const ports = yield* Effect.scoped(Effect.gen(function*() {
          const fake = yield* fakeBinary({ ignoreTerm: false })
          yield* NatsServer.cluster({ binary: fake.binary, size: 9 })
          return fake.configs().flatMap((c) => [...c.matchAll(/listen: 127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1])))
        }))
        assert.strictEqual(ports.length, 18)
        assert.strictEqual(new Set(ports).size, 18, `ports collide in cluster ${i}: ${ports.join(", ")}`)
      }
    }), { timeout: 120_000 })
})

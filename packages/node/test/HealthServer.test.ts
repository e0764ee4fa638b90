import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { HealthServer } from "@jetworker/node"
import { Effect, Metric, Result } from "effect"
import v8 from "node:v8"

const get = (port: number, path: string, method = "GET") =>
  Effect.promise(async () => {
    const response = await fetch(`http://127.0.0.1:${port}${path}`, { method, signal: AbortSignal.timeout(5_000) })
    return { status: response.status, type: response.headers.get("content-type"), body: await response.text() }
  })

/** A health server on a free port, reporting a managed lifecycle's readiness. */
const serving = Effect.gen(function*() {
  const lifecycle = yield* Lifecycle.makeManaged({
    budget: Result.getOrThrow(Lifecycle.makeBudget()),
    startupTimeout: "10 seconds"
  })
  const server = yield* HealthServer.make({ port: 0, host: "127.0.0.1", readiness: lifecycle.readiness })
  return { lifecycle, server }
})

describe("HealthServer", () => {
  it.live("serves readiness from the lifecycle: 503 while starting, 200 when running with its parts up, 503 once stopping", () =>
    Effect.gen(function*() {
      const { lifecycle, server } = yield* serving
      assert.isAbove(server.port, 0)
      const starting = yield* get(server.port, "/healthz/ready")
      assert.strictEqual(starting.status, 503)
      assert.deepInclude(JSON.parse(starting.body), { ready: false, phase: "starting" })
      yield* lifecycle.started
      const consumer = yield* lifecycle.component("c", "consumer")
      yield* consumer.up
      const running = yield* get(server.port, "/healthz/ready")
      assert.strictEqual(running.status, 200)
      assert.strictEqual(running.type, "application/json")
      yield* lifecycle.begin
      assert.strictEqual((yield* get(server.port, "/healthz/ready")).status, 503)
      assert.strictEqual((yield* get(server.port, "/healthz/live")).status, 200, "stopping is not wedged")
    }))

  it.live("serves metrics as Prometheus text, 404 for other paths and 405 for other methods", () =>
    Effect.gen(function*() {
      const { server } = yield* serving
      yield* Metric.update(Metric.counter("health_server_test_counter", { incremental: true }), 3)
      const metrics = yield* get(server.port, "/metrics")
      assert.strictEqual(metrics.status, 200)
      assert.match(metrics.type ?? "", /^text\/plain; version=0\.0\.4/)
      assert.include(metrics.body, "health_server_test_counter 3\n")
      assert.strictEqual((yield* get(server.port, "/nope")).status, 404)
      assert.strictEqual((yield* get(server.port, "/healthz/ready", "POST")).status, 405)
    }))

  it.live("/metrics also reports the process's memory, read at the scrape, and V8's heap bound", () =>
    Effect.gen(function*() {
      const { server } = yield* serving
      const before = process.memoryUsage().rss
      const { body } = yield* get(server.port, "/metrics")
      const after = process.memoryUsage().rss
      const gauge = (name: string) => {
        assert.include(body, `# TYPE ${name} gauge\n`)
        const line = body.split("\n").find((l) => l.startsWith(`${name} `))
        assert.isDefined(line, `${name} in ${body}`)
        return Number(line!.slice(name.length + 1))
      }
      const rss = gauge("process_resident_memory_bytes")
      // Read during the request: between this process's own readings around it (within 64 MiB).
      assert.isAbove(rss, Math.min(before, after) - 64 * 2 ** 20)
      assert.isBelow(rss, Math.max(before, after) + 64 * 2 ** 20)
      const used = gauge("nodejs_heap_size_used_bytes")
      assert.isAbove(used, 0)
      assert.isAtMost(used, gauge("nodejs_heap_size_total_bytes"))
      assert.isAtLeast(gauge("nodejs_external_memory_bytes"), 0)
      assert.strictEqual(gauge("nodejs_heap_size_limit_bytes"), v8.getHeapStatistics().heap_size_limit)
    }))

  it.live("/metrics leaves a memory family out when an Effect metric already has its name, so no name is declared twice", () =>
    Effect.gen(function*() {
      const { server } = yield* serving
      yield* Metric.update(Metric.gauge("nodejs.external_memory_bytes"), 7)
      const { body } = yield* get(server.port, "/metrics")
      const declared = body.split("\n").filter((l) => l.startsWith("# TYPE nodejs_external_memory_bytes "))
      assert.strictEqual(declared.length, 1, body)
      assert.include(body, "\nnodejs_external_memory_bytes 7\n")
      assert.include(body, "# TYPE process_resident_memory_bytes gauge\n", "the other families are still there")
      assert.strictEqual((yield* get(server.port, "/healthz/ready", "POST")).status, 405)
    }))
})

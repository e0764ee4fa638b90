import { assert, describe, it } from "@effect/vitest"
import { Lifecycle } from "@jetworker/core"
import { HealthServer } from "@jetworker/node"
import { Effect, Metric, Result } from "effect"

const get = (port: number, path: string, method = "GET") =>
  Effect.promise(async () => {
    const response = await fetch(`http://127.0.0.1:${port}${path}`, { method, signal: AbortSignal.timeout(5_000) })
    return { status: response.status, type: response.headers.get("content-type"), body: await response.text() }
  })

describe("HealthServer", () => {
  it.live("serves readiness from the lifecycle: 503 while starting, 200 when running with its parts up, 503 once stopping", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.makeManaged({
        budget: Result.getOrThrow(Lifecycle.makeBudget()),
        startupTimeout: "10 seconds"
      })
      const server = yield* HealthServer.make({ port: 0, host: "127.0.0.1", readiness: lifecycle.readiness })
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
      const lifecycle = yield* Lifecycle.makeManaged({
        budget: Result.getOrThrow(Lifecycle.makeBudget()),
        startupTimeout: "10 seconds"
      })
      const server = yield* HealthServer.make({ port: 0, host: "127.0.0.1", readiness: lifecycle.readiness })
      yield* Metric.update(Metric.counter("health_server_test_counter", { incremental: true }), 3)
      const metrics = yield* get(server.port, "/metrics")
      assert.strictEqual(metrics.status, 200)
      assert.match(metrics.type ?? "", /^text\/plain; version=0\.0\.4/)
      assert.include(metrics.body, "health_server_test_counter 3\n")
      assert.strictEqual((yield* get(server.port, "/nope")).status, 404)
      assert.strictEqual((yield* get(server.port, "/healthz/ready", "POST")).status, 405)
    }))
})

/**
 * `HEALTH_MAX_CONNECTIONS` reaches the worker's health server: with a limit of 1, a connection
 * held by a client that sends half a request leaves none for a probe, which is closed at once,
 * unanswered.
 */
import { assert, describe, it } from "@effect/vitest"
import { Worker } from "@jetworker/node"
import { Duration, Effect, Schedule } from "effect"
import { connect } from "node:net"
import { capturingStdoutWith } from "./support/stdout.ts"

/** What a connection that sent `text` received until it was closed, at most `limitMs`; `undefined` if it stayed open. */
const received = (port: number, text: string, limitMs: number) =>
  Effect.callback<string | undefined>((resume) => {
    const chunks: Array<Buffer> = []
    const socket = connect({ port, host: "127.0.0.1" })
    const finish = (closed: boolean) => {
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed(closed ? Buffer.concat(chunks).toString("latin1") : undefined))
    }
    const timer = setTimeout(() => finish(false), limitMs)
    socket.on("connect", () => socket.write(text))
    socket.on("data", (chunk) => chunks.push(chunk))
    socket.once("close", () => finish(true))
    socket.on("error", () => {})
  })

describe("Worker", () => {
  it.live("HEALTH_MAX_CONNECTIONS bounds the health server's connections", () =>
    Effect.gen(function*() {
      const seen: { refused?: string | undefined; served?: string | undefined } = {}
      const { lines, result } = yield* capturingStdoutWith((linesSoFar) =>
        Worker.run(
          Effect.gen(function*() {
            const listening = yield* linesSoFar.pipe(
              Effect.map((all) => all.find((l) => l.message === "health.listening")),
              Effect.repeat({ until: (line) => line !== undefined, schedule: Schedule.spaced("20 millis"), times: 250 })
            )
            const port = Number(listening?.port)
            // Holds the one connection: its headers never end.
            const holder = connect({ port, host: "127.0.0.1" })
            holder.on("error", () => {})
            yield* Effect.callback<void>((resume) => {
              holder.on("connect", () => {
                holder.write("GET /healthz/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                resume(Effect.void)
              })
            })
            // Accepted in order: the holder is counted before the probe.
            const probe = "GET /healthz/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            seen.refused = yield* received(port, probe, 2_000)
            holder.destroy()
            seen.served = yield* received(port, probe, 5_000).pipe(
              Effect.repeat({ until: (text) => text?.startsWith("HTTP/1.1 200") === true, schedule: Schedule.spaced("50 millis"), times: 40 })
            )
          }),
          {
            settings: {
              healthPort: 0,
              healthHost: "127.0.0.1",
              healthMaxConnections: 1,
              budget: Duration.seconds(3),
              readinessGrace: Duration.zero,
              close: Duration.millis(500),
              telemetry: Duration.millis(500),
              reserve: Duration.millis(500)
            },
            readyWhen: "started"
          }
        )
      )
      assert.strictEqual(result, Worker.exitCodes.success, JSON.stringify(lines))
      assert.isDefined(seen.refused, "the probe past the limit was closed within 2 s")
      assert.notMatch(seen.refused ?? "", /^HTTP/, `a connection past the limit was served: ${seen.refused}`)
      assert.match(seen.served ?? "", /^HTTP\/1\.1 200/, "served again once the holder has gone")
    }))
})

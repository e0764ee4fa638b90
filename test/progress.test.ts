/**
 * Visible progress: without debug logs, a consumer's INFO lines say that work flows (a periodic
 * summary of outcomes by tag, in flight, left on the broker) and when it has drained the backlog.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Consumer, Envelope } from "@jetworker/core"
import { JetStreamSource } from "@jetworker/nats"
import { Eventually, OutcomeLog, TestStream } from "@jetworker/testing"
import { Effect, Fiber, Logger, Schema } from "effect"
import { NatsLive } from "./support/services.ts"

const Event = Envelope.schema("test.job", Schema.Struct({ n: Schema.Number }))
const job = (id: string, n: number) => JSON.stringify({ id, type: "test.job", time: new Date().toISOString(), data: { n } })

describe("progress lines", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a periodic INFO summary counts outcomes by tag, and a line says when the backlog is drained", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const log = yield* OutcomeLog.make
        const lines: Array<{ readonly level: string; readonly text: string }> = []
        const capture = Logger.make(({ logLevel, message }) => {
          const parts = Array.isArray(message) ? message : [message]
          lines.push({ level: String(logLevel), text: String(parts[0]) })
        })
        for (let n = 1; n <= 5; n++) yield* stream.publish("a", job(`j${n}`, n), `j${n}`)
        yield* stream.publish("a", "not json", "bad")
        const consumer = Consumer.make({
          name: stream.consumer,
          source: JetStreamSource.make({ stream: stream.stream, consumer: stream.consumer }),
          schema: Event,
          handle: () => Effect.void,
          classify: {},
          progressInterval: "300 millis",
          onOutcome: log.record
        })
        const fiber = yield* Effect.forkChild(Consumer.run(consumer).pipe(Effect.provide(Logger.layer([capture]))))
        yield* log.waitUntil((all) => all.length >= 6, "15 seconds")
        const summary = Effect.sync(() => lines.find((line) => line.text.includes(" in the last ")))
        const found = yield* Eventually.poll("the progress line", summary, (line) => line !== undefined, { timeout: "5 seconds" })
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(found!.level, "Info")
        assert.include(found!.text, `consumer ${stream.consumer}: 5 Committed, 1 Rejected in the last 300ms`)
        // After the last outcome line, once.
        const drained = lines.filter((line) => line.text.includes("drained its backlog"))
        assert.isAbove(lines.indexOf(drained[0]!), lines.findIndex((line) => line.text.startsWith("Rejected")))
        assert.deepStrictEqual(drained.map((line) => [line.level, line.text]), [[
          "Info",
          `consumer ${stream.consumer} drained its backlog (6 settled: 5 Committed, 1 Rejected)`
        ]])
        // Every summary knows what is left on the broker, also after the drained line.
        for (const line of lines.filter((l) => l.text.includes(" in the last "))) assert.match(line.text, /in flight, \d+ left on the broker$/)
      }))
  })
})

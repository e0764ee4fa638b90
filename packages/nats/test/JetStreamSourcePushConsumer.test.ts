/**
 * A source opening on a push consumer (one with a `deliver_subject`): jetworker pulls, and nats.js
 * cannot pull from it. The source refuses to open (`ContractMismatch`) saying what to do.
 *
 * Failed before: the source's open checks did not look at `deliver_subject` (only the contract
 * check did), so it opened, and the first pull failed with nats.js's "not a pull consumer".
 */
import { assert, describe, layer } from "@effect/vitest"
import { Contract, JetStreamSource, NatsConnection } from "@jetworker/nats"
import { TestStream } from "@jetworker/testing"
import { AckPolicy } from "@nats-io/jetstream"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

describe("JetStreamSource on a push consumer", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("refuses to open, naming the deliver subject and the way out", () =>
      Effect.gen(function*() {
        const stream = yield* TestStream.make()
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() =>
          manager.consumers.add(stream.stream, {
            durable_name: "pushed",
            ack_policy: AckPolicy.Explicit,
            max_deliver: 10,
            deliver_subject: `pushed-deliveries.${stream.stream}`
          })
        )
        const error = yield* Effect.flip(
          JetStreamSource.make({ stream: stream.stream, consumer: "pushed", captureMaxDeliveries: false })
            .open({ consumer: "pushed", prefetch: 4, attempts: 3, ordering: "Unordered" })
            .pipe(Effect.timeout("20 seconds"), Effect.scoped)
        )
        assert.strictEqual(error._tag === "SourceError" ? error.reason : `${error._tag}: ${error.message}`, "ContractMismatch")
        assert.include(error.message, "is a push consumer (deliver_subject")
        assert.include(error.message, "declare it again as a pull consumer")
      }))

    it("the contract check reports a push consumer once", () => {
      const findings = Contract.consumerFindings(
        "consumer S/pushed",
        { ack_policy: AckPolicy.Explicit, max_deliver: -1, max_ack_pending: 16, deliver_subject: "s.deliver" },
        { attempts: 3, concurrency: 4, prefetch: 4 }
      )
      assert.deepStrictEqual(findings.map((f) => [f.check, f.severity]), [["deliver_subject", "error"]])
    })
  })
})

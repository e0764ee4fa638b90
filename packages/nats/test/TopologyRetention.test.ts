/**
 * A live stream's retention, against the real server (nats-server 2.9 cannot change it in place:
 * "stream configuration update can not change retention policy", 10052).
 *
 * Before: retention was never compared. On a `workqueue` stream (created by an operator or another
 * tool) `ensureStream` said nothing, `Contract.plan` planned nothing and `Contract.check` found
 * nothing, while the server deletes each message once it is acked or terminated (dead-lettered) and
 * refuses a second consumer ("multiple non-filtered consumers not allowed on workqueue stream");
 * an `interest` stream does not even store what is published while no consumer exists.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
import { RetentionPolicy } from "@nats-io/jetstream"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A throw-away stream name and subjects, deleted with the scope. */
const names = Effect.gen(function*() {
  const { manager } = yield* NatsConnection.NatsConnection
  const id = crypto.randomUUID().replaceAll("-", "").slice(0, 12)
  const name = `TRT_${id}`
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, subjects: [`trt_${id}.>`] }
})

describe("Topology and a stream's retention", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("a live workqueue stream is refused by ensureStream (retention left out means limits), planned as a refusal, not applied, and an error finding of Contract.check", () =>
      Effect.gen(function*() {
        const declared = yield* names
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.add({ ...declared, retention: RetentionPolicy.Workqueue }))

        const error = yield* Effect.flip(Topology.ensureStream(declared))
        assert.deepInclude(error, { reason: "ApiError", operation: `ensure stream ${declared.name}` })
        for (const part of [`stream ${declared.name}`, "retention workqueue", "limits", "cannot change in place", "retention: \"workqueue\""]) {
          assert.include(error.message, part)
        }

        const contract: Contract.Contract = { version: "1", ownership: "service", stream: declared, consumers: [] }
        const planned = yield* Contract.plan(contract)
        assert.deepStrictEqual(planned.map((change) => [change.action, change.setting, change.live, change.wanted]), [
          ["refuse", "retention", "workqueue", "limits"]
        ])
        const refused = yield* Effect.flip(Contract.apply(contract))
        assert.deepInclude(refused, { _tag: "ContractError", reason: "Refused" })
        const findings = yield* Contract.check(contract)
        assert.deepStrictEqual(findings.map((finding) => [finding.severity, finding.check]), [["error", "retention"]])
        assert.include(findings[0]!.message, "workqueue")

        const live = yield* Effect.promise(() => manager.streams.info(declared.name))
        assert.strictEqual(live.config.retention, RetentionPolicy.Workqueue)
      }).pipe(Effect.scoped))

    it.effect("a declared retention is created, and kept when the live stream has it", () =>
      Effect.gen(function*() {
        const declared = yield* names
        const created = yield* Topology.ensureStream({ ...declared, retention: "interest" })
        assert.strictEqual(created.config.retention, RetentionPolicy.Interest)
        const again = yield* Topology.ensureStream({ ...declared, retention: "interest" })
        assert.strictEqual(again.config.retention, RetentionPolicy.Interest)
        const contract: Contract.Contract = { version: "1", ownership: "service", stream: { ...declared, retention: "interest" }, consumers: [] }
        assert.deepStrictEqual(yield* Contract.check(contract), [])
        // Left out, the declaration stands for limits, which this stream does not have.
        const error = yield* Effect.flip(Topology.ensureStream(declared))
        assert.include(error.message, "retention interest")
      }).pipe(Effect.scoped))

    it.effect("a stream created without a declared retention has limits, and ensureStream keeps it", () =>
      Effect.gen(function*() {
        const declared = yield* names
        const created = yield* Topology.ensureStream(declared)
        assert.strictEqual(created.config.retention, RetentionPolicy.Limits)
        assert.deepStrictEqual(Topology.streamChanges(declared, created.config), [])
        assert.deepStrictEqual(Topology.streamChanges({ ...declared, retention: "limits" }, created.config), [])
      }).pipe(Effect.scoped))

    it.effect("a contract file declares the retention; another value is refused, naming the field", () =>
      Effect.gen(function*() {
        const file = (retention: string) =>
          JSON.stringify({ version: "1", ownership: "service", stream: { name: "ORDERS", subjects: ["orders.>"], retention }, consumers: [] })
        const contract = yield* Contract.fromJson(file("workqueue"))
        assert.strictEqual(contract.stream.retention, "workqueue")
        const error = yield* Effect.flip(Contract.fromJson(file("queue")))
        assert.deepInclude(error, { reason: "Unreadable" })
        assert.include(error.message, "stream.retention")
      }))

    it.effect("a second unfiltered consumer of a live workqueue stream is refused naming the retention, the live consumer and what to do", () =>
      Effect.gen(function*() {
        const declared = yield* names
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.promise(() => manager.streams.add({ ...declared, retention: RetentionPolicy.Workqueue }))
        yield* Topology.ensureConsumer({ stream: declared.name, name: "first" })

        const error = yield* Effect.flip(Topology.ensureConsumer({ stream: declared.name, name: "second" }))
        assert.deepInclude(error, { reason: "ApiError", operation: `ensure consumer ${declared.name}/second` })
        for (
          const part of [
            `stream ${declared.name} has retention workqueue`,
            "consumer second beside its live consumers (first)",
            "multiple non-filtered consumers not allowed on workqueue stream",
            "filter subject (filterSubject)",
            "retention \"limits\" or \"interest\""
          ]
        ) {
          assert.include(error.message, part)
        }
        // A filter of its own is taken.
        const filtered = yield* Effect.flip(Topology.ensureConsumer({ stream: declared.name, name: "third", filterSubject: `${declared.subjects[0]!.slice(0, -2)}.a` }))
        assert.include(filtered.message, "retention workqueue", "beside an unfiltered consumer, a filtered one is refused too (its subjects overlap)")
      }).pipe(Effect.scoped))
  })
})

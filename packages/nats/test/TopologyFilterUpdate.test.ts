/**
 * A live durable consumer's filter changed by an update. nats-server before 2.10 (checked on
 * 2.9.10) keeps a consumer's "filter has a wildcard" flag from its creation: an update that gives
 * a consumer without a filter, or with a literal one, a wildcard filter (`x.>`, `x.*`) leaves it
 * comparing subjects literally with the pattern, and it delivers nothing more (no error, its
 * pending count 0). A literal filter, a wildcard set at creation, or one wildcard for another works.
 *
 * Before: `Topology.consumerChanges` made such a change an in-place `update`, so `Contract.apply`
 * and `Topology.ensureConsumer` silently stopped the consumer. Now, on a server older than 2.10.0
 * (or of unknown version), they refuse it before anything is sent, saying to delete the consumer
 * and declare it again (its delivery state is lost) or to declare a new consumer.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
import { AckPolicy, type ConsumerConfig, DeliverPolicy, jetstream, ReplayPolicy } from "@nats-io/jetstream"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

/** A stream of this run capturing `<prefix>.>`, deleted with the test's scope. */
const freshStream = Effect.gen(function*() {
  const name = `FILTER_UPDATE_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6).toString(36)}`.toUpperCase()
  const prefix = name.toLowerCase()
  const { manager } = yield* NatsConnection.NatsConnection
  yield* Effect.promise(() => manager.streams.add({ name, subjects: [`${prefix}.>`] }))
  yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
  return { name, prefix }
})

/** Publishes one message to `subject` (confirmed by the stream). */
const publish = (subject: string, body: string) =>
  Effect.gen(function*() {
    const { jetstream: js } = yield* NatsConnection.NatsConnection
    yield* Effect.promise(() => js.publish(subject, body))
  })

/** The next message of durable `consumer` (acked), or `undefined` when none comes within 1.5 s. */
const next = (stream: string, consumer: string) =>
  Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const msg = yield* Effect.promise(async () => {
      const pull = await jetstream(connection).consumers.get(stream, consumer)
      return pull.next({ expires: 1_500 })
    })
    if (msg === null) return undefined
    yield* Effect.promise(() => msg.ackAck())
    return msg.string()
  })

const live: ConsumerConfig = {
  durable_name: "shipper",
  ack_policy: AckPolicy.Explicit,
  ack_wait: 30_000_000_000,
  max_deliver: -1,
  max_ack_pending: 1000,
  deliver_policy: DeliverPolicy.All,
  replay_policy: ReplayPolicy.Instant
} as ConsumerConfig

describe("Topology: a filter update that nats-server before 2.10 applies by stopping the consumer", () => {
  it("consumerChanges refuses a wildcard filter for a consumer without one (or with a literal one) on a server older than 2.10.0 or unknown; allows it on 2.10.0, and allows the changes old servers apply", () => {
    const declared: Topology.ConsumerOptions = { stream: "ORDERS", name: "shipper", ackWait: "30 seconds", filterSubject: "orders.eu.>" }
    for (const version of ["2.9.10", "2.9.25", undefined]) {
      for (const from of [undefined, "orders.eu.berlin"]) {
        const changes = Topology.consumerChanges(declared, { ...live, ...(from === undefined ? {} : { filter_subject: from }) }, version)
        assert.deepStrictEqual(changes.map((c) => [c.action, c.setting, c.live, c.wanted]), [
          ["refuse", "filter_subject", from ?? "none", "orders.eu.>"]
        ], `${version} from ${from}`)
        const message = changes[0]!.message
        assert.include(message, "consumer ORDERS/shipper")
        assert.include(message, `the server is ${version ?? "unknown"}`)
        assert.include(message, "delivers nothing more")
        assert.include(message, "nats consumer rm ORDERS shipper")
        assert.include(message, "delivery state")
        assert.include(message, "or declare a new consumer")
      }
    }
    // Where the server applies it (2.10.0 and later), it is an update.
    assert.deepStrictEqual(Topology.consumerChanges(declared, live, "2.10.0").map((c) => [c.action, c.setting]), [["update", "filter_subject"]])
    // What an old server applies: a literal filter, a wildcard for a wildcard, a literal for a wildcard.
    const updates = (wanted: string, from: string | undefined) =>
      Topology.consumerChanges({ ...declared, filterSubject: wanted }, { ...live, ...(from === undefined ? {} : { filter_subject: from }) }, "2.9.10")
        .map((c) => [c.action, c.setting])
    assert.deepStrictEqual(updates("orders.eu.berlin", undefined), [["update", "filter_subject"]])
    assert.deepStrictEqual(updates("orders.eu.berlin", "orders.eu.paris"), [["update", "filter_subject"]])
    assert.deepStrictEqual(updates("orders.>", "orders.eu.*"), [["update", "filter_subject"]])
    assert.deepStrictEqual(updates("orders.eu.berlin", "orders.eu.>"), [["update", "filter_subject"]])
    assert.deepStrictEqual(updates("orders.eu.>", "orders.eu.>"), [])
  })

  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("on this server: an update giving a live durable a wildcard filter stops its delivery, a literal one or a wildcard set at creation does not", () =>
      Effect.gen(function*() {
        const { connection, manager } = yield* NatsConnection.NatsConnection
        const works = Topology.versionAtLeast(connection.info!.version, "2.10.0")

        // Each case on a stream of its own: a consumer reads one message, has its filter updated,
        // and is pulled after one more message.
        const afterUpdate = (from: string | undefined, to: string, subject: string) =>
          Effect.gen(function*() {
            const { name, prefix } = yield* freshStream
            yield* Effect.promise(() =>
              manager.consumers.add(name, {
                durable_name: "c",
                ack_policy: AckPolicy.Explicit,
                ...(from === undefined ? {} : { filter_subject: `${prefix}.${from}` })
              })
            )
            yield* publish(`${prefix}.${subject}`, "1")
            assert.strictEqual(yield* next(name, "c"), "1", `${from} -> ${to}: before the update`)
            yield* Effect.promise(() => manager.consumers.update(name, "c", { filter_subject: `${prefix}.${to}` }))
            yield* publish(`${prefix}.${subject}`, "2")
            return yield* next(name, "c")
          })
        const stopped = [
          yield* afterUpdate(undefined, "a.>", "a.b"),
          yield* afterUpdate(undefined, "a.*", "a.b"),
          yield* afterUpdate("a.b", "a.>", "a.b")
        ]
        assert.deepStrictEqual(stopped, works ? ["2", "2", "2"] : [undefined, undefined, undefined], `server ${connection.info!.version}`)
        const applied = [
          yield* afterUpdate(undefined, "a.b", "a.b"),
          yield* afterUpdate("a.*", "a.>", "a.b"),
          yield* afterUpdate("a.>", "a.b", "a.b")
        ]
        assert.deepStrictEqual(applied, ["2", "2", "2"])
        // Created with the wildcard, the same filter works on every server.
        const { name, prefix } = yield* freshStream
        yield* Effect.promise(() => manager.consumers.add(name, { durable_name: "c", ack_policy: AckPolicy.Explicit, filter_subject: `${prefix}.a.>` }))
        yield* publish(`${prefix}.a.b`, "created")
        assert.strictEqual(yield* next(name, "c"), "created")
      }).pipe(Effect.scoped), 30_000)

    it.effect("Contract.apply and Topology.ensureConsumer refuse to give a live consumer a wildcard filter on NATS before 2.10, instead of stopping it; check says so; a literal filter is applied", () =>
      Effect.gen(function*() {
        const { name, prefix } = yield* freshStream
        const { connection } = yield* NatsConnection.NatsConnection
        const version = connection.info!.version
        const contract: Contract.Contract = {
          version: "1",
          ownership: "service",
          stream: { name, subjects: [`${prefix}.>`] },
          consumers: [{ name: "shipper", ackWait: "30 seconds", maxAckPending: 100, expect: { attempts: 3, concurrency: 1, prefetch: 1 } }]
        }
        yield* Contract.apply(contract)
        const filtered: Contract.Contract = { ...contract, consumers: [{ ...contract.consumers[0]!, filterSubject: `${prefix}.eu.>` }] }
        if (Topology.versionAtLeast(version, "2.10.0")) {
          // A server that applies it: updated, and the consumer delivers what the filter takes.
          yield* Contract.apply(filtered)
          yield* publish(`${prefix}.eu.x`, "eu")
          assert.strictEqual(yield* next(name, "shipper"), "eu")
          return
        }
        const refused = yield* Effect.flip(Contract.apply(filtered))
        assert.strictEqual(refused._tag === "ContractError" ? refused.reason : `${refused._tag}: ${refused.message}`, "Refused")
        assert.include(refused.message, `consumer ${name}/shipper`)
        assert.include(refused.message, `the server is ${version}`)
        assert.include(refused.message, `nats consumer rm ${name} shipper`)
        const direct = yield* Effect.flip(Topology.ensureConsumer({ ...filtered.consumers[0]!, stream: name }))
        assert.include(direct.message, "delivers nothing more")
        const planned = yield* Contract.plan(filtered)
        assert.deepStrictEqual(planned.map((c) => [c.action, c.setting]), [["refuse", "filter_subject"]])
        const findings = yield* Contract.check(filtered)
        assert.deepStrictEqual(findings.map((f) => [f.check, f.severity]), [["filter_subject", "error"]])
        assert.include(findings[0]!.message, "delivers nothing more")
        // Nothing was sent: the consumer has no filter and still delivers.
        yield* publish(`${prefix}.eu.y`, "still")
        assert.strictEqual(yield* next(name, "shipper"), "still")

        // A literal filter is applied in place, and the consumer delivers on it.
        const literal: Contract.Contract = { ...contract, consumers: [{ ...contract.consumers[0]!, filterSubject: `${prefix}.eu.z` }] }
        const applied = yield* Contract.apply(literal)
        assert.deepStrictEqual(applied.map((c) => [c.action, c.setting]), [["update", "filter_subject"]])
        yield* publish(`${prefix}.eu.z`, "literal")
        assert.strictEqual(yield* next(name, "shipper"), "literal")
      }).pipe(Effect.scoped), 30_000)
  })
})

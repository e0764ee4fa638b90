/**
 * What `Topology.streamChanges` and `Topology.consumerChanges` say about changes an operator must
 * not make by accident, without a server (the CLI's view on a real one: test/contract-gaps.test.ts).
 *
 * Before: a lower stream limit was a plain `update` (`jetworker contract apply --yes` then deleted
 * the stored messages above it without a word), and a push consumer, a replay policy other than
 * instant or a declared deliver policy the live consumer does not have gave no change at all
 * (`ensureConsumer` "updated" a push consumer, which the intake then could not pull from).
 */
import { assert, describe, it } from "@effect/vitest"
import { Topology } from "@jetworker/nats"
import {
  AckPolicy,
  type ConsumerConfig,
  DeliverPolicy,
  DiscardPolicy,
  ReplayPolicy,
  RetentionPolicy,
  StorageType,
  type StreamConfig,
  type StreamState
} from "@nats-io/jetstream"

const minute = 60_000_000_000

const live: StreamConfig = {
  name: "ORDERS",
  subjects: ["orders.>"],
  retention: RetentionPolicy.Limits,
  storage: StorageType.File,
  num_replicas: 1,
  duplicate_window: 2 * minute,
  max_age: 60 * minute,
  max_bytes: -1,
  max_msgs: -1,
  max_msgs_per_subject: -1,
  max_msg_size: -1,
  max_consumers: -1,
  discard: DiscardPolicy.Old,
  no_ack: false,
  sealed: false,
  deny_delete: false,
  deny_purge: false,
  allow_rollup_hdrs: false,
  allow_direct: false,
  mirror_direct: false,
  first_seq: 0,
  discard_new_per_subject: false,
  metadata: {}
} as StreamConfig

/** The stream's state as `stream info` gives it: `messages` stored, `bytes` in all. */
const holding = (messages: number, bytes: number): StreamState => ({ messages, bytes, first_seq: 1, last_seq: messages } as StreamState)

const stream = { name: "ORDERS", subjects: ["orders.>"] }

/** Each change as [setting, destructive, message]. */
const marks = (changes: ReadonlyArray<Topology.Change>) => changes.map((change) => [change.setting, change.destructive === true, change.message])

describe("Topology.streamChanges: changes that delete stored messages", () => {
  it("a lower message limit says how many of the stored messages go, from the stream's state", () => {
    const [change] = Topology.streamChanges({ ...stream, maxMessages: 2 }, live, holding(5, 500))
    assert.strictEqual(change?.action, "update")
    assert.isTrue(change?.destructive)
    assert.strictEqual(change?.message, "set max_msgs of stream ORDERS to 2 (now -1): deletes the oldest 3 of the 5 stored messages")
  })

  it("without the state it may delete them (a lower limit applies at once); with fewer messages than the new limit, nothing goes now", () => {
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxMessages: 10 }, { ...live, max_msgs: 100 })), [
      ["max_msgs", true, "set max_msgs of stream ORDERS to 10 (now 100): may delete stored messages (a lower limit applies at once to what the stream holds)"]
    ])
    // The oldest going later, past the limit, is what a limit is: not a loss of what is stored.
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxMessages: 10 }, live, holding(4, 40))), [
      ["max_msgs", false, "set max_msgs of stream ORDERS to 10 (now -1)"]
    ])
    // Discard new keeps what is stored and refuses publishes at the limit instead.
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxMessages: 10, discard: "new" }, live, holding(4, 40))), [
      ["max_msgs", false, "set max_msgs of stream ORDERS to 10 (now -1)"],
      ["discard", false, "set discard of stream ORDERS to new (now old)"]
    ])
  })

  it("a stream that holds no message loses none: a first limit on it is a plain update", () => {
    const changes = Topology.streamChanges({ ...stream, maxMessages: 2, maxBytes: 100, maxAge: "5 minutes" }, live, holding(0, 0))
    assert.deepStrictEqual(changes.map((change) => [change.setting, change.destructive === true]), [
      ["max_age", false],
      ["max_bytes", false],
      ["max_msgs", false]
    ])
  })

  it("a lower byte limit, and a shorter age, are destructive; what they delete is said", () => {
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxBytes: 300 }, live, holding(5, 1000))), [
      ["max_bytes", true, "set max_bytes of stream ORDERS to 300 (now -1): deletes the oldest stored messages until at most 300 bytes remain (it holds 5 messages, 1000 bytes)"]
    ])
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxAge: "5 minutes" }, live, holding(5, 1000))), [
      ["max_age", true, "set max_age of stream ORDERS to 5m (now 1h): may delete stored messages: those older than 5m go (now kept for 1h) (it holds 5 messages, 1000 bytes)"]
    ])
    // A first age limit where messages were kept for ever.
    assert.isTrue(Topology.streamChanges({ ...stream, maxAge: "2 hours" }, { ...live, max_age: 0 })[0]?.destructive)
    // With the oldest stored message's time: past the new age, it deletes; within it, nothing goes
    // now (a stream of fresh messages given a first age limit, as a worker's contract does).
    const since = (millis: number) => ({ ...holding(5, 1000), first_ts: new Date(Date.now() - millis).toISOString() })
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxAge: "5 minutes" }, live, since(10 * minute / 1_000_000))), [
      ["max_age", true, "set max_age of stream ORDERS to 5m (now 1h): deletes stored messages: those older than 5m go (now kept for 1h) (it holds 5 messages, 1000 bytes)"]
    ])
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, maxAge: "7 days" }, { ...live, max_age: 0 }, since(1_000))), [
      ["max_age", false, "set max_age of stream ORDERS to 7d (now 0)"]
    ])
  })

  it("discard new to old under a limit is destructive; old to new, a higher limit, no limit and a longer age are not", () => {
    const limited = { ...live, max_msgs: 100, discard: DiscardPolicy.New }
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, discard: "old" }, limited)), [
      ["discard", true, "set discard of stream ORDERS to old (now new): may delete stored messages: at its limits the server then deletes the oldest instead of refusing a publish"]
    ])
    // Without a message or byte limit the discard policy deletes nothing.
    assert.deepStrictEqual(marks(Topology.streamChanges({ ...stream, discard: "old" }, { ...live, discard: DiscardPolicy.New })), [
      ["discard", false, "set discard of stream ORDERS to old (now new)"]
    ])
    const harmless = Topology.streamChanges(
      { ...stream, discard: "new", maxMessages: 1000, maxBytes: -1, maxAge: "2 hours" },
      { ...live, max_msgs: 100, max_bytes: 1_000_000 },
      holding(50, 5000)
    )
    assert.deepStrictEqual(harmless.map((change) => [change.setting, change.destructive === true]), [
      ["max_age", false],
      ["max_bytes", false],
      ["max_msgs", false],
      ["discard", false]
    ])
  })
})

const consumer: Topology.ConsumerOptions = { stream: "ORDERS", name: "shipper", ackWait: "30 seconds", maxDeliver: 11 }

const liveConsumer: ConsumerConfig = {
  durable_name: "shipper",
  ack_policy: AckPolicy.Explicit,
  ack_wait: 30_000_000_000,
  max_deliver: 11,
  max_ack_pending: 1000,
  deliver_policy: DeliverPolicy.All,
  replay_policy: ReplayPolicy.Instant
} as ConsumerConfig

const refusals = (changes: ReadonlyArray<Topology.Change>) =>
  changes.filter((change) => change.action === "refuse").map((change) => [change.setting, change.live, change.wanted])

describe("Topology.consumerChanges: what only deleting the consumer changes", () => {
  it("the declared consumer as it runs: nothing to change", () => {
    assert.deepStrictEqual(Topology.consumerChanges(consumer, liveConsumer), [])
  })

  it("a push consumer is refused: nats.js cannot pull from it", () => {
    const changes = Topology.consumerChanges(consumer, { ...liveConsumer, deliver_subject: "push.orders" })
    assert.deepStrictEqual(refusals(changes), [["deliver_subject", "push.orders", "none (pull)"]])
    assert.include(changes[0]!.message, "consumer ORDERS/shipper is a push consumer (deliver_subject push.orders)")
    assert.include(changes[0]!.message, "delete it (`nats consumer rm ORDERS shipper`")
  })

  it("a replay policy other than instant is refused: the server paces deliveries at the publish rate", () => {
    const changes = Topology.consumerChanges(consumer, { ...liveConsumer, replay_policy: ReplayPolicy.Original })
    assert.deepStrictEqual(refusals(changes), [["replay_policy", "original", "instant"]])
    assert.include(changes[0]!.message, "no faster than they were published")
  })

  it("a declared deliver policy the consumer does not have is refused (NATS 2.9 cannot change it); one left out is not compared", () => {
    const changes = Topology.consumerChanges({ ...consumer, deliverPolicy: "new" }, liveConsumer)
    assert.deepStrictEqual(refusals(changes), [["deliver_policy", "all", "new"]])
    assert.include(changes[0]!.message, "declare deliverPolicy \"all\" (the consumer keeps its position)")
    assert.deepStrictEqual(Topology.consumerChanges(consumer, { ...liveConsumer, deliver_policy: DeliverPolicy.New }), [])
    const byStart = Topology.consumerChanges({ ...consumer, deliverPolicy: "all" }, { ...liveConsumer, deliver_policy: DeliverPolicy.StartSequence })
    assert.include(byStart[0]!.message, "leave deliverPolicy out of the declaration")
  })

  it("a refusal comes with the updates the declaration also needs", () => {
    const changes = Topology.consumerChanges(consumer, { ...liveConsumer, replay_policy: ReplayPolicy.Original, max_deliver: 5 })
    assert.deepStrictEqual(changes.map((change) => [change.action, change.setting]), [["refuse", "replay_policy"], ["update", "max_deliver"]])
  })
})

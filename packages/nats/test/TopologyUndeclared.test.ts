/**
 * `Topology.streamChanges` compares only what a declaration gives: an existing stream's replicas,
 * age, duplicate window and storage that the declaration leaves out stay as an operator set them
 * (a worker ensuring its dead-letter stream shrank an operator's 3 replicas to 1).
 */
import { assert, describe, it } from "@effect/vitest"
import { Topology } from "@jetworker/nats"
import { DiscardPolicy, RetentionPolicy, StorageType, type StreamConfig } from "@nats-io/jetstream"

const minute = 60_000_000_000

const live: StreamConfig = {
  name: "ORDERS_DLQ",
  subjects: ["jetworker.dlq.ORDERS.>"],
  retention: RetentionPolicy.Limits,
  storage: StorageType.Memory,
  num_replicas: 3,
  duplicate_window: 10 * minute,
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

const settings = (changes: ReadonlyArray<Topology.Change>) => changes.map((change) => [change.action, change.setting, change.live, change.wanted])

describe("Topology.streamChanges", () => {
  it("a declaration without replicas, maxAge, duplicateWindow or storage leaves the live stream's as they are", () => {
    assert.deepStrictEqual(Topology.streamChanges({ name: "ORDERS_DLQ", subjects: ["jetworker.dlq.ORDERS.>"] }, live), [])
  })

  it("declared ones are compared", () => {
    const changes = Topology.streamChanges({
      name: "ORDERS_DLQ",
      subjects: ["jetworker.dlq.ORDERS.>"],
      replicas: 1,
      maxAge: "2 hours",
      duplicateWindow: "5 minutes"
    }, live)
    assert.deepStrictEqual(settings(changes), [
      ["update", "duplicate_window", "10m", "5m"],
      ["update", "max_age", "1h", "2h"],
      ["update", "num_replicas", "3", "1"]
    ])
    assert.deepStrictEqual(
      settings(Topology.streamChanges({ name: "ORDERS_DLQ", subjects: ["jetworker.dlq.ORDERS.>"], storage: "file" }, live)),
      [["refuse", "storage", "memory", "file"]]
    )
  })

  it("a declared max age shorter than the live duplicate window brings the window down to the default (the server refuses the pair)", () => {
    assert.deepStrictEqual(settings(Topology.streamChanges({ name: "ORDERS_DLQ", subjects: ["jetworker.dlq.ORDERS.>"], maxAge: "5 minutes" }, live)), [
      ["update", "duplicate_window", "10m", "2m"],
      ["update", "max_age", "1h", "5m"]
    ])
  })
})

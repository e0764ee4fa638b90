/**
 * A contract is a whole declaration: a stream setting it leaves out stands for its default, in
 * `Contract.check` as in `Contract.plan` and `Contract.apply`. (`Topology` alone leaves settings a
 * declaration omits as they are, so that a worker ensuring its streams never undoes an operator's;
 * a contract applied through it must still bring the stream to what `check` compares.)
 */
import { assert, describe, layer } from "@effect/vitest"
import { Contract, NatsConnection, Topology } from "@jetworker/nats"
import { Effect } from "effect"

const NatsLive = NatsConnection.layer({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" })

describe("Contract with settings left out", () => {
  layer(NatsLive, { excludeTestServices: true })((it) => {
    it.effect("INT-NATS-002: a stream setting the contract leaves out (max age) is its default: check reports the live value as drift, plan and apply bring it back, and check is then clean", () =>
      Effect.gen(function*() {
        const name = `CONTRACT_OMIT_${Date.now().toString(36)}`.toUpperCase()
        const { manager } = yield* NatsConnection.NatsConnection
        yield* Effect.addFinalizer(() => Effect.promise(() => manager.streams.delete(name).catch(() => false)))
        const contract: Contract.Contract = {
          version: "1",
          ownership: "service",
          stream: { name, subjects: [`${name.toLowerCase()}.>`] },
          consumers: []
        }
        // An operator gave the stream a max age the contract does not declare.
        yield* Topology.ensureStream({ ...contract.stream, maxAge: "1 hour" })
        const before = yield* Contract.check(contract)
        assert.deepStrictEqual(before.map((finding) => finding.check), ["max_age"])
        assert.deepStrictEqual((yield* Contract.plan(contract)).map((change) => change.setting), ["max_age"])
        assert.deepStrictEqual((yield* Contract.apply(contract)).map((change) => change.setting), ["max_age"])
        assert.deepStrictEqual(yield* Contract.check(contract), [], "the contract applied is the contract checked")
      }).pipe(Effect.scoped))
  })
})

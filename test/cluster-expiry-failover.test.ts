/**
 * Cluster faults (BE-JOB-005 with BE-JOB-002, R3 streams): a transfer with a deadline is applied
 * (committed) while the consumer's leader is being re-elected (SIGKILLed while the handler runs),
 * so its ack gets no answer. The engine sends the ack again within the lease; when the election
 * outlasts that (the second case makes sure of it: the third node is down too until the worker has
 * given up its ack, so no leader can be elected before), the broker redelivers the transfer after the election, by then past its deadline,
 * and the redelivery must end `Duplicate` (the idempotency store, or this run's memory, says it was
 * committed), never `Expired` ("no effect", counted in `jetworker_expired`, dead-lettered under
 * `expiry.onExpired: "deadLetter"`) for an applied transfer. Before, the redelivery was judged
 * `Expired` before the store was asked.
 */
import { assert, describe, layer } from "@effect/vitest"
import { TestDatabase } from "@jetworker/testing"
import { DateTime, Duration, Effect, Layer } from "effect"
import { failover, outcomesBeyond, resendLines } from "./support/clusterFailover.ts"
import { balances, openAccount, transfer, transferCounts, uniquePrefix } from "./support/ledger.ts"
import { MigratedLive } from "./support/services.ts"

const DatabaseLive = MigratedLive.pipe(Layer.provideMerge(TestDatabase.layer()))

/**
 * The scenario with lease `ackWait` and a deadline `dueInMillis` after the publish: the transfer's
 * outcomes once the consumer has nothing left unacknowledged, how often its handler started, and
 * what was applied, with a description for assertion messages.
 */
const committedDuringElection = (ackWait: Duration.Duration, dueInMillis: number, quorum: "kept" | "lost") =>
  Effect.gen(function*() {
    const p = uniquePrefix("expfail")
    const [payer, payee] = [`${p}.payer`, `${p}.payee`]
    const id = `${p}.t1`
    const r = yield* failover(
      { label: "cexf", ackWait, heldId: id },
      Effect.andThen(openAccount(payer, "EUR", 100_00), openAccount(payee, "EUR", 0)),
      (f) =>
        Effect.gen(function*() {
          const expiresAt = DateTime.makeUnsafe(Date.now() + dueInMillis)
          yield* f.publish(id, transfer(id, payer, payee, 10_00, { expiresAt }))
          if (quorum === "kept") {
            yield* f.killLeaderWhileHeld
          } else {
            // No election can end until `restore`, so every ack sent within the lease gets no
            // responder (an election that ended inside the lease could take one of them, making
            // the broker's redelivery this case is about a matter of timing).
            const { restore } = yield* f.killQuorumWhileHeld
            yield* outcomesBeyond(f, id, 0, "20 seconds")
            yield* restore
          }
          const first = yield* outcomesBeyond(f, id, 0, "20 seconds")
          assert.strictEqual(first[0]!.tag, "Committed", JSON.stringify(first[0]))
          // Acked: by the ack sent again, or by the redelivery's.
          yield* f.settledOnBroker
          const outcomes = yield* f.outcomesOfAllDeliveries(id, "20 seconds")
          const logs = yield* f.worker.logs
          // The fixture prints `received {...}` as a delivery's handler is about to run.
          const runs = (yield* f.worker.child.lines).filter((line) => line.startsWith("received ") && line.includes(`"${id}"`)).length
          yield* f.worker.child.kill("SIGTERM")
          yield* f.worker.child.waitForExit("15 seconds")
          return { outcomes, logs, runs }
        })
    )
    const said = `outcomes: ${r.outcomes.map((o) => JSON.stringify(o)).join(" ")}; handler runs: ${r.runs}; ` +
      `resent: ${resendLines(r.logs).join(" | ")}; logged: ${r.logs.filter((l) => l.outcome === "Expired").map((l) => l.message).join(" | ")}`
    return {
      ...r,
      said,
      applied: [...(yield* transferCounts([id])).values()],
      balances: yield* balances([payer, payee]),
      expectedBalances: { [payer]: 90_00n, [payee]: 10_00n }
    }
  })

describe("a transfer with a deadline committed while the consumer's leader is re-elected", () => {
  layer(DatabaseLive, { excludeTestServices: true, timeout: "150 seconds" })((it) => {
    it.effect("lease 8 s, due in 3 s: its ack is sent again through the election, or its redelivery ends Duplicate; never Expired, applied once", () =>
      Effect.gen(function*() {
        const r = yield* committedDuringElection(Duration.seconds(8), 3_000, "kept")
        assert.deepStrictEqual(r.applied, [1], r.said)
        assert.deepStrictEqual(r.balances, r.expectedBalances, r.said)
        const tags = r.outcomes.map((o) => `${o.tag} ${o.confirmed}`)
        assert.isTrue(
          tags.length === 1
            ? tags[0] === "Committed true"
            : tags[0] === "Committed false" && tags.slice(1).every((t) => t === "Duplicate true"),
          r.said
        )
      }), 150_000)

    it.effect("lease 2 s, due in 2 s, quorum lost until the lease has passed: the redelivery past the deadline ends Duplicate without running the handler", () =>
      Effect.gen(function*() {
        const r = yield* committedDuringElection(Duration.seconds(2), 2_000, "lost")
        assert.deepStrictEqual(r.applied, [1], r.said)
        assert.deepStrictEqual(r.balances, r.expectedBalances, r.said)
        assert.deepStrictEqual(
          r.outcomes.map((o) => [o.tag, o.deliveryCount, o.confirmed]),
          [["Committed", 1, false], ["Duplicate", 2, true]],
          r.said
        )
        // Judged before the handler (past the deadline), from the store's answer.
        assert.strictEqual(r.runs, 1, r.said)
      }), 150_000)
  })
})

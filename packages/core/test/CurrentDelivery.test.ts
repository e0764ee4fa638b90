import { assert, describe, it } from "@effect/vitest"
import { Context, Effect } from "effect"
import * as CurrentDelivery from "../src/CurrentDelivery.ts"

/** A delivery of `eventId` in consumer "c" whose reports land in `reports`. */
const deliveryInfo = (eventId: string, reports: Array<string>): CurrentDelivery.Info => ({
  consumer: "c",
  eventId,
  attempt: 1,
  attempts: 3,
  subject: "s",
  sequence: 1,
  deliveryCount: 1,
  expiresAt: undefined,
  leaseDeadline: () => undefined,
  report: (report) => reports.push(`${eventId}:${report}`)
})

const element = (eventId: string, reports: Array<string>): CurrentDelivery.BatchElement => ({
  eventId,
  subject: "s",
  sequence: 1,
  deliveryCount: 1,
  report: (report) => reports.push(`${eventId}:${report}`)
})

describe("reporting to the delivery being handled", () => {
  it("reporterIn reports for the delivery's own key only when called, and nothing for another key or scope", () => {
    const reports: Array<string> = []
    const context = Context.make(CurrentDelivery.CurrentDelivery, deliveryInfo("e1", reports))
    assert.isUndefined(CurrentDelivery.reporterIn(context, [{ scope: "c", id: "e2" }], "Committed"))
    assert.isUndefined(CurrentDelivery.reporterIn(context, [{ scope: "other", id: "e1" }], "Committed"))
    const report = CurrentDelivery.reporterIn(context, [{ scope: "c", id: "e2" }, { scope: "c", id: "e1" }], "Committed")
    assert.deepStrictEqual(reports, [], "nothing is reported before the function is called")
    report!()
    assert.deepStrictEqual(reports, ["e1:Committed"])
  })

  it("reporterIn reports for the batch's elements whose keys are given, each once, and nothing outside a delivery", () => {
    const reports: Array<string> = []
    const context = Context.make(CurrentDelivery.CurrentBatch, {
      consumer: "c",
      elements: [element("e1", reports), element("e2", reports), element("e3", reports)]
    })
    const keys = [{ scope: "c", id: "e3" }, { scope: "c", id: "e1" }, { scope: "c", id: "e1" }, { scope: "other", id: "e2" }]
    CurrentDelivery.reporterIn(context, keys, "AlreadyCommitted")!()
    assert.deepStrictEqual(reports, ["e1:AlreadyCommitted", "e3:AlreadyCommitted"])
    assert.isUndefined(CurrentDelivery.reporterIn(context, [{ scope: "c", id: "e9" }], "Committed"))
    assert.isUndefined(CurrentDelivery.reporterIn(Context.empty(), [{ scope: "c", id: "e1" }], "Committed"))
  })

  it.effect("reportAllFor reports at once what reporterIn would", () =>
    Effect.gen(function*() {
      const reports: Array<string> = []
      yield* CurrentDelivery.reportAllFor([{ scope: "c", id: "e1" }], "Committed").pipe(
        Effect.provideService(CurrentDelivery.CurrentDelivery, deliveryInfo("e1", reports))
      )
      yield* CurrentDelivery.reportFor({ scope: "c", id: "e2" }, "Committed").pipe(
        Effect.provideService(CurrentDelivery.CurrentDelivery, deliveryInfo("e1", reports))
      )
      assert.deepStrictEqual(reports, ["e1:Committed"])
    }))
})

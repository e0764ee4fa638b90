import { assert, describe, it } from "@effect/vitest"
import { Telemetry } from "@jetworker/core"

describe("Telemetry", () => {
  it("reads a W3C traceparent as an external parent span", () => {
    const parent = Telemetry.parseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert.deepInclude(parent!, {
      _tag: "ExternalSpan",
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
      spanId: "00f067aa0ba902b7",
      sampled: true
    })
    assert.isFalse(Telemetry.parseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")!.sampled)
    // A future version may add fields after the flags.
    assert.isDefined(Telemetry.parseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"))
  })

  it("ignores a missing or malformed traceparent instead of failing the delivery", () => {
    for (
      const value of [
        undefined,
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", // no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", // version 00 has no more fields
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01" // short trace id
      ]
    ) assert.isUndefined(Telemetry.parseTraceparent(value), String(value))
  })

  it("writes the traceparent that reads back as the same parent", () => {
    const span = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", sampled: true }
    const header = Telemetry.formatTraceparent(span)
    assert.strictEqual(header, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert.deepInclude(Telemetry.parseTraceparent(header)!, span)
  })
})

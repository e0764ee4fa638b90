/**
 * A permission refusal of a request (a JetStream API call, a confirmed publish): nats.js rejects it
 * with a `RequestError` whose cause is the server's `PermissionViolationError`. It was mapped to
 * `Unknown`, so what stops on `NotAuthorized` (a source's checks while it is paused) retried it
 * forever. It is `NotAuthorized`, final, with the server's words.
 */
import { assert, describe, it } from "@effect/vitest"
import { NatsError } from "@jetworker/nats"
import { errors } from "@nats-io/transport-node"

describe("NatsError: a permission refusal of a request", () => {
  it("a RequestError caused by a PermissionViolationError is NotAuthorized, not retryable, in the server's words", () => {
    const subject = "$JS.API.CONSUMER.INFO.ORDERS.shipping"
    const violation = new errors.PermissionViolationError(`Permissions Violation for Publish to "${subject}"`, "publish", subject)
    const refused = new errors.RequestError(violation.message, { cause: violation })
    const mapped = NatsError.fromUnknown("consumer info ORDERS/shipping", refused)
    assert.strictEqual(mapped.reason, "NotAuthorized")
    assert.isFalse(mapped.isRetryable)
    assert.include(mapped.message, `Permissions Violation for Publish to "${subject}"`)
  })

  it("a RequestError of another cause stays as it was (a timeout is a Timeout, anything else Unknown)", () => {
    assert.strictEqual(NatsError.fromUnknown("x", new errors.RequestError("timeout", { cause: new errors.TimeoutError() })).reason, "Timeout")
    assert.strictEqual(NatsError.fromUnknown("x", new errors.RequestError("odd", { cause: new Error("odd") })).reason, "Unknown")
  })
})

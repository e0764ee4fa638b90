import { assert, describe, it } from "@effect/vitest"
import { Outbox } from "@jetworker/core"

const message = (subject: string): Outbox.OutboxMessage => ({ subject, id: "e-1", payload: new Uint8Array() })

describe("Outbox.problems", () => {
  it("takes a subject up to maxSubjectBytes bytes of UTF-8 and refuses a longer one, which the server would answer by closing the connection", () => {
    const fits = `orders.${"x".repeat(Outbox.maxSubjectBytes - "orders.".length)}`
    assert.strictEqual(Outbox.subjectBytes(fits), Outbox.maxSubjectBytes)
    assert.deepStrictEqual(Outbox.problems(message(fits)), [])
    const [tooLong, ...more] = Outbox.problems(message(`${fits}x`))
    assert.deepStrictEqual(more, [])
    assert.include(tooLong, `${Outbox.maxSubjectBytes + 1} bytes, more than the ${Outbox.maxSubjectBytes} that fit a NATS control line`)
    // Bytes, not characters: "ü" is two, so one in place of an "x" is one byte too many.
    assert.lengthOf(Outbox.problems(message(`${fits.slice(0, -1)}ü`)), 1)
    // What NATS takes stays valid: UTF-8 tokens, long subjects.
    assert.deepStrictEqual(Outbox.problems(message(`orders.münchen.${"x".repeat(1100)}`)), [])
  })
})

/**
 * Turns a nats.js `JsMsg` into the engine's `Delivery`. Every command is a request to the
 * message's reply subject, so the server's (empty) reply confirms it; nats.js's own
 * `nak`/`term`/`working` are fire-and-forget and silently lost while disconnected.
 */
import type { JsMsg } from "@nats-io/jetstream"
import { nanos } from "@nats-io/transport-node"
import { Delivery } from "@jetworker/core"
import type { Outcome } from "@jetworker/core"
import { Duration, Effect } from "effect"
import * as DeadLetter from "../DeadLetter.ts"
import type { Shape } from "../NatsConnection.ts"
import { NatsConnection } from "../NatsConnection.ts"
import * as NatsError from "../NatsError.ts"

const encoder = new TextEncoder()
const ACK = encoder.encode("+ACK")
const NAK = encoder.encode("-NAK")
const TERM = encoder.encode("+TERM")
const WPI = encoder.encode("+WPI")

const settleError = (command: Delivery.SettleCommand, error: NatsError.NatsError) =>
  new Delivery.SettleError({
    command,
    reason: error.reason === "Timeout"
      ? "Timeout"
      : error.reason === "ApiError" || error.reason === "InvalidReply"
      ? "Refused"
      : "Unavailable",
    message: `${error.operation}: ${error.message}`
  })

/** The reply subject of a JetStream message (`$JS.ACK....`), which nats.js keeps off its public type. */
const replyOf = (msg: JsMsg): string => (msg as unknown as { readonly reply?: string }).reply ?? ""

/** Builds the engine's view of `msg`. */
export const toDelivery = (
  connection: Shape,
  settleTimeoutMillis: number,
  destination: DeadLetter.Destination,
  msg: JsMsg
): Delivery.Delivery => {
  const reply = replyOf(msg)
  const command = (name: Delivery.SettleCommand, payload: Uint8Array): Effect.Effect<void, Delivery.SettleError> =>
    reply === ""
      ? Effect.fail(new Delivery.SettleError({ command: name, reason: "Refused", message: "message has no reply subject" }))
      : connection.request(`${name} ${msg.info.stream}#${msg.seq}`, reply, payload, settleTimeoutMillis).pipe(
        Effect.mapError((error) => settleError(name, error)),
        Effect.asVoid
      )
  const headers = msg.headers
  return {
    subject: msg.subject,
    payload: msg.data,
    sequence: msg.seq,
    deliveryCount: msg.info.deliveryCount,
    // The server's stored time (nanoseconds as a bigint, so no precision is lost on the way).
    publishedAt: Number(msg.timestampNanos / 1_000_000n),
    pending: msg.info.pending,
    header: (name) => {
      if (headers === undefined || !headers.has(name)) return undefined
      return headers.get(name)
    },
    // Getters: each command's effect is built when it is used (most deliveries send one ack).
    get ack() {
      return command("Ack", ACK)
    },
    nak: (delay) => {
      const millis = Math.max(0, Math.round(Duration.toMillis(delay)))
      return command("Nak", millis === 0 ? NAK : encoder.encode(`-NAK ${JSON.stringify({ delay: nanos(millis) })}`))
    },
    get extend() {
      return command("Extend", WPI)
    },
    deadLetter: (record: Outcome.DeadLetterRecord) =>
      DeadLetter.publish(destination, msg, record).pipe(
        Effect.provideService(NatsConnection, connection),
        Effect.mapError((error) => settleError("DeadLetter", error)),
        // Only once the dead letter is stored may the original be terminated.
        Effect.andThen(command("Term", TERM))
      )
  }
}

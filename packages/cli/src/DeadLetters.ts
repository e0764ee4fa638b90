/**
 * The operator's view of dead letters (`jetworker dlq ...`): list a dead-letter stream, replay
 * one dead letter to its original subject once its cause is fixed, and store a message the broker
 * gave up on (MaxDeliver, or a `dead-letter.stranded` line) in the dead-letter stream by its
 * sequence. Thin wrappers over `@jetworker/nats`'s `DeadLetter`, with the text an operator reads.
 *
 * @since 0.3.0
 */
import { DeadLetter, type NatsConnection, type NatsError } from "@jetworker/nats"
import { Effect } from "effect"

const decoder = new TextDecoder()

/** One dead letter as `dlq list` prints it (and as `--json` gives it). */
export interface Row {
  readonly sequence: number
  readonly failedAt: string
  readonly outcome: string
  readonly reason: string
  readonly source: string
  readonly sourceSequence: number
  readonly deliveries: number
  readonly subject: string
  readonly eventId: string | undefined
  /** The cause's summary: its tag and message, when the engine recorded one. */
  readonly error: string
  /** The first 200 characters of the payload, as UTF-8. */
  readonly payload: string
}

const errorText = (error: unknown): string => {
  if (typeof error !== "object" || error === null) return String(error ?? "")
  const { tag, message } = error as { readonly tag?: unknown; readonly message?: unknown }
  return [tag, message].filter((part) => typeof part === "string" && part !== "").join(": ")
}

/** The dead letters of `stream` from sequence `from` on, at most `limit`, as rows. */
export const list = (
  stream: string,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined } = {}
): Effect.Effect<ReadonlyArray<Row>, NatsError.NatsError, NatsConnection.NatsConnection> =>
  Effect.map(DeadLetter.list(stream, options), (messages) =>
    messages.map((m): Row => ({
      sequence: m.sequence,
      failedAt: m.failedAt,
      outcome: m.outcome,
      reason: m.reason,
      source: `${m.sourceStream}/${m.consumer}`,
      sourceSequence: m.sourceSequence,
      deliveries: m.deliveries,
      subject: m.subject,
      eventId: m.eventId,
      error: errorText(m.error),
      payload: decoder.decode(m.payload.subarray(0, 200))
    })))

/** The rows as text: one block per dead letter, or a line saying there are none. */
export const format = (stream: string, rows: ReadonlyArray<Row>): string =>
  rows.length === 0
    ? `no dead letters in ${stream}`
    : rows.map((row) =>
      [
        `#${row.sequence} ${row.outcome} ${row.reason} at ${row.failedAt}`,
        `  from ${row.source}#${row.sourceSequence} (subject ${row.subject}, ${row.deliveries} deliveries, event ${row.eventId ?? "-"})`,
        `  error: ${row.error === "" ? "-" : row.error}`,
        `  payload: ${row.payload}`
      ].join("\n")
    ).join("\n")

/**
 * The names of the headers a dead letter carries, and how an original's `Nats-*` header is kept
 * under another name and given its name back: shared by the writing side (`DeadLetter`) and the
 * reading side (`deadLetterReader.ts`), so that neither imports the other.
 */

/** Header names written on every dead-letter message. */
export const Header = {
  stream: "Jetworker-Stream",
  consumer: "Jetworker-Consumer",
  subject: "Jetworker-Subject",
  sequence: "Jetworker-Sequence",
  deliveries: "Jetworker-Deliveries",
  outcome: "Jetworker-Outcome",
  reason: "Jetworker-Reason",
  error: "Jetworker-Error",
  eventId: "Jetworker-Event-Id",
  failedAt: "Jetworker-Failed-At",
  /** On a replayed message: `<dead-letter stream>:<sequence>` it came from. */
  replayOf: "Jetworker-Replay-Of",
  /** Prefix of a kept `Nats-*` header of the original, stored as `Jetworker-Original-Nats_<rest>`. */
  originalPrefix: "Jetworker-Original-"
} as const

/**
 * The name under which an original `Nats-*` header is kept: `Jetworker-Original-Nats_<rest>`.
 * The `-` after `Nats` must go: NATS 2.9 finds a header by searching the whole header block for
 * its name, and a second `...Nats-Msg-Id` anywhere in it (even after the real one) makes the
 * server ignore `Nats-Msg-Id` altogether, so dead letters were never deduplicated.
 */
export const keptName = (key: string): string => `${Header.originalPrefix}Nats_${key.slice("nats-".length)}`

/** The original name of a kept header (both the current `Nats_` form and the older `Nats-` one). */
export const originalName = (kept: string): string => {
  const rest = kept.slice(Header.originalPrefix.length)
  return /^nats_/i.test(rest) ? `Nats-${rest.slice("nats_".length)}` : rest
}

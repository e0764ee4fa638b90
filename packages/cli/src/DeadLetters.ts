/**
 * The operator's view of dead letters (`jetworker dlq ...`): list a dead-letter stream (filtered
 * by consumer, reason, subject and time), show one dead letter in full, replay dead letters to
 * their original subject once their cause is fixed, purge the ones that are not wanted, and store
 * a message the broker gave up on (MaxDeliver, or a `dead-letter.stranded` line) in the
 * dead-letter stream by its sequence. Thin wrappers over `@jetworker/nats`'s `DeadLetter`, with
 * the selection, pacing and text an operator needs.
 *
 * A replay is `DeadLetter.replay`: the original payload (so the same event id) with a
 * deterministic `Nats-Msg-Id` derived from the dead letter's own headers (`DeadLetter.replayId`),
 * so a replay that is itself retried (or run twice) is stored once within the source stream's
 * duplicate window.
 *
 * @since 0.1.0
 */
import { DeadLetter, NatsConnection, NatsError, Topology } from "@jetworker/nats"
import { Duration, Effect } from "effect"

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

/** A dead letter as a row; the payload cut to `payloadChars` characters. */
const toRow = (m: DeadLetter.DeadLetterMessage, payloadChars = 200): Row => ({
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
  payload: decoder.decode(m.payload.subarray(0, payloadChars))
})

/** Which dead letters an operation takes; every field given must match. */
export interface Filter {
  /** The consumer that dead-lettered it. */
  readonly consumer?: string | undefined
  /** Its reason (`PermanentError`, `DeliveriesExhausted`, `SchemaInvalid`, ...). */
  readonly reason?: string | undefined
  /** Its original subject, or a NATS subject filter (`orders.*.created`, `orders.>`). */
  readonly subject?: string | undefined
  /** Dead-lettered at or after this time (epoch milliseconds). */
  readonly since?: number | undefined
  /** Dead-lettered before this time (epoch milliseconds). */
  readonly until?: number | undefined
}

/** Whether `filter` selects `m`. */
export const matches = (filter: Filter) => (m: DeadLetter.DeadLetterMessage): boolean => {
  const at = Date.parse(m.failedAt)
  return (filter.consumer === undefined || m.consumer === filter.consumer) &&
    (filter.reason === undefined || m.reason === filter.reason) &&
    (filter.subject === undefined || Topology.captures(filter.subject, m.subject)) &&
    (filter.since === undefined || at >= filter.since) &&
    (filter.until === undefined || at < filter.until)
}

const isoTime = /^(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?(Z|[+-]\d{2}:\d{2}))?$/

/**
 * Epoch milliseconds of an ISO 8601 `--since`/`--until`, or `undefined` when it is not one of
 * these forms: a date `2026-12-01` (midnight UTC), or a date-time with its offset
 * `2026-12-01T10:00Z`, `2026-12-01T10:00:00Z`, `2026-12-01T10:00:00.250+01:00`. A date-time
 * without an offset is refused, since whose local time it means is a guess; so is anything else
 * `Date.parse` would take (`2` is February 2001), which would select what nobody asked for.
 */
export const parseTime = (text: string): number | undefined => {
  const m = isoTime.exec(text)
  if (m === null) return undefined
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map((part) => Number(part ?? 0)) as [number, number, number, number, number, number]
  const millis = Number((m[7] ?? "").padEnd(3, "0").slice(0, 3))
  const zone = m[8] ?? "Z"
  const [offsetHours, offsetMinutes] = zone === "Z" ? [0, 0] : [Number(zone.slice(1, 3)), Number(zone.slice(4, 6))]
  if (hour > 23 || minute > 59 || second > 59 || offsetHours > 23 || offsetMinutes > 59) return undefined
  // setUTCFullYear, unlike Date.UTC, keeps years below 100; both roll 2026-02-30 over to March 2,
  // so the day read back must be the one given.
  const date = new Date(0)
  date.setUTCFullYear(year, month - 1, day)
  if (date.getUTCFullYear() !== year || date.getUTCMonth() !== month - 1 || date.getUTCDate() !== day) return undefined
  date.setUTCHours(hour, minute, second, millis)
  return date.getTime() - (zone.startsWith("-") ? -1 : 1) * (offsetHours * 60 + offsetMinutes) * 60_000
}

/** Whether `filter` narrows anything (an empty filter selects every dead letter). */
export const isEmpty = (filter: Filter): boolean => Object.values(filter).every((value) => value === undefined)

/** How many dead letters one operation reads at most. */
export const maxSelected = 100_000

/** {@link select} without its cap: up to `limit` dead letters, read in pages of 1000. */
const collect = (
  stream: string,
  filter: Filter,
  start: number | undefined,
  limit: number
): Effect.Effect<ReadonlyArray<DeadLetter.DeadLetterMessage>, NatsError.NatsError, NatsConnection.NatsConnection> =>
  Effect.gen(function*() {
    const selected: Array<DeadLetter.DeadLetterMessage> = []
    let from = start
    while (selected.length < limit) {
      const page = yield* DeadLetter.list(stream, { from, limit: 1000 })
      if (page.length === 0) break
      for (const m of page) if (selected.length < limit && DeadLetter.isDeadLetter(m) && matches(filter)(m)) selected.push(m)
      from = page[page.length - 1]!.sequence + 1
      if (page.length < 1000) break
    }
    return selected
  })

/**
 * The dead letters of `stream` that `filter` selects, oldest first, from sequence `from` on, at
 * most `limit` (at most {@link maxSelected}), read in pages of 1000. A message that is not a dead
 * letter (`DeadLetter.isDeadLetter`) is never selected.
 */
export const select = (
  stream: string,
  filter: Filter,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined } = {}
): Effect.Effect<ReadonlyArray<DeadLetter.DeadLetterMessage>, NatsError.NatsError, NatsConnection.NatsConnection> =>
  collect(stream, filter, options.from, Math.min(options.limit ?? maxSelected, maxSelected))

/** A selection that knows whether it is complete. */
export interface Selection {
  /** The dead letters selected, oldest first. */
  readonly messages: ReadonlyArray<DeadLetter.DeadLetterMessage>
  /**
   * The sequence of the first dead letter that matches but was left out by the limit (the rest
   * follow it); `undefined` when the messages are all that match.
   *
   * @since 0.1.0
   */
  readonly next: number | undefined
}

/**
 * Like {@link select}, and says whether more dead letters match than `limit` (default and most
 * {@link maxSelected}) took: it reads one more than it selects, as {@link listPage} does, so that
 * `dlq replay` and `dlq purge` can say that `--max` cut their selection.
 *
 * @since 0.1.0
 */
export const selectPage = (
  stream: string,
  filter: Filter,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined } = {}
): Effect.Effect<Selection, NatsError.NatsError, NatsConnection.NatsConnection> => {
  const limit = Math.min(options.limit ?? maxSelected, maxSelected)
  return Effect.map(collect(stream, filter, options.from, limit + 1), (messages) => ({
    messages: messages.slice(0, limit),
    next: messages.length > limit ? messages[limit]!.sequence : undefined
  }))
}

/**
 * Whether `stream` can be a dead-letter stream: its first message is a dead letter, or it has
 * none. Any other stream's message (a source stream given by mistake) has no dead-letter headers,
 * whatever the stream's name. Every `dlq` command but `recover` checks it before it reads or
 * changes anything.
 *
 * @since 0.1.0
 */
export const isDeadLetterStream = (stream: string): Effect.Effect<boolean, NatsError.NatsError, NatsConnection.NatsConnection> =>
  Effect.map(DeadLetter.list(stream, { limit: 1 }), (first) => first.every(DeadLetter.isDeadLetter))

/**
 * Why `stream` was refused ({@link isDeadLetterStream}), worded alike by every `dlq` command:
 * `which` is the message that was read (`"its first message"`, `"#3"`), `verb` what was not done
 * (`"listed"`, `"purged"`); it names the dead-letter stream of `stream`'s consumers.
 *
 * @since 0.1.0
 */
export const notDeadLetterStream = (stream: string, which: string, verb: string): string =>
  `${stream} is not a dead-letter stream (${which} has no ${DeadLetter.Header.stream} header), nothing ${verb}; ` +
  `the dead letters of ${stream}'s consumers are in ${DeadLetter.destination(stream, "-").stream}`

/** The dead letters of `stream` that `filter` selects, as rows (see {@link select}). */
export const list = (
  stream: string,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined; readonly filter?: Filter | undefined } = {}
): Effect.Effect<ReadonlyArray<Row>, NatsError.NatsError, NatsConnection.NatsConnection> =>
  Effect.map(select(stream, options.filter ?? {}, { from: options.from, limit: options.limit ?? 100 }), (messages) => messages.map((m) => toRow(m)))

/** A listing that knows whether it is complete. */
export interface Page {
  /** The dead letters listed, oldest first. */
  readonly rows: ReadonlyArray<Row>
  /**
   * The sequence to list from next (`from`) when more dead letters match than the limit took;
   * `undefined` when the rows are all there are.
   */
  readonly next: number | undefined
}

/**
 * Like {@link list}, and says whether more dead letters match than `limit` (default 100, at most
 * {@link maxSelected}) took: it reads one more than it lists, so that even a listing of the most
 * it takes can tell (`list` with a limit of one more cannot there, being capped).
 *
 * @since 0.1.0
 */
export const listPage = (
  stream: string,
  options: { readonly from?: number | undefined; readonly limit?: number | undefined; readonly filter?: Filter | undefined } = {}
): Effect.Effect<Page, NatsError.NatsError, NatsConnection.NatsConnection> => {
  const limit = Math.min(options.limit ?? 100, maxSelected)
  return Effect.map(collect(stream, options.filter ?? {}, options.from, limit + 1), (messages) => {
    const rows = messages.slice(0, limit).map((m) => toRow(m))
    return { rows, next: messages.length > limit && rows.length > 0 ? rows[rows.length - 1]!.sequence + 1 : undefined }
  })
}

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

/** One dead letter in full: its row (the payload up to 64 KiB), the recorded cause and the original headers. */
export interface Detail extends Row {
  readonly cause: unknown
  readonly headers: ReadonlyArray<readonly [string, string]>
  readonly payloadBytes: number
}

/** A dead letter in full. */
export const detail = (m: DeadLetter.DeadLetterMessage): Detail => ({
  ...toRow(m, 65_536),
  cause: m.error,
  headers: m.originalHeaders,
  payloadBytes: m.payload.byteLength
})

/**
 * Reads one dead letter in full. A message that is not a dead letter (`DeadLetter.isDeadLetter`:
 * any other stream's message) fails with `ApiError` rather than being shown with empty fields.
 */
export const show = (stream: string, sequence: number): Effect.Effect<Detail, NatsError.NatsError, NatsConnection.NatsConnection> =>
  Effect.flatMap(DeadLetter.read(stream, sequence), (m) =>
    DeadLetter.isDeadLetter(m)
      ? Effect.succeed(detail(m))
      : Effect.fail(
        new NatsError.NatsError({
          reason: "ApiError",
          operation: `show ${stream}#${sequence}`,
          message: `${stream}#${sequence} is not a dead letter (it has no ${DeadLetter.Header.stream} header)`
        })
      ))

/** A dead letter in full as text. */
export const formatDetail = (stream: string, d: Detail): string =>
  [
    `${stream}#${d.sequence}: ${d.outcome} ${d.reason} at ${d.failedAt}`,
    `source:     ${d.source}#${d.sourceSequence} (${d.deliveries} deliveries)`,
    `subject:    ${d.subject}`,
    `event:      ${d.eventId ?? "-"}`,
    `error:      ${d.error === "" ? "-" : d.error}`,
    `cause:      ${JSON.stringify(d.cause)}`,
    `headers:    ${d.headers.length === 0 ? "-" : d.headers.map(([name, value]) => `${name}: ${value}`).join("; ")}`,
    `payload (${d.payloadBytes} bytes):`,
    d.payload
  ].join("\n")

/** What a bulk operation did. */
export interface BulkResult {
  readonly action: "replay" | "purge"
  readonly selected: number
  readonly done: number
  /** For a replay: where each dead letter was stored again (`duplicate`: an earlier replay of it was). */
  readonly stored: ReadonlyArray<{ readonly sequence: number; readonly stream: string; readonly seq: number; readonly duplicate: boolean }>
  readonly failed: ReadonlyArray<{ readonly sequence: number; readonly message: string }>
  /** Why the run stopped before the end (the connection was lost); the rest were not tried. */
  readonly stopped?: string | undefined
}

/** A failure the rest of a run would meet too: the connection is gone or the server does not answer. */
const lostConnection = (error: NatsError.NatsError): boolean =>
  error.reason === "ConnectionClosed" || error.reason === "ConnectionRefused" || error.reason === "Timeout"

/** Whether stream `name` exists (a failed look-up counts as existing: only a sure "no" skips work). */
const streamExists = (name: string): Effect.Effect<boolean, never, NatsConnection.NatsConnection> =>
  Effect.flatMap(NatsConnection.NatsConnection, ({ manager }) =>
    Effect.tryPromise({ try: () => manager.streams.info(name), catch: (error) => NatsError.fromUnknown(`stream info ${name}`, error) }).pipe(
      Effect.as(true),
      Effect.catch((error) => Effect.succeed(error.reason !== "StreamNotFound"))
    ))

/**
 * Runs `action` on each selected dead letter in turn, at most `rate` a second, reporting progress
 * after each one; a failure is recorded and the run goes on with the next, except a lost
 * connection, which stops the run (`stopped`). A replay that finds its source stream gone fails the
 * rest of that source's dead letters at once, without trying them (they would fail the same way,
 * a few requests each): they are kept. An interruption calls `onInterrupt` with how many were done.
 */
export const run = (
  action: BulkResult["action"],
  stream: string,
  selected: ReadonlyArray<DeadLetter.DeadLetterMessage>,
  options: {
    readonly rate: number
    readonly onProgress: (done: number, total: number) => Effect.Effect<void>
    readonly onInterrupt?: ((done: number, total: number) => Effect.Effect<void>) | undefined
  }
): Effect.Effect<BulkResult, never, NatsConnection.NatsConnection> => {
  let done = 0
  return Effect.gen(function*() {
    const { connection } = yield* NatsConnection.NatsConnection
    const pause = Duration.millis(1000 / options.rate)
    const failed: Array<BulkResult["failed"][number]> = []
    const stored: Array<BulkResult["stored"][number]> = []
    // Source streams found gone, with the first dead letter that found it.
    const goneSources = new Map<string, number>()
    for (const [i, m] of selected.entries()) {
      const goneSince = goneSources.get(m.sourceStream)
      if (goneSince !== undefined) {
        failed.push({ sequence: m.sequence, message: `not tried: source stream ${m.sourceStream} does not exist (as for #${goneSince})` })
        yield* options.onProgress(i + 1, selected.length)
        continue
      }
      if (i > 0) yield* Effect.sleep(pause)
      const result = yield* Effect.result(
        action === "replay"
          ? Effect.map(DeadLetter.replay(stream, m.sequence), (ack) => {
            stored.push({ sequence: m.sequence, stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate })
          })
          : DeadLetter.discard(stream, m.sequence)
      )
      if (result._tag === "Success") done++
      else {
        failed.push({ sequence: m.sequence, message: result.failure.message })
        // Without a connection every other one would fail too (after its timeout): stop at once.
        if (lostConnection(result.failure) || connection.isClosed()) {
          return { action, selected: selected.length, done, stored, failed, stopped: `lost the connection: ${result.failure.message}` }
        }
        if (action === "replay" && result.failure.reason === "StreamNotFound" && !(yield* streamExists(m.sourceStream))) {
          goneSources.set(m.sourceStream, m.sequence)
        }
      }
      yield* options.onProgress(i + 1, selected.length)
    }
    return { action, selected: selected.length, done, stored, failed }
  }).pipe(Effect.onInterrupt(() => options.onInterrupt?.(done, selected.length) ?? Effect.void))
}

/** A progress bar for a terminal: `[#########-----------]  450/1000`. */
export const progressBar = (done: number, total: number, width = 30): string => {
  const filled = total === 0 ? width : Math.round((done / total) * width)
  return `[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${String(done).padStart(String(total).length)}/${total}`
}

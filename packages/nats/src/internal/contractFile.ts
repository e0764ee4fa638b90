/**
 * The file form of a contract (`Contract.fromJson`): the same fields as `Contract.Contract`,
 * durations as text ("30 seconds") or milliseconds, each field checked, a misspelt one refused.
 */
import { Duration, Effect, Option, Schema, SchemaIssue } from "effect"

const DurationInput = Schema.Union([
  Schema.String.pipe(Schema.check(Schema.makeFilter((text: string) => {
    const parsed = Duration.fromInput(text as Duration.Input)
    // "-5 seconds" and "Infinity" parse, but no server setting takes them.
    return (Option.isSome(parsed) && Duration.isFinite(parsed.value) && Duration.toMillis(parsed.value) >= 0) ||
      `expected a finite duration such as "30 seconds", got ${JSON.stringify(text)}`
  }))),
  Schema.Finite.pipe(Schema.check(Schema.isGreaterThanOrEqualTo(0)))
])

/** A positive duration: a setting the server replaces by its default when it is 0. */
const PositiveDurationInput = DurationInput.pipe(Schema.check(Schema.makeFilter((input: string | number) => {
  const parsed = Duration.fromInput(input as Duration.Input)
  return (Option.isSome(parsed) && Duration.toMillis(parsed.value) > 0) ||
    `expected a positive duration (the server replaces 0 by its default), got ${JSON.stringify(input)}`
})))

const Count = Schema.Int.pipe(Schema.check(Schema.isGreaterThanOrEqualTo(1)))

/** A limit: a positive count, or -1 for none. */
const Limit = Schema.Int.pipe(Schema.check(Schema.makeFilter((n: number) => n >= 1 || n === -1 || `expected a count of at least 1, or -1 for none, got ${n}`)))

const ExpectationsFile = Schema.Struct({
  attempts: Count,
  concurrency: Count,
  prefetch: Count,
  instances: Schema.optional(Count),
  ordering: Schema.optional(Schema.Literals(["Unordered", "PerKey", "Sequential"])),
  maxProcessingTime: Schema.optional(DurationInput),
  idempotent: Schema.optional(Schema.Boolean),
  // Its range (1 second to 2147483647 ms) is the checks' error finding, as for maxProcessingTime.
  pullExpires: Schema.optional(DurationInput)
})

const ConsumerFile = Schema.Struct({
  name: Schema.String,
  ackWait: Schema.optional(PositiveDurationInput),
  maxDeliver: Schema.optional(Limit),
  maxAckPending: Schema.optional(Limit),
  filterSubject: Schema.optional(Schema.String),
  filterSubjects: Schema.optional(Schema.Array(Schema.String)),
  deliverPolicy: Schema.optional(Schema.Literals(["all", "new"])),
  backoff: Schema.optional(Schema.Array(PositiveDurationInput)),
  expect: ExpectationsFile
})

const StreamFile = Schema.Struct({
  name: Schema.String,
  subjects: Schema.Array(Schema.String),
  subjectsMode: Schema.optional(Schema.Literals(["exact", "add"])),
  storage: Schema.optional(Schema.Literals(["file", "memory"])),
  retention: Schema.optional(Schema.Literals(["limits", "interest", "workqueue"])),
  duplicateWindow: Schema.optional(PositiveDurationInput),
  maxAge: Schema.optional(DurationInput),
  maxBytes: Schema.optional(Limit),
  maxMessages: Schema.optional(Limit),
  discard: Schema.optional(Schema.Literals(["old", "new"])),
  replicas: Schema.optional(Count)
})

const ContractFile = Schema.Struct({
  version: Schema.String,
  ownership: Schema.Literals(["service", "platform"]),
  stream: StreamFile,
  consumers: Schema.Array(ConsumerFile),
  publishHorizon: Schema.optional(DurationInput)
})

const formatIssues = SchemaIssue.makeFormatterStandardSchemaV1()

/**
 * Decodes parsed JSON into the contract's fields, or fails with one message naming each wrong
 * field (`path: problem`, joined by "; "). Every duration text it lets through parses.
 */
export const decode = (json: unknown): Effect.Effect<typeof ContractFile.Type, string> =>
  // A misspelt field ("maxDelivery") is an error, not a setting silently left at its default.
  Schema.decodeUnknownEffect(ContractFile)(json, { errors: "all", onExcessProperty: "error" }).pipe(
    Effect.mapError((error) =>
      formatIssues(error.issue).issues.map((issue) =>
        `${(issue.path ?? []).map((key) => typeof key === "object" ? String(key.key) : String(key)).join(".") || "(top)"}: ${issue.message}`
      ).join("; ")
    )
  )

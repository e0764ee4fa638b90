#!/usr/bin/env node
/**
 * The `jetworker` command.
 *
 *   jetworker config check --manifest <file> [--container <name>] [--ack-wait <duration> | --ack-wait-env <VAR>] [--json]
 *   jetworker dlq list --stream <dead-letter stream> [--from <seq>] [--limit <n>] [filters] [--json] [--server <url>]
 *   jetworker dlq show --stream <dead-letter stream> --sequence <seq> [--json] [--server <url>]
 *   jetworker dlq replay --stream <dead-letter stream> (--sequence <seq> | filters | --all) [--dry-run] [--yes] [--rate <n/s>] [--max <n>] [--json]
 *   jetworker dlq purge --stream <dead-letter stream> (--sequence <seq> | filters | --all) [--dry-run] [--yes] [--rate <n/s>] [--max <n>] [--json]
 *   jetworker dlq recover --stream <source stream> --consumer <name> --sequence <seq> [--server <url>]
 *   jetworker contract check --contract <file> [--json] [--server <url>]
 *   jetworker contract diff --contract <file> [--json] [--server <url>]
 *   jetworker contract apply --contract <file> [--dry-run] [--yes] [--allow-data-loss] [--json] [--server <url>]
 *   jetworker migrate [--sql]
 *
 * Exit codes: `config check`: 0 the settings agree with the manifest (warnings allowed); 1 they
 * disagree (the report says where); 2 the check could not run (unreadable manifest, no such
 * container, bad arguments). `dlq`: 0 done (also a `replay` or `purge` whose `--max` left some
 * that match out: it says so on stderr, and as `next` in `--json`); 1 the server refused (no such
 * stream, consumer or message, not stored), a dead letter of a bulk run failed, or a replay or
 * purge was not confirmed; 2 bad arguments (`--sequence` or `--from` below 1, `--sequence` with a
 * filter or `--all`; a `--server` that is no
 * URL; a `list`, `replay` or `purge` of a stream that is not a dead-letter stream; a `show` of a message
 * that is not a dead letter; a `--since` or `--until` that is not ISO 8601) or no connection
 * (unreachable, not a NATS server, credentials refused, no JetStream on the server or for the
 * account, or lost during a bulk run, which then stops and says how many were done). A server
 * that does not answer fails a command: 5 seconds for connecting or for a request, then at most 1
 * second closing the connection. Filters: `--consumer`, `--reason`, `--subject` (a NATS subject
 * filter), `--since`, `--until` (ISO 8601: a date, `2026-12-01`, meaning midnight UTC, or a
 * date-time with seconds optional, fractions allowed and its offset required, `2026-12-01T10:00Z`,
 * `2026-12-01T10:00:00.250+01:00`). A `purge`, and
 * a `replay` of more than one named sequence, asks on a terminal and refuses without one unless
 * `--yes`. `recover` stores into the existing dead-letter stream; it never creates or changes it.
 * `contract check`: 0 the server fits the contract (warnings allowed), 1 it does not (the report
 * says where and what to do). `contract diff`: 0 nothing to change, 1 changes pending. `contract apply`: 0 applied (or nothing to change) and
 * the server then fits, 1 refused (platform-owned, a contract that contradicts itself, a change the
 * server cannot make in place, a change that deletes stored messages without `--allow-data-loss`,
 * or not confirmed) or errors remain; with `--dry-run` it writes nothing and exits 0 when it would
 * apply (or nothing to change), 1 when it would refuse. Refused with `--json`, it prints
 * `{ applied: false, reason, message, changes | findings }`. Every `contract` command exits
 * 2 when it cannot run (an unreadable contract, no connection). The server is `--server`, else
 * `NATS_URL`, else `nats://127.0.0.1:4222`; the credentials and TLS files are read as a worker reads
 * them (`NATS_TOKEN`, `NATS_USER`/`NATS_PASSWORD`, `NATS_NKEY_SEED`, `NATS_CREDS`, `NATS_TLS_*`).
 * Log lines go to stderr. `migrate` (the database at `DATABASE_URL`, default
 * `postgres://postgres@127.0.0.1:5432/test`, named in its output): 0 applied
 * or up to date, 1 failed (nothing of the failed run is applied), 130 interrupted (rolled back).
 * A usage error exits 2. Each command's `--help` states its exit codes.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Contract, DeadLetter, NatsConnection, NatsError } from "@jetworker/nats"
import { Cause, ConfigProvider, Console, Duration, Effect, Exit, Layer, Logger, Option } from "effect"
import { Command, Flag, Prompt } from "effect/cli"
import { readFileSync } from "node:fs"
import * as ConfigCheck from "../ConfigCheck.ts"
import * as Contracts from "../Contracts.ts"
import * as Migrate from "../Migrate.ts"
import * as DeadLetters from "../DeadLetters.ts"

/** The package's own version (`--version`), from its package.json: two levels up from src/bin and dist/bin alike. */
const version = (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { readonly version: string }).version

/**
 * A command's --help text: the summary (also its line in the parent's list of subcommands), then
 * the details (exit codes, bounds), each on a line of its own.
 */
const described = (summary: string, ...details: ReadonlyArray<string>) =>
<Name extends string, Input, ContextInput, E, R>(
  self: Command.Command<Name, Input, ContextInput, E, R>
): Command.Command<Name, Input, ContextInput, E, R> =>
  self.pipe(Command.withShortDescription(summary), Command.withDescription([summary, ...details].join("\n  ")))

const check = Command.make("check", {
  manifest: Flag.FileText("manifest").pipe(
    Flag.withDescription("The Kubernetes manifest (YAML) whose Deployment or StatefulSet runs the worker")
  ),
  container: Flag.String("container").pipe(
    Flag.optional,
    Flag.withDescription("The worker's container (default: the workload's only container)")
  ),
  ackWait: Flag.String("ack-wait").pipe(
    Flag.optional,
    Flag.withDescription("The consumer's AckWait, e.g. \"30 seconds\"")
  ),
  ackWaitEnv: Flag.String("ack-wait-env").pipe(
    Flag.optional,
    Flag.withDescription("The container's environment variable holding the AckWait, e.g. LEDGER_ACK_WAIT")
  ),
  json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print the report as JSON"))
}, (input) =>
  Effect.gen(function*() {
    const ackWait = Option.isSome(input.ackWait) ? Duration.fromInput(input.ackWait.value as Duration.Input) : Option.none()
    if (Option.isSome(input.ackWait) && Option.isNone(ackWait)) {
      yield* Console.error(`jetworker config check: --ack-wait ${JSON.stringify(input.ackWait.value)} is not a duration (e.g. "30 seconds")`)
      process.exitCode = 2
      return
    }
    const report = yield* ConfigCheck.check({
      manifest: input.manifest,
      container: Option.getOrUndefined(input.container),
      ackWait: Option.getOrUndefined(ackWait),
      ackWaitEnv: Option.getOrUndefined(input.ackWaitEnv)
    }).pipe(Effect.result)
    if (report._tag === "Failure") {
      yield* Console.error(`jetworker config check: ${report.failure.message}`)
      process.exitCode = 2
      return
    }
    yield* Console.log(input.json ? JSON.stringify(report.success, null, 2) : ConfigCheck.format(report.success))
    if (!report.success.ok) process.exitCode = 1
  })).pipe(described(
    "Check the worker's shutdown and probe settings against its deployment manifest",
    "exit 0 the settings agree with the manifest (warnings allowed), 1 they disagree (the report says where), " +
      "2 it could not check (an unreadable manifest, no such container, bad arguments)"
  ))

const config = Command.make("config").pipe(
  Command.withDescription("Settings of a worker process"),
  Command.withSubcommands([check])
)

const server = Flag.String("server").pipe(
  Flag.optional,
  Flag.withDescription("The NATS server (default: NATS_URL, else nats://127.0.0.1:4222); credentials come from the URL (nats://user:password@host:4222 or nats://token@host:4222, percent-encoded) or from NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_NKEY_SEED or NATS_CREDS")
)

/** What a NATS command waits for at most (NatsConnection's connect and request defaults, and {@link withNats}'s drain). */
const natsBounds = "A server that does not answer fails the command (exit 2): 5 seconds for connecting or for a request, then at most 1 second closing"

/** The server a NATS command connects to, as its failures name it (without credentials). */
const serverOf = (serverFlag: Option.Option<string>): string =>
  NatsConnection.describeServers(Option.getOrElse(serverFlag, () => process.env.NATS_URL || "nats://127.0.0.1:4222"))

/**
 * Why the server setting is no server URL (nats.js would say only "Invalid URL"), or `undefined`;
 * the value is shown without its credentials.
 */
const unparsableServer = (serverFlag: Option.Option<string>): string | undefined => {
  const setting = Option.isSome(serverFlag) ? "--server" : "NATS_URL"
  for (const entry of Option.getOrElse(serverFlag, () => process.env.NATS_URL || "nats://127.0.0.1:4222").split(",")) {
    // Without its credentials (a password may hold an unescaped / or @); nats.js takes host:port
    // without a scheme too.
    const trimmed = NatsConnection.describeServers(entry.trim())
    if (trimmed !== "" && !URL.canParse(trimmed.includes("://") ? trimmed : `nats://${trimmed}`)) {
      return `${setting} ${JSON.stringify(NatsConnection.describeServers(trimmed))} is not a server URL (e.g. nats://127.0.0.1:4222)`
    }
  }
  return undefined
}

/** The setting that gave a NATS command its server, as its messages name it. */
const serverSettingOf = (serverFlag: Option.Option<string>): string =>
  Option.isSome(serverFlag) ? "--server" : "NATS_URL or --server"

/** A failure's hint for an operator, when the reason alone does not say what to do. */
const hintFor = (error: NatsError.NatsError): string =>
  // Nobody answers the JetStream API when the server runs without JetStream (10076 from some).
  error.reason === "NoResponders" || (error.reason === "ApiError" && error.code === 10076)
    ? "; the server must run with JetStream (nats-server -js)"
    : error.reason === "Timeout"
    ? "; the server did not answer within 5 seconds"
    : error.reason === "ApiError" && error.code === 10039
    ? "; the server runs JetStream, but the account these credentials log in to has no JetStream: enable it for that " +
      "account in the server's configuration (jetstream: enabled), or log in to an account that has it"
    : ""

/** Whether `error` means there is no usable connection (exit 2) rather than a refused operation (exit 1). */
const noConnection = (error: NatsError.NatsError): boolean =>
  error.reason === "NoResponders" || (error.reason === "ApiError" && (error.code === 10076 || error.code === 10039)) ||
  error.reason === "ConnectionRefused" || error.reason === "ConnectionClosed" || error.reason === "Timeout"

/**
 * Runs `effect` on a connection configured as `NatsConnection.layerConfig` reads the environment
 * (NATS_URL, NATS_TOKEN, NATS_USER and NATS_PASSWORD, NATS_NKEY_SEED, NATS_CREDS, NATS_TLS_*; an
 * empty variable is unset), `--server` replacing only the servers. No connection (unreachable,
 * credentials refused, lost, no JetStream answering or none for the account) exits 2, a refused
 * operation 1.
 */
const withNats = <A>(
  what: string,
  serverFlag: Option.Option<string>,
  effect: Effect.Effect<A, NatsError.NatsError, NatsConnection.NatsConnection>
) =>
  Effect.scoped(Effect.gen(function*() {
    const unparsable = unparsableServer(serverFlag)
    if (unparsable !== undefined) {
      yield* Console.error(`jetworker ${what}: ${unparsable}`)
      process.exitCode = 2
      return Option.none<A>()
    }
    // One attempt: a command reports a lost server instead of reconnecting forever as a worker does.
    // A short drain: nothing of a command waits to be sent at its end, and a server that stopped
    // answering would otherwise hold the exit for the default 5 seconds more.
    const nats = NatsConnection.layerConfig({
      name: "jetworker-cli",
      maxReconnectAttempts: 0,
      drainTimeout: "1 second",
      // A failed connection's next step names the CLI's setting, not a worker's.
      serversSetting: serverSettingOf(serverFlag)
    })
    const connected = yield* Layer.build(
      Option.isSome(serverFlag)
        ? Layer.provide(nats, ConfigProvider.layer(ConfigProvider.fromEnvRecord({ ...process.env, NATS_URL: serverFlag.value })))
        : nats
    ).pipe(Effect.result)
    if (connected._tag === "Failure") {
      const message = connected.failure.message
      const where = serverOf(serverFlag)
      // Connect failures name the server (NatsConnection words nats.js's own); one that does not
      // is still said to be about this server.
      yield* Console.error(
        `jetworker ${what}: ${message}${
          connected.failure._tag === "NatsError" && !message.includes(where)
            ? `: ${where} did not answer as a NATS server; is a nats-server running there? Set ${serverSettingOf(serverFlag)} to it`
            : ""
        }`
      )
      process.exitCode = 2
      return Option.none<A>()
    }
    const result = yield* effect.pipe(Effect.provide(connected.success), Effect.result)
    if (result._tag === "Success") return Option.some(result.success)
    const error = result.failure
    yield* Console.error(`jetworker ${what}: ${error.operation}: ${error.message}${hintFor(error)}`)
    process.exitCode = noConnection(error) ? 2 : 1
    return Option.none<A>()
  }))

const filterFlags = {
  consumer: Flag.String("consumer").pipe(Flag.optional, Flag.withDescription("Only dead letters of this consumer")),
  reason: Flag.String("reason").pipe(Flag.optional, Flag.withDescription("Only this reason, e.g. PermanentError, DeliveriesExhausted")),
  subject: Flag.String("subject").pipe(Flag.optional, Flag.withDescription("Only this original subject, or a NATS subject filter (orders.>)")),
  since: Flag.String("since").pipe(
    Flag.optional,
    Flag.withDescription("Only dead-lettered at or after this time: ISO 8601, 2026-12-01 (UTC) or 2026-12-01T10:00:00Z (an offset required)")
  ),
  until: Flag.String("until").pipe(
    Flag.optional,
    Flag.withDescription("Only dead-lettered before this time: ISO 8601, 2026-12-01 (UTC) or 2026-12-01T10:00:00Z (an offset required)")
  )
}

type FilterInput = { readonly [K in keyof typeof filterFlags]: Option.Option<string> }

/** A usage error found before connecting: reported, exit 2; `false` to the caller. */
const usageError = (what: string, message: string) =>
  Effect.as(
    Effect.andThen(Console.error(`jetworker ${what}: ${message}`), Effect.sync(() => {
      process.exitCode = 2
    })),
    false
  )

/** Whether `--sequence` (or `flag`, e.g. `--from`) names a stream sequence; one below 1 is a usage error. */
const validSequence = (what: string, sequence: number, flag = "--sequence") =>
  sequence >= 1
    ? Effect.succeed(true)
    : usageError(what, `${flag} takes a stream sequence, 1 or more (as dlq list shows them), got ${sequence}`)

/**
 * Whether `value` can name a stream or consumer (what nats.js checks before sending); anything
 * else is a usage error, not a refusal by the server (exit 1).
 */
const validName = (what: string, flag: string, value: string) =>
  value !== "" && !/[.*>/\\\s]/.test(value)
    ? Effect.succeed(true)
    : usageError(what, `${flag} ${JSON.stringify(value)} is not a NATS name: it is empty or holds ".", "*", ">", "/", "\\" or white space`)

/** The filter the flags give; a time that does not parse is reported (exit 2). */
const filterFrom = (what: string, input: FilterInput) =>
  Effect.gen(function*() {
    // Only ISO 8601 (DeadLetters.parseTime): Date.parse would read `--since 2` as February 2001.
    const time = (value: Option.Option<string>) => {
      if (Option.isNone(value)) return Option.some(undefined)
      const ms = DeadLetters.parseTime(value.value)
      return ms === undefined ? Option.none() : Option.some(ms)
    }
    const since = time(input.since)
    const until = time(input.until)
    if (Option.isNone(since) || Option.isNone(until)) {
      const given = [["--since", input.since], ["--until", input.until]] as const
      const bad = given.filter(([, value]) => Option.isSome(value) && DeadLetters.parseTime(value.value) === undefined)
        .map(([flag, value]) => `${flag} ${JSON.stringify(Option.getOrElse(value, () => ""))}`)
      yield* Console.error(
        `jetworker ${what}: ${bad.join(", ")}: --since and --until take an ISO 8601 date (2026-12-01, midnight UTC) ` +
          `or date-time with its offset (2026-12-01T10:00Z, 2026-12-01T10:00:00.250+01:00)`
      )
      process.exitCode = 2
      return Option.none<DeadLetters.Filter>()
    }
    return Option.some<DeadLetters.Filter>({
      consumer: Option.getOrUndefined(input.consumer),
      reason: Option.getOrUndefined(input.reason),
      subject: Option.getOrUndefined(input.subject),
      since: since.value,
      until: until.value
    })
  })

const dlqList = Command.make("list", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The dead-letter stream, e.g. LEDGER_DLQ")),
  from: Flag.Int("from").pipe(Flag.optional, Flag.withDescription("The first sequence to show, 1 or more (default: the oldest)")),
  limit: Flag.Int("limit").pipe(Flag.withDefault(100), Flag.withDescription("The most dead letters to show")),
  ...filterFlags,
  json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print them as JSON")),
  server
}, (input) =>
  Effect.gen(function*() {
    if (!(yield* validName("dlq list", "--stream", input.stream))) return
    const filter = yield* filterFrom("dlq list", input)
    if (Option.isNone(filter)) return
    // Refused as --sequence below 1 is: the server would list from the oldest, as if none was given.
    if (Option.isSome(input.from) && !(yield* validSequence("dlq list", input.from.value, "--from"))) return
    if (!(input.limit >= 1 && input.limit <= DeadLetters.maxSelected)) {
      yield* Console.error(`jetworker dlq list: --limit takes 1 to ${DeadLetters.maxSelected}`)
      process.exitCode = 2
      return
    }
    // The page says whether more match, also at the largest --limit. A source stream is refused
    // as replay and purge refuse it: listed, it would read "no dead letters" and exit 0.
    const found = yield* withNats(
      "dlq list",
      input.server,
      Effect.flatMap(DeadLetters.isDeadLetterStream(input.stream), (deadLetters) =>
        deadLetters
          ? Effect.map(
            DeadLetters.listPage(input.stream, { from: Option.getOrUndefined(input.from), limit: input.limit, filter: filter.value }),
            Option.some
          )
          : Effect.succeed(Option.none()))
    )
    if (Option.isNone(found)) return
    if (Option.isNone(found.value)) {
      yield* Console.error(`jetworker dlq list: ${DeadLetters.notDeadLetterStream(input.stream, "its first message", "listed")}`)
      process.exitCode = 2
      return
    }
    const { next, rows } = found.value.value
    yield* Console.log(input.json ? JSON.stringify(rows, null, 2) : DeadLetters.format(input.stream, rows))
    if (next !== undefined) {
      const more = `more dead letters match than --limit ${input.limit}; the next from --from ${next}`
      // On stderr under --json, which stays one JSON document.
      yield* input.json ? Console.error(`jetworker dlq list: ${more}`) : Console.log(more)
    }
  })).pipe(described(
    "List the dead letters of a dead-letter stream, with their cause",
    "exit 0 listed (it says when more match than --limit), 1 the server refused (no such stream), 2 bad arguments, " +
      "not a dead-letter stream (a source stream: it names its dead-letter stream), or no connection",
    natsBounds
  ))

const dlqShow = Command.make("show", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The dead-letter stream")),
  sequence: Flag.Int("sequence").pipe(Flag.withDescription("The dead letter's sequence (from dlq list)")),
  json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print it as JSON")),
  server
}, (input) =>
  Effect.gen(function*() {
    if (!(yield* validName("dlq show", "--stream", input.stream)) || !(yield* validSequence("dlq show", input.sequence))) return
    const read = yield* withNats("dlq show", input.server, DeadLetter.read(input.stream, input.sequence))
    if (Option.isNone(read)) return
    // Refused as replay and purge refuse it: shown as a dead letter, any stream's message would
    // print empty causes and a made-up source, and exit 0.
    if (!DeadLetter.isDeadLetter(read.value)) {
      yield* Console.error(
        `jetworker dlq show: ${input.stream}#${input.sequence} is not a dead letter (it has no ${DeadLetter.Header.stream} header), ` +
          `nothing shown; if ${input.stream} is a source stream, its consumers' dead letters are in ` +
          DeadLetter.destination(input.stream, "-").stream
      )
      process.exitCode = 2
      return
    }
    const detail = DeadLetters.detail(read.value)
    yield* Console.log(input.json ? JSON.stringify(detail, null, 2) : DeadLetters.formatDetail(input.stream, detail))
  })).pipe(described(
    "Show one dead letter in full: cause, headers and payload",
    "exit 0 shown, 1 the server refused (no such stream or message), 2 bad arguments, not a dead letter, or no connection",
    natsBounds
  ))

/**
 * `dlq replay` and `dlq purge` over a selection: one `--sequence`, or the filters, or `--all`;
 * `--dry-run` lists the selection; otherwise, unless `--yes`, a terminal confirms (without one the
 * command refuses), and the run is paced at `--rate` a second with a progress bar on stderr.
 *
 * At most `--max` are selected, oldest first. When more match, the dry run and the run say so on
 * stderr ("more dead letters match than --max N; the next from sequence S") and exit 0 all the
 * same: at most `--max` was asked and done; running the command again takes the next ones.
 * `--json` prints one document: `count`, how many were selected, and `next`, the sequence of the
 * first that matches and was left out by `--max` (`null` when none was); in a dry run `selected`
 * is the selected rows, in a run their number, with `done`, `stored`, `failed` and `stopped`.
 */
const bulk = (action: DeadLetters.BulkResult["action"], description: string, confirmSingle: boolean) =>
  Command.make(action, {
    stream: Flag.String("stream").pipe(Flag.withDescription("The dead-letter stream")),
    sequence: Flag.Int("sequence").pipe(Flag.optional, Flag.withDescription("One dead letter's sequence (from dlq list)")),
    ...filterFlags,
    all: Flag.Boolean("all").pipe(Flag.withDefault(false), Flag.withDescription("Every dead letter of the stream (when no filter is given)")),
    dryRun: Flag.Boolean("dry-run").pipe(Flag.withDefault(false), Flag.withDescription("List what would be done, change nothing")),
    yes: Flag.Boolean("yes").pipe(Flag.withDefault(false), Flag.withDescription("Do it without asking")),
    rate: Flag.Int("rate").pipe(Flag.withDefault(50), Flag.withDescription("At most this many a second (1 to 10000)")),
    max: Flag.Int("max").pipe(
      Flag.withDefault(10_000),
      Flag.withDescription(`At most this many in one run, oldest first (at most ${DeadLetters.maxSelected}); it says when more match`)
    ),
    json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print the result as JSON")),
    server
  }, (input) =>
    Effect.gen(function*() {
      const what = `dlq ${action}`
      if (!(yield* validName(what, "--stream", input.stream))) return
      const filter = yield* filterFrom(what, input)
      if (Option.isNone(filter)) return
      const single = Option.isSome(input.sequence)
      if (single && !(yield* validSequence(what, input.sequence.value))) return
      if (single && (!DeadLetters.isEmpty(filter.value) || input.all)) {
        yield* Console.error(`jetworker ${what}: --sequence names one dead letter; it takes no filter (--consumer, --reason, --subject, --since, --until) or --all`)
        process.exitCode = 2
        return
      }
      if (!single && DeadLetters.isEmpty(filter.value) && !input.all) {
        yield* Console.error(`jetworker ${what}: name the dead letters: --sequence N, a filter (--consumer, --reason, --subject, --since, --until), or --all`)
        process.exitCode = 2
        return
      }
      if (!(input.rate >= 1 && input.rate <= 10_000) || !(input.max >= 1 && input.max <= DeadLetters.maxSelected)) {
        yield* Console.error(`jetworker ${what}: --rate takes 1 to 10000, --max 1 to ${DeadLetters.maxSelected}`)
        process.exitCode = 2
        return
      }
      const verb = action === "replay" ? "replayed" : "purged"
      const selected = yield* withNats(
        what,
        input.server,
        Effect.gen(function*() {
          // Only a dead-letter stream: the named message, or the stream's oldest, must be a dead
          // letter (any other stream's message has no dead-letter headers, whatever its name).
          if (single) {
            const named = yield* DeadLetter.read(input.stream, input.sequence.value)
            return DeadLetter.isDeadLetter(named) ? Option.some<DeadLetters.Selection>({ messages: [named], next: undefined }) : Option.none()
          }
          // One more than --max is read, so that a selection --max cut is told from a complete one.
          return (yield* DeadLetters.isDeadLetterStream(input.stream))
            ? Option.some(yield* DeadLetters.selectPage(input.stream, filter.value, { limit: input.max }))
            : Option.none()
        })
      )
      if (Option.isNone(selected)) return
      if (Option.isNone(selected.value)) {
        yield* Console.error(
          `jetworker ${what}: ${DeadLetters.notDeadLetterStream(input.stream, single ? `#${input.sequence.value}` : "its first message", verb)}`
        )
        process.exitCode = 2
        return
      }
      const { messages, next } = selected.value.value
      // --max left some out: said on stderr (stdout stays the result, or one JSON document) and as
      // `next` in the JSON. Still exit 0: what was asked, at most --max, was done.
      const cut = next === undefined ? "" : ` (--max ${input.max}: more match)`
      const sayMore = next === undefined ? Effect.void : Console.error(
        `jetworker ${what}: more dead letters match than --max ${input.max}; the next from sequence ${next}` +
          (input.dryRun ? "" : `, not ${verb}: run the command again for the rest`)
      )
      // `count` is how many were selected in both; `selected` is their rows in a dry run, their number in a run.
      const json = (result: object) => JSON.stringify({ ...result, next: next ?? null }, null, 2)
      if (input.dryRun || messages.length === 0) {
        const rows = messages.map((m) => ({ sequence: m.sequence, reason: m.reason, subject: m.subject, eventId: m.eventId }))
        const nothing: DeadLetters.BulkResult = { action, selected: 0, done: 0, stored: [], failed: [] }
        yield* Console.log(
          input.json
            ? json(input.dryRun ? { action, dryRun: true, count: rows.length, selected: rows } : { ...nothing, count: 0 })
            : messages.length === 0
            ? `no dead letters in ${input.stream} match`
            : [`would ${action} ${messages.length} dead letter(s) of ${input.stream}:`, ...rows.map((r) => `  #${r.sequence} ${r.reason} ${r.subject} (event ${r.eventId ?? "-"})`)].join("\n")
        )
        yield* sayMore
        return
      }
      if (!input.yes && (confirmSingle || !single)) {
        if (!process.stdin.isTTY) {
          yield* Console.error(`jetworker ${what}: not done: ${messages.length} dead letter(s) selected${cut}; without a terminal to confirm, pass --yes (or --dry-run to see them)`)
          process.exitCode = 1
          return
        }
        const confirmed = yield* Prompt.Confirm({ message: `${action} ${messages.length} dead letter(s) of ${input.stream}${cut}?` }).pipe(
          Effect.orElseSucceed(() => false)
        )
        if (!confirmed) {
          yield* Console.error(`jetworker ${what}: not done`)
          process.exitCode = 1
          return
        }
      }
      const tty = process.stderr.isTTY === true
      const result = yield* withNats(what, input.server, DeadLetters.run(action, input.stream, messages, {
        rate: input.rate,
        onProgress: (done, total) =>
          total < 2
            ? Effect.void
            : tty
            ? Effect.sync(() => process.stderr.write(`\r${DeadLetters.progressBar(done, total)}${done === total ? "\n" : ""}`))
            : done % 100 === 0 || done === total
            ? Console.error(`${action}: ${done}/${total}`)
            : Effect.void,
        // Ctrl-C: what was done is done; say how much.
        onInterrupt: (done, total) =>
          Console.error(`${tty ? "\n" : ""}jetworker ${what}: interrupted: ${verb} ${done} of ${total} dead letter(s) of ${input.stream}`)
      }))
      if (Option.isNone(result)) return
      const r = result.value
      if (tty && r.stopped !== undefined) process.stderr.write("\n")
      if (input.json) {
        yield* Console.log(json({ ...r, count: r.selected }))
      } else {
        yield* Console.log(
          single && r.stored.length === 1
            ? `replayed ${input.stream}#${r.stored[0]!.sequence}: stored as ${r.stored[0]!.stream}#${r.stored[0]!.seq}` +
              `${r.stored[0]!.duplicate ? " (a duplicate of an earlier replay)" : ""}; the dead letter is removed`
            : `${verb} ${r.done} of ${r.selected} dead letter(s) of ${input.stream}` +
              (r.failed.length === 0 ? "" : `; ${r.failed.length} failed:\n${r.failed.map((f) => `  #${f.sequence}: ${f.message}`).join("\n")}`)
        )
      }
      yield* sayMore
      if (r.stopped !== undefined) {
        yield* Console.error(
          `jetworker ${what}: stopped, ${r.done} of ${r.selected} ${verb}, ${r.selected - r.done - r.failed.length} not tried: ${r.stopped}`
        )
        process.exitCode = 2
      } else if (r.failed.length > 0) {
        if (single) yield* Console.error(`jetworker ${what}: ${r.failed[0]!.message}`)
        process.exitCode = 1
      }
    })).pipe(described(
      description,
      "exit 0 done (or nothing selected; also when --max left some that match out: it says so on stderr, and as next in --json), " +
        "1 the server refused, a dead letter failed, or not confirmed, 2 bad arguments, " +
        "not a dead-letter stream, or no connection (a run that loses it stops and says how many were done), " +
        "130 interrupted (it says how many were done)",
      natsBounds
    ))

const dlqReplay = bulk(
  "replay",
  "Publish dead letters again to their original subject (their cause fixed), then remove them",
  false
)

const dlqPurge = bulk("purge", "Delete dead letters without replaying them", true)

const dlqRecover = Command.make("recover", {
  stream: Flag.String("stream").pipe(Flag.withDescription("The source stream that still holds the message")),
  consumer: Flag.String("consumer").pipe(Flag.withDescription("The consumer that gave up on it")),
  sequence: Flag.Int("sequence").pipe(Flag.withDescription("The message's sequence (from dead-letter.stranded or the MaxDeliver advisory)")),
  server
}, (input) =>
  Effect.gen(function*() {
    if (
      !(yield* validName("dlq recover", "--stream", input.stream)) || !(yield* validName("dlq recover", "--consumer", input.consumer)) ||
      !(yield* validSequence("dlq recover", input.sequence))
    ) return
    // The dead-letter stream as it is: never created (a mistyped --stream would leave a stray
    // <NAME>_DLQ) nor brought to the default limits.
    const deadLetters = DeadLetter.destination(input.stream, input.consumer).stream
    const ack = yield* withNats(
      "dlq recover",
      input.server,
      DeadLetter.recover({ stream: input.stream, consumer: input.consumer, sequence: input.sequence, deadLetter: { create: false } }).pipe(
        Effect.mapError((error) =>
          error.reason === "StreamNotFound" && error.operation === `dead-letter stream ${deadLetters}`
            ? new NatsError.NatsError({
              ...error,
              message: "does not exist, and dlq recover does not create it: check --stream and --consumer " +
                "(a consumer's source creates its dead-letter stream when it starts)"
            })
            : error
        )
      )
    )
    if (Option.isNone(ack)) return
    yield* Console.log(`stored ${input.stream}#${input.sequence} as dead letter ${ack.value.stream}#${ack.value.seq}${ack.value.duplicate ? " (it was already there)" : ""}`)
  })).pipe(described(
    "Store a message the broker stopped delivering in the consumer's dead-letter stream",
    "exit 0 stored, 1 the server refused (no such stream, consumer, message or dead-letter stream), 2 bad arguments or no connection",
    natsBounds
  ))

const dlq = Command.make("dlq").pipe(
  Command.withDescription("Inspect, replay and purge dead letters"),
  Command.withSubcommands([dlqList, dlqShow, dlqReplay, dlqPurge, dlqRecover])
)

const contractFile = Flag.FileText("contract").pipe(
  Flag.withDescription("The service's contract with its stream (JSON), e.g. examples/ledger/contract.json")
)
const jsonFlag = Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("Print the result as JSON"))

/** Reads the contract file; an unreadable one is reported and exits 2. */
const readContract = (what: string, text: string) =>
  Contracts.read(text).pipe(
    Effect.map(Option.some),
    Effect.catch((error) =>
      Effect.as(
        Effect.andThen(Console.error(`jetworker ${what}: the contract is unreadable: ${error.message}`), Effect.sync(() => {
          process.exitCode = 2
        })),
        Option.none<Contract.Contract>()
      )
    )
  )

const contractCheck = Command.make("check", { contract: contractFile, json: jsonFlag, server }, (input) =>
  Effect.gen(function*() {
    const contract = yield* readContract("contract check", input.contract)
    if (Option.isNone(contract)) return
    const findings = yield* withNats("contract check", input.server, Contract.check(contract.value))
    if (Option.isNone(findings)) return
    const ok = !findings.value.some((f) => f.severity === "error")
    yield* Console.log(
      input.json ? JSON.stringify({ ok, findings: findings.value }, null, 2) : Contracts.formatFindings(contract.value, findings.value)
    )
    if (!ok) process.exitCode = 1
  })).pipe(described(
    "Check the live stream and consumers against the contract: settings, timeouts, attempts, capacity",
    "exit 0 the server fits the contract (warnings allowed), 1 it does not (the report says where), " +
      "2 it cannot check (an unreadable contract, no connection)",
    natsBounds
  ))

const contractDiff = Command.make("diff", { contract: contractFile, json: jsonFlag, server }, (input) =>
  Effect.gen(function*() {
    const contract = yield* readContract("contract diff", input.contract)
    if (Option.isNone(contract)) return
    const changes = yield* withNats("contract diff", input.server, Contract.plan(contract.value))
    if (Option.isNone(changes)) return
    yield* Console.log(input.json ? JSON.stringify(changes.value, null, 2) : Contracts.formatChanges(contract.value, changes.value))
    if (changes.value.length > 0) process.exitCode = 1
  })).pipe(described(
    "Show what contract apply would change on the server (writes nothing)",
    "exit 0 nothing to change, 1 changes pending, 2 it cannot run (an unreadable contract, no connection)",
    natsBounds
  ))

/**
 * Reports an apply that writes nothing (exit 1): why on stderr and, with `--json`, as the stdout
 * document `{ applied: false, reason, message, changes | findings }` (`findings` when the contract
 * contradicts itself, else the changes concerned).
 */
const notApplied = (
  input: { readonly json: boolean; readonly dryRun: boolean },
  reason: string,
  message: string,
  detail: { readonly changes?: ReadonlyArray<unknown> | undefined; readonly findings?: ReadonlyArray<unknown> | undefined }
) =>
  Effect.gen(function*() {
    yield* Console.error(`jetworker contract apply: ${input.dryRun ? "it would not apply" : "not applied"} (${reason}): ${message}`)
    if (input.json) {
      const why = detail.findings === undefined ? { changes: detail.changes ?? [] } : { findings: detail.findings }
      yield* Console.log(JSON.stringify({ applied: false, reason, message, ...why }, null, 2))
    }
    process.exitCode = 1
  })

const contractApply = Command.make("apply", {
  contract: contractFile,
  dryRun: Flag.Boolean("dry-run").pipe(
    Flag.withDefault(false),
    Flag.withDescription("Show the changes and whether they would be applied, write nothing")
  ),
  yes: Flag.Boolean("yes").pipe(Flag.withDefault(false), Flag.withDescription("Apply without asking")),
  allowDataLoss: Flag.Boolean("allow-data-loss").pipe(
    Flag.withDefault(false),
    Flag.withDescription(
      "Apply changes that delete stored messages (a stream's lower limit on messages, bytes or age, discard new to old; " +
        "the plan marks them DELETES DATA): refused without it"
    )
  ),
  json: jsonFlag,
  server
}, (input) =>
  Effect.gen(function*() {
    const contract = yield* readContract("contract apply", input.contract)
    if (Option.isNone(contract)) return
    const planned = yield* withNats("contract apply", input.server, Contract.plan(contract.value))
    if (Option.isNone(planned)) return
    const changes = planned.value
    if (!input.json) yield* Console.log(Contracts.formatChanges(contract.value, changes))
    if (changes.length === 0) {
      if (input.json) yield* Console.log(JSON.stringify({ applied: false, changes }, null, 2))
      return
    }
    const options = { allowDataLoss: input.allowDataLoss, dryRun: input.dryRun }
    // Contract.apply refuses these before writing anything: no confirmation is asked for them.
    const refused = contract.value.ownership === "platform" || changes.some((change) => change.action === "refuse") ||
      (!input.allowDataLoss && changes.some((change) => change.destructive === true))
    if (!input.yes && !input.dryRun && !refused) {
      if (!process.stdin.isTTY) {
        return yield* notApplied(input, "NotConfirmed", "without a terminal to confirm, pass --yes", { changes })
      }
      const destructive = changes.filter((change) => change.destructive === true).length
      const confirmed = yield* Prompt.Confirm({
        message: `apply ${changes.length} change(s) to ${contract.value.stream.name}` +
          `${destructive > 0 ? ` (${destructive} deleting stored messages)` : ""}?`
      }).pipe(Effect.orElseSucceed(() => false))
      if (!confirmed) return yield* notApplied(input, "NotConfirmed", "not confirmed", { changes })
    }
    const applied = yield* withNats(
      "contract apply",
      input.server,
      Effect.gen(function*() {
        const done = yield* Contract.apply(contract.value, options)
        // A dry run wrote nothing: the check after an apply would say what it said before.
        const findings = input.dryRun ? undefined : yield* Contract.check(contract.value)
        return { done, findings }
      }).pipe(
        Effect.catchTag("ContractError", (error) =>
          Effect.as(
            notApplied(input, error.reason, error.message, {
              changes: error.changes ?? (error.findings === undefined ? changes : undefined),
              findings: error.findings
            }),
            undefined
          ))
      )
    )
    if (Option.isNone(applied) || applied.value === undefined) return
    const { done, findings } = applied.value
    if (findings === undefined) {
      // A dry run the apply would go ahead with: the plan printed above.
      if (input.json) yield* Console.log(JSON.stringify({ applied: false, changes: done }, null, 2))
      return
    }
    const ok = !findings.some((f) => f.severity === "error")
    yield* Console.log(
      input.json
        ? JSON.stringify({ applied: true, changes: done, ok, findings }, null, 2)
        : `applied ${done.length} change(s)\n${Contracts.formatFindings(contract.value, findings)}`
    )
    if (!ok) process.exitCode = 1
  })).pipe(described(
    "Create or update the stream and consumers to a service-owned contract",
    "exit 0 applied (or nothing to change) and the server then fits, 1 refused (platform-owned, contradictory, a change " +
      "the server cannot make in place, a change that deletes stored messages without --allow-data-loss, not confirmed) " +
      "or errors remain, 2 it cannot run (an unreadable contract, no connection)",
    "--dry-run writes nothing and exits as the apply would be decided: 0 it would apply the changes shown (or there are " +
      "none), 1 it would refuse them (the reason on stderr; diff exits 1 for any pending change)",
    "--json prints one document on stdout: { applied: true, changes, ok, findings }, or { applied: false, changes } " +
      "(nothing to change, or a dry run), or { applied: false, reason, message, changes | findings } when refused",
    natsBounds
  ))

const contractCommand = Command.make("contract").pipe(
  Command.withDescription("Check, diff and apply a service's contract with its stream"),
  Command.withSubcommands([contractCheck, contractDiff, contractApply])
)

const migrate = Command.make("migrate", {
  sql: Flag.Boolean("sql").pipe(Flag.withDefault(false), Flag.withDescription("Print the migrations' SQL (for psql) instead of applying them"))
}, (input) =>
  input.sql
    ? Console.log(Migrate.script)
    : Migrate.migrate.pipe(
      Effect.asVoid,
      Effect.catch(() => Effect.sync(() => {
        process.exitCode = 1
      }))
    )).pipe(described(
    `Apply jetworker's PostgreSQL migrations to DATABASE_URL (default ${Migrate.defaultUrl}, used when it is not set)`,
    "It prints the database it migrates (host, port, database and schema; never the password), then what it applied",
    "exit 0 applied or up to date, 1 failed (nothing of the failed run is applied; the reason and a next step on stderr), " +
      "2 bad arguments, 130 interrupted (rolled back)",
    "It gives up on a database that does not answer after 5 seconds (connecting), and on a lock another session holds after 30 seconds"
  ))

const jetworker = Command.make("jetworker").pipe(
  described(
    "Operate jetworker workers",
    "exit 0 done (a check: passed), 1 a check failed or the server refused, 2 bad arguments or no connection, " +
      "130 interrupted; each command's --help says which",
    natsBounds.replace("A server", "For the NATS commands (dlq, contract), a server")
  ),
  Command.withSubcommands([config, dlq, contractCommand, migrate])
)

// A failure here is a usage error (effect/cli has printed it) or an unreadable file: exit 2; an
// interruption (SIGINT, SIGTERM) exits 130.
Command.run(jetworker, { version }).pipe(
  // Log lines (e.g. a lost connection) go to stderr: stdout is the report, or the --json document.
  Effect.provideService(Logger.LogToStderr, true),
  Effect.provide(NodeServices.layer),
  NodeRuntime.runMain({
    disableErrorReporting: true,
    teardown: (exit, onExit) =>
      onExit(Exit.isSuccess(exit) ? Number(process.exitCode ?? 0) : Cause.hasInterruptsOnly(exit.cause) ? 130 : 2)
  })
)

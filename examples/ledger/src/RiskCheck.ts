/**
 * The ledger's one external client: an optional risk service asked over HTTP before a transfer is
 * applied (`LEDGER_RISK_URL`; off by default). It posts the transfer as JSON and expects
 * `{"allow": true}` or `{"allow": false, "reason": "..."}`. A refusal is a permanent business
 * error (`TransferRefused`: dead-lettered, no effect); a service that cannot be reached, answers
 * another status or does not answer within `LEDGER_RISK_TIMEOUT` is transient
 * (`RiskCheckUnavailable`: retried). It runs inside the transfer's transaction, after the dedup
 * row, so a duplicate never asks again. The HTTP client is a resource of the worker (an undici
 * agent closed by the shutdown procedure).
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Lifecycle } from "@jetworker/core"
import { Config, Context, Data, Duration, Effect, Layer, Option } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import type { TransferEvent } from "./TransferEvent.ts"

/** The risk service refused the transfer; permanent. */
export class TransferRefused extends Data.TaggedError("TransferRefused")<{
  readonly transferId: string
  readonly reason: string
  readonly message: string
}> {}

/** The risk service could not be asked; transient. */
export class RiskCheckUnavailable extends Data.TaggedError("RiskCheckUnavailable")<{
  readonly transferId: string
  readonly message: string
}> {}

/** Asks whether a transfer may be applied. */
export interface RiskCheckShape {
  readonly check: (event: TransferEvent) => Effect.Effect<void, TransferRefused | RiskCheckUnavailable>
}

/** Allows every transfer (no risk service configured). */
export const allowAll: RiskCheckShape = { check: () => Effect.void }

/** The risk check in effect; allows everything unless a layer provides a service. */
export const RiskCheck = Context.Reference<RiskCheckShape>("@jetworker/example-ledger/RiskCheck", {
  defaultValue: () => allowAll
})

/** Allows every transfer. */
export const layerAllowAll: Layer.Layer<never> = Layer.succeed(RiskCheck, allowAll)

/** Asks the service at `url`, each call bounded by `timeout`. */
export const layerHttp = (url: string, timeout: Duration.Input): Layer.Layer<never, never, HttpClient.HttpClient> =>
  Layer.effect(
    RiskCheck,
    Effect.gen(function*() {
      const client = yield* HttpClient.HttpClient
      const check = (event: TransferEvent) =>
        Effect.gen(function*() {
          const unavailable = (message: string) => new RiskCheckUnavailable({ transferId: event.id, message })
          const request = HttpClientRequest.post(url).pipe(
            HttpClientRequest.bodyJsonUnsafe({
              id: event.id,
              from: event.from,
              to: event.to,
              amount: event.amount,
              currency: event.currency
            })
          )
          const response = yield* client.execute(request).pipe(
            Effect.timeoutOrElse({
              duration: timeout,
              orElse: () => Effect.fail(unavailable(`risk service did not answer within ${Duration.format(Duration.fromInputUnsafe(timeout))}`))
            }),
            Effect.mapError((error) => error._tag === "RiskCheckUnavailable" ? error : unavailable(`risk service: ${error.message}`))
          )
          if (response.status !== 200) return yield* unavailable(`risk service answered ${response.status}`)
          const body = yield* response.json.pipe(Effect.mapError((error) => unavailable(`risk service: ${error.message}`)))
          const verdict = body as { readonly allow?: unknown; readonly reason?: unknown } | null
          if (verdict === null || typeof verdict !== "object" || typeof verdict.allow !== "boolean") {
            return yield* unavailable(`risk service answered ${JSON.stringify(body).slice(0, 200)}, not {"allow": boolean}`)
          }
          if (!verdict.allow) {
            const reason = typeof verdict.reason === "string" ? verdict.reason : "refused"
            return yield* new TransferRefused({ transferId: event.id, reason, message: `risk service refused: ${reason}` })
          }
        })
      return { check }
    })
  )

/**
 * From `LEDGER_RISK_URL` (unset: allow all) and `LEDGER_RISK_TIMEOUT` (default `2 seconds`),
 * with its own HTTP client as a worker resource named `http-client`.
 */
export const layerConfig: Layer.Layer<never, Config.ConfigError | Lifecycle.InvalidCheckInterval> = Layer.unwrap(
  Effect.gen(function*() {
    const url = yield* Config.String("LEDGER_RISK_URL").pipe(Config.option)
    const timeout = yield* Config.Duration("LEDGER_RISK_TIMEOUT").pipe(Config.withDefault(Duration.seconds(2)))
    return Option.isNone(url)
      ? layerAllowAll
      : layerHttp(url.value, timeout).pipe(Layer.provide(Lifecycle.resource("http-client", NodeHttpClient.layerUndici)))
  })
)

/** Asks the risk service in effect about `event`. */
export const check = (event: TransferEvent) => RiskCheck.use((risk) => risk.check(event))

/**
 * The `OTEL_*` values `Otlp.settings` reads, checked: each parser returns the value, or why it
 * cannot be honoured (naming the variable), so the settings can list every problem at once.
 */
import { ErrorSummary } from "@jetworker/core"
import { Config, Option } from "effect"

export const optionalString = (name: string) =>
  Config.String(name).pipe(Config.option, Config.map((o) => (Option.isSome(o) && o.value.trim() !== "" ? o.value.trim() : undefined)))

export const optionalSecret = (name: string) =>
  Config.Redacted(name).pipe(Config.option, Config.map((o) => (Option.isSome(o) ? o.value : undefined)))

// What a timer holds: a longer delay fires at once in Node, so every export would time out.
const MAX_INT = 2_147_483_647

/** `raw` as a whole number from 1 to 2147483647 (`fallback` when absent), or why it is not one. */
export const positiveInt = (name: string, raw: string | undefined, fallback: number): number | string =>
  raw === undefined
    ? fallback
    : /^\d+$/.test(raw) && Number(raw) >= 1 && Number(raw) <= MAX_INT
    ? Number(raw)
    : `${name} must be a whole number from 1 to ${MAX_INT}, got ${JSON.stringify(raw)}`

/** Whether the exporter variable `name` turns its channel off (`none`), or why its value cannot be honoured. */
export const exporterOff = (name: string, value: string | undefined): boolean | string => {
  if (value === undefined) return false
  const listed = value.toLowerCase().split(",").map((v) => v.trim()).filter((v) => v !== "")
  const unsupported = listed.filter((v) => v !== "otlp" && v !== "none")
  if (unsupported.length > 0) {
    return `${name} is ${JSON.stringify(value)}: only "otlp" (OTLP over HTTP) and "none" are supported here`
  }
  return listed.length > 0 && listed.every((v) => v === "none")
}

/** Why the protocol variable `name` cannot be honoured (this exporter speaks OTLP/HTTP), or `undefined`. */
export const protocolProblem = (name: string, value: string | undefined): string | undefined =>
  value === undefined || ["http/json", "http/protobuf"].includes(value.toLowerCase())
    ? undefined
    : `${name} is ${JSON.stringify(value)}: only OTLP over HTTP (http/json, http/protobuf) is sent, to the collector's HTTP port (4318)`

export const endpoint = (base: string | undefined, own: string | undefined, off: boolean, path: string) => {
  if (off) return undefined
  if (own !== undefined) return own
  return base === undefined ? undefined : `${base.replace(/\/+$/, "")}${path}`
}

/**
 * Why the endpoint in `variable` cannot be exported to (not an `http:` or `https:` URL), naming the
 * variable and the endpoint without its credentials; `undefined` when it can.
 */
export const endpointProblem = (variable: string, value: string | undefined): string | undefined => {
  if (value === undefined) return undefined
  const url = URL.canParse(value) ? new URL(value) : undefined
  return url !== undefined && (url.protocol === "http:" || url.protocol === "https:")
    ? undefined
    : `${variable} must be an http:// or https:// URL, got ${ErrorSummary.withoutCredentials(value)}`
}

/**
 * OTLP request headers (`OTEL_EXPORTER_OTLP_HEADERS`: an API key): parsed as the OpenTelemetry
 * specification writes them, and kept `Redacted`, since their values are secrets.
 */
import { Redacted } from "effect"

/** OTLP request headers by name; the values are secrets (an API key), so they are `Redacted`. */
export type Headers = Readonly<Record<string, Redacted.Redacted<string>>>

// An HTTP header name (RFC 9110 token) and a value Node will send (no control characters).
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]+$/

/**
 * The header list in `name` (`key=value,key=value`, values percent-encoded, as the OpenTelemetry
 * specification has it), or why it is malformed. A message names the variable, the entry's
 * position and at most the header's name, never a value: the value is the secret.
 */
export const parseHeaders = (name: string, secret: Redacted.Redacted<string> | undefined): Record<string, string> | string => {
  const headers: Record<string, string> = {}
  if (secret === undefined) return headers
  const entries = Redacted.value(secret).split(",")
  for (let i = 0; i < entries.length; i++) {
    const entry = entries[i]!.trim()
    if (entry === "") continue
    const where = `${name} entry ${i + 1}`
    const at = entry.indexOf("=")
    if (at < 0) return `${where} is not key=value (the value is not shown: it may be a secret)`
    const key = entry.slice(0, at).trim()
    if (!HEADER_NAME.test(key)) return `${where} does not start with a header name (key=value; the entry is not shown)`
    let value: string
    try {
      value = decodeURIComponent(entry.slice(at + 1).trim())
    } catch {
      return `${where} (${key}): the value is not valid percent-encoding (it is not shown)`
    }
    if (!HEADER_VALUE.test(value)) {
      return `${where} (${key}): the value is empty or holds a character a header cannot carry (it is not shown)`
    }
    headers[key.toLowerCase()] = value
  }
  return headers
}

export const redact = (headers: Record<string, string>): Headers =>
  Object.fromEntries(Object.entries(headers).map(([key, value]) => [key, Redacted.make(value)]))

export const plainHeaders = (headers: Headers | undefined): Record<string, string> =>
  Object.fromEntries(Object.entries(headers ?? {}).map(([k, v]) => [k, Redacted.value(v)]))

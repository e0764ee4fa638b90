/**
 * A strict reader of the Prometheus text exposition format (version 0.0.4), for tests that
 * scrape `/metrics`: it throws on the first line that is not a comment, a `# HELP`/`# TYPE` line
 * or a well-formed sample, on a `# TYPE` given twice or after its family's samples, and on an
 * unknown type. It returns the samples with their labels.
 */

/** One sample line. */
export interface Sample {
  readonly name: string
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

const METRIC = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/
const TYPES = new Set(["counter", "gauge", "histogram", "summary", "untyped"])
const SUFFIXES = ["_total", "_bucket", "_sum", "_count", "_created"]

const parseValue = (text: string, line: string): number => {
  if (text === "+Inf") return Infinity
  if (text === "-Inf") return -Infinity
  if (text === "NaN") return Number.NaN
  if (!/^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`bad value ${JSON.stringify(text)} in: ${line}`)
  return Number(text)
}

const parseLabels = (text: string, line: string): Record<string, string> => {
  const labels: Record<string, string> = {}
  let i = 0
  while (i < text.length) {
    const eq = text.indexOf("=", i)
    if (eq < 0) throw new Error(`bad labels in: ${line}`)
    const name = text.slice(i, eq)
    if (!LABEL.test(name)) throw new Error(`bad label name ${JSON.stringify(name)} in: ${line}`)
    if (text[eq + 1] !== "\"") throw new Error(`label value not quoted in: ${line}`)
    let j = eq + 2
    let value = ""
    for (; j < text.length && text[j] !== "\""; j++) {
      if (text[j] === "\\") {
        const next = text[++j]
        if (next === "n") value += "\n"
        else if (next === "\\" || next === "\"") value += next
        else throw new Error(`bad escape in: ${line}`)
      } else value += text[j]
    }
    if (j >= text.length) throw new Error(`unterminated label value in: ${line}`)
    if (name in labels) throw new Error(`label ${name} twice in: ${line}`)
    labels[name] = value
    i = j + 1
    if (i < text.length) {
      if (text[i] !== ",") throw new Error(`expected "," between labels in: ${line}`)
      i++
    }
  }
  return labels
}

const familyOf = (name: string, typed: ReadonlyMap<string, string>): string => {
  if (typed.has(name)) return name
  for (const suffix of SUFFIXES) {
    if (name.endsWith(suffix) && typed.has(name.slice(0, -suffix.length))) return name.slice(0, -suffix.length)
  }
  return name
}

/** Parses `text`; throws an Error naming the offending line. */
export const parsePrometheusText = (text: string): ReadonlyArray<Sample> => {
  if (text.length > 0 && !text.endsWith("\n")) throw new Error("the exposition must end with a newline")
  const typed = new Map<string, string>()
  const sampled = new Set<string>()
  const samples: Array<Sample> = []
  for (const line of text.split("\n")) {
    if (line === "") continue
    if (line.startsWith("#")) {
      const parts = line.split(/ +/)
      if (parts[1] === "TYPE") {
        const [, , name, type, ...rest] = parts
        if (name === undefined || !METRIC.test(name) || type === undefined || !TYPES.has(type) || rest.length > 0) {
          throw new Error(`bad TYPE line: ${line}`)
        }
        if (typed.has(name)) throw new Error(`TYPE given twice for ${name}`)
        if (sampled.has(name)) throw new Error(`TYPE for ${name} after its samples`)
        typed.set(name, type)
      } else if (parts[1] === "HELP") {
        if (parts[2] === undefined || !METRIC.test(parts[2])) throw new Error(`bad HELP line: ${line}`)
      }
      continue
    }
    const match = /^([^{\s]+)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?$/.exec(line)
    if (match === null) throw new Error(`not a sample: ${line}`)
    const name = match[1]!
    if (!METRIC.test(name)) throw new Error(`bad metric name ${JSON.stringify(name)} in: ${line}`)
    const labels = match[2] === undefined || match[2] === "" ? {} : parseLabels(match[2], line)
    sampled.add(familyOf(name, typed))
    samples.push({ name, labels, value: parseValue(match[3]!, line) })
  }
  return samples
}

/**
 * The process's memory in the Prometheus text format, read when `/metrics` is scraped: what an
 * operator needs to size a heap bound (`--max-old-space-size`, docs/performance.md) and to see the
 * bound in effect. The names are the ones Node's usual Prometheus client gives (prom-client's
 * default metrics), so existing dashboards read them; `nodejs_heap_size_limit_bytes` is ours.
 *
 * They are not Effect metrics: a gauge set only at scrape time would be exported over OTLP with the
 * value of the last scrape, or none.
 */
import v8 from "node:v8"

interface Family {
  readonly name: string
  readonly help: string
  readonly value: number
}

const families = (): ReadonlyArray<Family> => {
  const memory = process.memoryUsage()
  return [
    { name: "process_resident_memory_bytes", help: "The process's resident set size, in bytes.", value: memory.rss },
    { name: "nodejs_heap_size_total_bytes", help: "The size V8 has given its heap, in bytes.", value: memory.heapTotal },
    { name: "nodejs_heap_size_used_bytes", help: "What the heap's objects take up, in bytes.", value: memory.heapUsed },
    { name: "nodejs_external_memory_bytes", help: "Memory held outside the heap by its objects (buffers), in bytes.", value: memory.external },
    {
      name: "nodejs_heap_size_limit_bytes",
      help: "The most V8 lets the heap grow to, in bytes (set by --max-old-space-size and --max-semi-space-size).",
      value: v8.getHeapStatistics().heap_size_limit
    }
  ]
}

/** Whether `text` (Prometheus exposition) already has a sample or a TYPE line for `name`. */
const mentions = (text: string, name: string): boolean =>
  new RegExp(`^(?:# TYPE ${name} |${name}[ {])`, "m").test(text)

/**
 * What to append to `formatted` (the Effect metrics, as `PrometheusMetrics.format` wrote them):
 * each family a gauge, read now; a family `formatted` already has is left out, so the text never
 * declares a name twice (which a scraper refuses).
 */
export const prometheusText = (formatted: string): string => {
  const added = families()
    .filter(({ name }) => !mentions(formatted, name))
    .map(({ help, name, value }) => `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name} ${value}\n`)
    .join("")
  return formatted === "" || formatted.endsWith("\n") ? added : `\n${added}`
}

import { assert, describe, it } from "@effect/vitest"
import { parsePrometheusText } from "./support/prometheus.ts"

describe("the Prometheus text reader used by the /metrics tests", () => {
  it("reads families, labels with escapes and special values", () => {
    const samples = parsePrometheusText(
      [
        "# HELP a_total things",
        "# TYPE a_total counter",
        "a_total{x=\"1\",y=\"q\\\"\\n\\\\\"} 3",
        "# TYPE h histogram",
        "h_bucket{le=\"+Inf\"} 2",
        "h_sum 1.5e3",
        "h_count 2",
        "g NaN 1700000000000",
        ""
      ].join("\n")
    )
    assert.deepStrictEqual(samples.map((s) => s.name), ["a_total", "h_bucket", "h_sum", "h_count", "g"])
    assert.deepStrictEqual(samples[0]!.labels, { x: "1", y: "q\"\n\\" })
    assert.strictEqual(samples[2]!.value, 1500)
    assert.isNaN(samples[4]!.value)
  })

  it("refuses what a scraper refuses", () => {
    const bad = [
      "x 1", // no trailing newline
      "1x 1\n",
      "x{a=1} 1\n",
      "x{a=\"1\" 1\n",
      "x one\n",
      "# TYPE x counter\n# TYPE x counter\n",
      "x 1\n# TYPE x counter\n",
      "# TYPE x lines\n",
      "x{a=\"1\",a=\"2\"} 1\n"
    ]
    for (const text of bad) assert.throws(() => parsePrometheusText(text), undefined, undefined, JSON.stringify(text))
  })
})

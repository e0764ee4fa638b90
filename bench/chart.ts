/**
 * A horizontal bar chart as a self-contained SVG (no dependency), for the benchmark results:
 * one bar per row, its value printed at its end, and a min..max whisker when given.
 */

/** One bar. */
export interface Bar {
  readonly label: string
  readonly value: number
  readonly min?: number | undefined
  readonly max?: number | undefined
}

const escape = (text: string) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")

/** The chart of `bars` under `title`, values in `unit`. */
export const barChart = (title: string, unit: string, bars: ReadonlyArray<Bar>): string => {
  const labelWidth = 300
  const plotWidth = 420
  const rowHeight = 28
  const top = 40
  const width = labelWidth + plotWidth + 90
  const height = top + bars.length * rowHeight + 20
  const largest = Math.max(1, ...bars.map((bar) => Math.max(bar.value, bar.max ?? 0)))
  const x = (value: number) => labelWidth + (value / largest) * plotWidth
  const rows = bars.map((bar, i) => {
    const y = top + i * rowHeight
    const whisker = bar.min !== undefined && bar.max !== undefined
      ? `<line x1="${x(bar.min).toFixed(1)}" x2="${x(bar.max).toFixed(1)}" y1="${y + 9}" y2="${y + 9}" stroke="#333" stroke-width="1.5"/>`
      : ""
    return [
      `<text x="${labelWidth - 8}" y="${y + 13}" text-anchor="end">${escape(bar.label)}</text>`,
      `<rect x="${labelWidth}" y="${y}" width="${(x(bar.value) - labelWidth).toFixed(1)}" height="18" fill="${i % 2 === 0 ? "#4c78a8" : "#f58518"}"/>`,
      whisker,
      `<text x="${(x(Math.max(bar.value, bar.max ?? 0)) + 6).toFixed(1)}" y="${y + 13}">${bar.value.toFixed(0)} ${escape(unit)}</text>`
    ].join("")
  })
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="22" font-size="14" font-weight="bold">${escape(title)}</text>`,
    ...rows,
    `</svg>`,
    ""
  ].join("\n")
}

/**
 * The operator's view of a service's contract with its stream (`jetworker contract ...`,
 * INT-NATS-002): read the contract file, and the text an operator reads for a check (findings)
 * and for a plan (changes). The checks and the writes are `@jetworker/nats`'s `Contract`.
 *
 * @since 0.1.0
 */
import { Contract, type Topology } from "@jetworker/nats"
import type { Effect } from "effect"

/** Reads a contract from its file's text (JSON); the error names each wrong field. */
export const read = (text: string): Effect.Effect<Contract.Contract, Contract.ContractError> => Contract.fromJson(text)

const title = (contract: Contract.Contract): string =>
  `contract of stream ${contract.stream.name}, version ${contract.version} (${contract.ownership}-owned)`

/** A check's findings as text: one line per finding, errors first, then the verdict. */
export const formatFindings = (contract: Contract.Contract, findings: ReadonlyArray<Contract.Finding>): string => {
  const errors = findings.filter((f) => f.severity === "error")
  const warnings = findings.filter((f) => f.severity === "warning")
  const lines = [...errors, ...warnings].map((f) =>
    `${f.severity === "error" ? "ERROR  " : "WARNING"} ${f.target} [${f.check}]\n        ${f.message}`
  )
  const verdict = errors.length > 0
    ? `the server does NOT fit the ${title(contract)}: ${errors.length} error(s), ${warnings.length} warning(s)`
    : `the server fits the ${title(contract)}${warnings.length > 0 ? ` (${warnings.length} warning(s))` : ""}`
  return [...lines, verdict].join("\n")
}

const symbol = { create: "+", update: "~", refuse: "!" } as const

/**
 * A plan's changes as text, one line each (`+` create, `~` update, `!` refused), or a line saying
 * there are none. An update that can delete stored messages is marked `DELETES DATA` with what it
 * deletes, and a last line says that `contract apply` makes it only with `--allow-data-loss`.
 */
export const formatChanges = (contract: Contract.Contract, changes: ReadonlyArray<Topology.Change>): string => {
  if (changes.length === 0) return `the server matches the ${title(contract)}: nothing to change`
  const lines = changes.map((change) =>
    change.action === "create"
      ? `+ create ${change.target}`
      : change.action === "update"
      ? `~ ${change.target} ${change.setting}: ${change.live} -> ${change.wanted}` +
        (change.destructive === true ? ` DELETES DATA\n    ${change.message}` : "")
      : `${symbol.refuse} ${change.target} ${change.setting}: ${change.live} -> ${change.wanted} cannot change in place\n    ${change.message}`
  )
  const destructive = changes.filter((change) => change.destructive === true).length
  return [
    ...lines,
    ...(destructive === 0 ? [] : [
      `${destructive} change(s) can delete stored messages: contract apply makes them only with --allow-data-loss`
    ])
  ].join("\n")
}

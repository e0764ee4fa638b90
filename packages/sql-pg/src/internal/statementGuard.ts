/**
 * The check `commitStatement` makes of the statement it embeds in its combined statement, before
 * anything is sent. It reads the statement's text as PostgreSQL's lexer does, as far as the check
 * needs: whitespace, `--` comments, nested block comments, quoted strings (`'...'`, with `E'...'`
 * backslash escapes), quoted identifiers and dollar quotes. It does not parse SQL: it finds the
 * first keyword, the parentheses and where the guard stands.
 */
import type { Statement } from "effect/sql"

/** What is wrong with a statement, for the message of its refusal. */
export type Problem = "NotDataModifying" | "GuardUnused" | "Unbalanced" | "Unterminated"

/** Where the lexer is between two characters. */
type State =
  | { readonly _tag: "Code" }
  | { readonly _tag: "LineComment" }
  | { readonly _tag: "BlockComment"; readonly depth: number }
  | { readonly _tag: "String"; readonly backslash: boolean }
  | { readonly _tag: "Identifier" }
  | { readonly _tag: "Dollar"; readonly tag: string }

const code: State = { _tag: "Code" }
const lineComment: State = { _tag: "LineComment" }
const identifier: State = { _tag: "Identifier" }

/** PostgreSQL's whitespace: space, tab, newline, carriage return, vertical tab, form feed. */
const isSpace = (unit: number): boolean => unit === 0x20 || (unit >= 0x09 && unit <= 0x0d)

/** A letter as PostgreSQL's lexer sees one: ASCII letters, `_` and every non-ASCII character. */
const isLetter = (unit: number): boolean =>
  (unit >= 0x61 && unit <= 0x7a) || (unit >= 0x41 && unit <= 0x5a) || unit === 0x5f || unit >= 0x80

/** Whether `unit` continues an unquoted identifier or keyword (a digit or `$` included, as PostgreSQL allows). */
const isIdentifierPart = (unit: number): boolean => isLetter(unit) || (unit >= 0x30 && unit <= 0x39) || unit === 0x24

/** A dollar quote's opening tag at `i` (`$$` or `$tag$`, the tag not starting with a digit), or undefined; `$1` is a parameter. */
const dollarTag = (text: string, i: number): string | undefined => {
  let end = i + 1
  if (end < text.length && isLetter(text.charCodeAt(end))) {
    end++
    while (end < text.length && isIdentifierPart(text.charCodeAt(end)) && text.charCodeAt(end) !== 0x24) end++
  }
  return text.charCodeAt(end) === 0x24 ? text.slice(i, end + 1) : undefined
}

/**
 * The problem of the statement made of `segments`, or `undefined` when it passes: its first token
 * must be the keyword `INSERT`, `UPDATE` or `DELETE` of a literal segment (PostgreSQL runs a
 * data-modifying WITH query once and skips a read-only one nothing reads); `guard` must stand in
 * code (a guard inside a comment or a quote guards nothing); no comment or quote may be left open
 * (it would swallow the rest of the combined statement) and the parentheses must balance (a `)`
 * too many closes the WITH query, and what follows would run as a query of its own, unguarded).
 * Segments other than literals (parameters, identifiers, helpers) are one opaque token each.
 */
export const problem = (segments: ReadonlyArray<Statement.Segment>, guard: Statement.Segment): Problem | undefined => {
  let state: State = code
  let depth = 0
  let first: "pending" | "ok" | "other" = "pending"
  let guarded = false
  // The last two code units read in code (a space after a comment, which separates tokens), for
  // an `E` prefix and for a `$` inside an identifier.
  let previous = 0x20
  let beforePrevious = 0x20
  for (const segment of segments) {
    if (segment === guard) {
      // Its text is inline: after `--` on the same line, it is part of the comment.
      if (state._tag !== "Code") return "GuardUnused"
      guarded = true
      if (first === "pending") first = "other"
      previous = 0x29
      continue
    }
    if (segment._tag !== "Literal") {
      if (state._tag === "Code") {
        if (first === "pending") first = "other"
        // A parameter, an identifier or a helper's list: one token, ending as a placeholder does.
        previous = 0x3f
      }
      continue
    }
    const text = segment.value
    for (let i = 0; i < text.length; i++) {
      const char = text[i]!
      const unit = text.charCodeAt(i)
      switch (state._tag) {
        case "LineComment":
          if (char === "\n" || char === "\r") state = code
          continue
        case "BlockComment":
          if (char === "*" && text[i + 1] === "/") {
            i++
            state = state.depth === 1 ? code : { _tag: "BlockComment", depth: state.depth - 1 }
          } else if (char === "/" && text[i + 1] === "*") {
            i++
            state = { _tag: "BlockComment", depth: state.depth + 1 }
          }
          continue
        case "String":
          if (state.backslash && char === "\\") i++
          else if (char === "'") {
            if (text[i + 1] === "'") i++
            else state = code
          }
          continue
        case "Identifier":
          if (char === "\"") {
            if (text[i + 1] === "\"") i++
            else state = code
          }
          continue
        case "Dollar":
          if (char === "$" && text.startsWith(state.tag, i)) {
            i += state.tag.length - 1
            state = code
          }
          continue
        case "Code":
          break
      }
      if (isSpace(unit)) {
        previous = unit
        continue
      }
      if (char === "-" && text[i + 1] === "-") {
        i++
        state = lineComment
        previous = 0x20
        continue
      }
      if (char === "/" && text[i + 1] === "*") {
        i++
        state = { _tag: "BlockComment", depth: 1 }
        previous = 0x20
        continue
      }
      if (first === "pending") {
        const keyword = /^(?:insert|update|delete)(?![A-Za-z0-9_$\u0080-\uffff])/i.exec(text.slice(i, i + 7))
        first = keyword === null ? "other" : "ok"
      }
      if (char === "'") {
        // `E'...'` (or `e'...'`) takes backslash escapes, when the `E` starts a token of its own.
        const prefixed = (previous === 0x45 || previous === 0x65) && !isIdentifierPart(beforePrevious)
        state = { _tag: "String", backslash: prefixed }
      } else if (char === "\"") {
        state = identifier
      } else if (char === "$" && !isIdentifierPart(previous)) {
        const tag = dollarTag(text, i)
        if (tag !== undefined) {
          i += tag.length - 1
          state = { _tag: "Dollar", tag }
        }
      } else if (char === "(") {
        depth++
      } else if (char === ")") {
        if (--depth < 0) return "Unbalanced"
      }
      beforePrevious = previous
      previous = unit
    }
  }
  if (state._tag !== "Code" && state._tag !== "LineComment") return "Unterminated"
  if (first !== "ok") return "NotDataModifying"
  if (depth !== 0) return "Unbalanced"
  return guarded ? undefined : "GuardUnused"
}

/** The message of the refusal of a statement with `problem`, naming the option to use instead. */
export const message = (found: Problem): string => {
  switch (found) {
    case "NotDataModifying":
      return "commitStatement: the statement must be one INSERT, UPDATE or DELETE (PostgreSQL would skip anything else " +
        "inside the combined statement and record the key alone); use commit for other effects"
    case "GuardUnused":
      return "commitStatement: the statement does not use its `fresh` guard (outside comments and quoted text), " +
        "so it would run again for a duplicate"
    case "Unbalanced":
      return "commitStatement: the statement's parentheses are unbalanced (outside comments and quoted text): a `)` " +
        "too many would close the combined statement's WITH query and run what follows unguarded; use commit for such effects"
    case "Unterminated":
      return "commitStatement: the statement ends inside a comment or quoted text, which would swallow the rest of " +
        "the combined statement"
  }
}

/**
 * Classification of a handler's typed errors into transient (worth retrying) and permanent (no
 * retry can fix it). A classification is a record with one entry per `_tag` in the handler's error
 * union, so the compiler rejects one that forgets a tag (or names one that cannot occur). An entry
 * is a {@link Disposition}, or `"isRetryable"` for errors that say themselves whether retrying can
 * help (such as `SqlError`, through its reason). Defects (thrown exceptions, `Effect.die`) are not typed
 * errors; the engine treats them as transient, so they end in `DeadLettered` once the attempts are
 * spent.
 *
 * @since 0.1.0
 */

/** What a failure means for retrying. */
export type Disposition = "transient" | "permanent"

/** Any error the engine can classify: a value with a string `_tag`. */
export interface Tagged {
  readonly _tag: string
}

/** The tags of an error union. */
export type Tags<E> = E extends { readonly _tag: infer T extends string } ? T : never

/** An error that says itself whether a retry can help. */
export interface SaysRetryable {
  readonly isRetryable: boolean
}

/**
 * How one error tag is classified: `"transient"`, `"permanent"`, or `"isRetryable"` (transient
 * exactly when the error's own `isRetryable` is true, permanent when it is false or missing). A
 * classification is plain data, so the compiler can check it against the handler's inferred
 * error type; an error whose retryability depends on its fields says so with an `isRetryable`
 * getter, as `SqlError` does.
 */
export type Entry = Disposition | "isRetryable"

/**
 * A complete classification of the error union `E`: one entry for every tag of `E`.
 *
 * ```ts
 * import type { Classification } from "@jetworker/core"
 * import { Data } from "effect"
 * import type { SqlError } from "effect/sql"
 *
 * class UnknownAccount extends Data.TaggedError("UnknownAccount")<{ readonly account: string }> {}
 * class InsufficientFunds extends Data.TaggedError("InsufficientFunds")<{ readonly missing: number }> {}
 *
 * // A missing tag, or one the handler cannot fail with, is a compile error.
 * const classify: Classification.Classification<UnknownAccount | InsufficientFunds | SqlError.SqlError> = {
 *   UnknownAccount: "permanent",
 *   InsufficientFunds: "permanent",
 *   SqlError: "isRetryable"
 * }
 * ```
 */
export type Classification<E extends Tagged> = [Tags<E>] extends [never]
  // A handler that cannot fail: `{}` only (a mapped type over no keys would accept any entry).
  ? { readonly [tag: string]: never }
  : { readonly [K in Tags<E>]: Entry }

/**
 * The disposition of `error` under `classification`. A tag missing at run time (possible only
 * when the types were bypassed) counts as permanent, so it cannot cause a retry loop.
 */
export const classify = <E extends Tagged>(classification: Classification<E>, error: E): Disposition => {
  const entry = (classification as Record<string, Entry | undefined>)[error._tag]
  if (entry === undefined) return "permanent"
  if (entry === "isRetryable") {
    return (error as Partial<SaysRetryable>).isRetryable === true ? "transient" : "permanent"
  }
  return entry
}

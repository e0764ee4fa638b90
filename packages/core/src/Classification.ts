/**
 * Classification of a handler's typed errors into transient (worth retrying) and permanent (no
 * retry can fix it). A classification is a record with one entry per `_tag` in the handler's error
 * union, so the compiler rejects one that forgets a tag (or names one that cannot occur). An entry
 * is a {@link Disposition} or a function of the error, for errors such as `SqlError` whose
 * retryability depends on their reason. Defects (thrown exceptions, `Effect.die`) are not typed
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

/**
 * A complete classification of the error union `E`: one entry for every tag of `E`.
 *
 * @example
 * const classify: Classification<UnknownAccount | InsufficientFunds | SqlError> = {
 *   UnknownAccount: "permanent",
 *   InsufficientFunds: "permanent",
 *   SqlError: Classification.byRetryable
 * }
 */
export type Classification<E extends Tagged> = {
  readonly [K in Tags<E>]: Disposition | ((error: Extract<E, { readonly _tag: K }>) => Disposition)
}

/** Classifies an error that says whether it is retryable (`SqlError` does, through its reason). */
export const byRetryable = (error: { readonly isRetryable: boolean }): Disposition =>
  error.isRetryable ? "transient" : "permanent"

/**
 * The disposition of `error` under `classification`. A tag missing at run time (possible only
 * when the types were bypassed) counts as permanent, so it cannot cause a retry loop.
 */
export const classify = <E extends Tagged>(classification: Classification<E>, error: E): Disposition => {
  const entry = (classification as Record<string, Disposition | ((error: E) => Disposition) | undefined>)[error._tag]
  if (entry === undefined) return "permanent"
  return typeof entry === "function" ? entry(error) : entry
}

/**
 * The server's refusal of a publish or a subscription for lack of permission, as nats.js reports
 * it (a `PermissionViolationError` on the connection's `error` status, or on a subscription's
 * callback), told apart by name as `NatsError` does. Internal to the adapter.
 */

/** What was refused (`publish` or `subscription`), on which subject, in the server's words. */
export interface PermissionRefusal {
  readonly operation: string
  readonly subject: string
  readonly message: string
}

/** The refusal in `error`, or `undefined` when it is none. */
export const refusalOf = (error: unknown): PermissionRefusal | undefined => {
  if (typeof error !== "object" || error === null || (error as { name?: unknown }).name !== "PermissionViolationError") return undefined
  const { operation, subject, message } = error as { operation?: unknown; subject?: unknown; message?: unknown }
  return typeof operation === "string" && typeof subject === "string" && typeof message === "string"
    ? { operation, subject, message }
    : undefined
}

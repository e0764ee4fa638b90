/**
 * The `limit` of the stores' purges (`PgIdempotencyStore.purge`, `PgAttemptStore.purge`): their
 * `LIMIT` takes a PostgreSQL `integer`, so a larger limit would fail in the database as bad data.
 */

/** The largest limit: PostgreSQL's largest `integer`. */
export const max = 2_147_483_647

/** Why `limit` cannot be a purge's limit, or `undefined` when it can. */
export const problem = (limit: number): string | undefined =>
  Number.isInteger(limit) && limit >= 1 && limit <= max ? undefined : `purge: limit must be an integer from 1 to ${max}, got ${limit}`

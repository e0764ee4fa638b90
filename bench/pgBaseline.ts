/**
 * The hand-written `pg` side of the idempotent benchmarks: the SQL it sends and its transaction,
 * as a user would write them (the per-message text is the store's own).
 */
import type pg from "pg"

export const effectDdl = `CREATE TABLE bench_effects (event_id text NOT NULL, n integer NOT NULL)`
export const insertDedup =
  `INSERT INTO jetworker_dedup (scope, id) VALUES ($1, $2) ON CONFLICT (scope, id) DO NOTHING RETURNING true AS inserted`
export const insertEffect = `INSERT INTO bench_effects (event_id, n) VALUES ($1, $2)`

/** Runs `body` on one pooled connection inside BEGIN/COMMIT (ROLLBACK and rethrow on failure). */
export const transaction = async <A>(p: pg.Pool, body: (client: pg.PoolClient) => Promise<A>): Promise<A> => {
  const client = await p.connect()
  try {
    await client.query("BEGIN")
    const result = await body(client)
    await client.query("COMMIT")
    client.release()
    return result
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined)
    client.release(error instanceof Error ? error : new Error(String(error)))
    throw error
  }
}

/** One message by hand: BEGIN, the dedup row, the effect row unless the dedup row existed, COMMIT. */
export const commitByHand = (p: pg.Pool, scope: string, id: string, n: number): Promise<void> =>
  transaction(p, async (client) => {
    const inserted = await client.query(insertDedup, [scope, id])
    if (inserted.rowCount === 1) await client.query(insertEffect, [id, n])
  })

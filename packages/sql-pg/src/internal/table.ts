/**
 * Table names for the store: validated once, at construction, and quoted for interpolation into
 * SQL text. Only lowercase identifiers (optionally schema-qualified) are accepted, so the quoted
 * name means the same table as the unquoted one the migrations create.
 */

/** The table the migrations create and the store uses by default. */
export const defaultTable = "jetworker_dedup"

const identifier = /^[a-z_][a-z0-9_]{0,62}$/

/** The validated, quoted form of `table`, or `undefined` when it is not a valid table name. */
export const quote = (table: string): string | undefined => {
  const parts = table.split(".")
  if (parts.length > 2 || !parts.every((part) => identifier.test(part))) return undefined
  return parts.map((part) => `"${part}"`).join(".")
}

/** Which table a name is for: the message names the setting the operator must fix. */
export type Role = "idempotency" | "attempts" | "outbox"

/** Why `table` (the `role` table's name) was refused, for the error message. */
export const invalidMessage = (table: string, role: Role): string =>
  `invalid ${role} table name ${JSON.stringify(table)}: expected a lowercase SQL identifier ` +
  `(letters, digits and "_", at most 63 characters, not starting with a digit), optionally ` +
  `qualified by a schema as "schema.table"`

/** The DDL for a dedup table named `quoted` (already validated and quoted); idempotent. */
export const ddl = (quoted: string, indexName: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${quoted} (
  scope text NOT NULL,
  id text NOT NULL,
  committed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, id)
)`,
  `CREATE INDEX IF NOT EXISTS "${indexName}" ON ${quoted} (committed_at)`
]

/** The table the migrations create for failed-attempt counts, and the attempt store uses. */
export const defaultAttemptsTable = "jetworker_attempts"

/** The DDL for an attempts table named `quoted` (already validated and quoted); idempotent. */
export const attemptsDdl = (quoted: string, indexName: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${quoted} (
  scope text NOT NULL,
  id text NOT NULL,
  failures integer NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, id)
)`,
  `CREATE INDEX IF NOT EXISTS "${indexName}" ON ${quoted} (updated_at)`
]

/**
 * The column a later migration adds to an attempts table named `quoted` (already validated and
 * quoted): the dead-letter decision (`AttemptStore.recordDeadLetter`), as JSON; idempotent.
 */
export const attemptsDeadLetterDdl = (quoted: string): ReadonlyArray<string> => [
  `ALTER TABLE ${quoted} ADD COLUMN IF NOT EXISTS dead_letter jsonb`
]

/** The table the migrations create for the transactional outbox, and `PgOutbox` uses by default. */
export const defaultOutboxTable = "jetworker_outbox"

/** The DDL for an outbox table named `quoted` (already validated and quoted); idempotent. */
export const outboxDdl = (quoted: string, name: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${quoted} (
  seq bigserial PRIMARY KEY,
  id text NOT NULL,
  subject text NOT NULL,
  payload bytea NOT NULL,
  headers jsonb,
  traceparent text,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  sent_at timestamptz
)`,
  // The relay reads pending rows in order; the clean-up finds old sent ones.
  `CREATE INDEX IF NOT EXISTS "${name}_pending_idx" ON ${quoted} (seq) WHERE sent_at IS NULL`,
  `CREATE INDEX IF NOT EXISTS "${name}_sent_at_idx" ON ${quoted} (sent_at) WHERE sent_at IS NOT NULL`
]

/**
 * The ledger's one event: move `amount` minor units of `currency` from one account to another.
 * On the wire it is flat JSON (not an envelope); `metadata` maps it to the engine's view.
 */
import { Envelope } from "@jetworker/core"
import { DateTime, Schema } from "effect"

/** An account id: 1 to 64 characters from `A-Z a-z 0-9 _ . -`. */
export const AccountId = Schema.String.check(
  Schema.isPattern(/^[A-Za-z0-9_.-]{1,64}$/, { expected: "an account id of 1 to 64 characters from A-Z a-z 0-9 _ . -" })
)

/** A positive whole number of minor units (cents), at most 2^53 - 1. */
export const Amount = Schema.Int.check(
  Schema.isGreaterThan(0, { expected: "a positive whole number of minor units" }),
  Schema.isLessThanOrEqualTo(Number.MAX_SAFE_INTEGER)
)

/** An ISO 4217 currency code such as `EUR`. */
export const Currency = Schema.String.check(Schema.isPattern(/^[A-Z]{3}$/, { expected: "a three-letter currency code" }))

/** A transfer as published on `ledger.transfer.>`. */
export const TransferEvent = Schema.Struct({
  id: Envelope.EventId,
  from: AccountId,
  to: AccountId,
  amount: Amount,
  currency: Currency,
  createdAt: Schema.DateTimeUtcFromString,
  expiresAt: Schema.optional(Schema.DateTimeUtcFromString)
}).check(Schema.makeFilter((event) => event.from !== event.to || "from and to must be different accounts"))

/** A decoded transfer. */
export type TransferEvent = typeof TransferEvent.Type

/** The engine's view of a transfer. */
export const metadata = (event: TransferEvent): Envelope.Metadata => ({
  id: event.id,
  time: event.createdAt,
  expiresAt: event.expiresAt
})

/** The JSON a producer publishes for a transfer. */
export const toJson = (transfer: {
  readonly id: string
  readonly from: string
  readonly to: string
  readonly amount: number
  readonly currency: string
  readonly createdAt: DateTime.Utc
  readonly expiresAt?: DateTime.Utc | undefined
}): string =>
  JSON.stringify({
    id: transfer.id,
    from: transfer.from,
    to: transfer.to,
    amount: transfer.amount,
    currency: transfer.currency,
    createdAt: DateTime.formatIso(transfer.createdAt),
    ...(transfer.expiresAt === undefined ? {} : { expiresAt: DateTime.formatIso(transfer.expiresAt) })
  })

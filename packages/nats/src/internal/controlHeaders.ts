/**
 * The headers of a JetStream publish, starting with its control headers. NATS 2.9 finds a header
 * by the first occurrence of its name anywhere in the header block, and ignores it when that
 * occurrence is not at the start of a line: a value written before it that mentions
 * `Nats-Msg-Id` (a note, an error message) would turn deduplication off. So the id and the
 * expected stream go first, and are not passed as nats.js's `msgID` and `expect` options: it
 * would set them again, which moves a header to the end.
 */
import { headers as makeHeaders, type MsgHdrs } from "@nats-io/transport-node"

/** Empty headers but for `Nats-Msg-Id: msgId` and `Nats-Expected-Stream: stream`, in that order. */
export const make = (msgId: string, stream: string): MsgHdrs => {
  const h = makeHeaders()
  h.set("Nats-Msg-Id", msgId)
  h.set("Nats-Expected-Stream", stream)
  return h
}

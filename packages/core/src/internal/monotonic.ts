/**
 * Monotonic time in milliseconds, from the `Clock` (so `TestClock` drives it). Leases, handler
 * timeouts and latencies are durations: the broker times its ack wait on monotonic timers, so
 * the engine must not follow steps of the wall clock (NTP, a resumed VM, `date -s`). Wall time
 * stays for what is a date: event expiry and the stamps of outcomes and dead letters.
 */
import type { Clock } from "effect"

/** The clock's monotonic time, in milliseconds (an arbitrary origin: only differences mean anything). */
export const millis = (clock: Clock.Clock): number => Number(clock.monotonicTimeNanosUnsafe()) / 1_000_000

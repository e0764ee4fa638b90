/**
 * What notices that an intake's open pulls are lost, and writes them off so the room is pulled
 * again: a reconnect, a new consumer leader, and two missed idle heartbeats; and what ends the
 * intake when the server refuses its pulls for lack of permission.
 */
import type { Subscription } from "@nats-io/transport-node"
import { Effect, type Scope, Stream } from "effect"
import { fail, type IntakeEnv, type IntakeState } from "./intakeState.ts"
import { refusalOf } from "./permissionRefusal.ts"
import type { Pulls } from "./pulls.ts"
import { refusedPulls } from "./sourceErrors.ts"

/**
 * The client's link, from its status: `state.linkDown` while it is down (disconnected, stale or
 * closed), and `state.onLinkLost` called as it goes down. After a reconnect: a pull sent while
 * disconnected was lost with the client's outbound buffer (it is never answered), and those sent
 * before may or may not have survived; all are written off and the room pulled again once the
 * consumer answers (as nats.js does). A pull the server refuses for lack of permission (said only
 * on the connection, as an `-ERR`) ends the intake at once, naming what to grant: the permission is
 * the connection's, so every pull would be refused, and the intake would only stall and check the
 * consumer for ever. What it buffered is still handed out. Runs in the scope.
 */
export const watchLink = (env: IntakeEnv, state: IntakeState, pulls: Pulls): Effect.Effect<void, never, Scope.Scope> =>
  Stream.fromAsyncIterable(env.connection.connection.status(), (error) => error).pipe(
    Stream.runForEach((status) =>
      Effect.sync(() => {
        if (status.type === "error") {
          const refusal = refusalOf(status.error)
          if (refusal?.operation === "publish" && refusal.subject === pulls.subject && !state.closed && state.failure === undefined) {
            pulls.cancelPause()
            fail(state, refusedPulls(env.name, refusal.subject, refusal.message))
          }
          return
        }
        if (status.type === "disconnect" || status.type === "staleConnection" || status.type === "close") {
          state.linkDown = true
          for (const lost of state.onLinkLost) lost()
          state.onLinkLost.clear()
          return
        }
        if (status.type !== "reconnect") return
        state.linkDown = false
        if (state.closed || state.failure !== undefined) return
        if (state.requested > 0 || state.waiting.length > 0) {
          env.logWarning(`${env.name}: reconnected; the open pulls for ${state.requested} messages are given up (undelivered, they stay on the server) and the consumer checked before pulling again`)
          pulls.writeOff()
        }
        pulls.pause()
      })
    ),
    Effect.ignore,
    Effect.forkScoped,
    Effect.asVoid
  )

/**
 * A new consumer leader: nats-server 2.9 drops the waiting pulls when the leadership moves. It
 * may answer them with a `409 Leadership Change`, or not at all, and then only the silence
 * watchdog notices (two heartbeats, ~10-15 s); when the dead node led the stream too, a pull
 * sent meanwhile was measured waiting ~5 s for its messages. The new leader announces itself:
 * the open pulls are written off (their inbox retired until the server has dropped them, so
 * `prefetch` still bounds what is handed out) and the room is pulled again once the consumer
 * answers, as after a reconnect. Without permission to subscribe to the advisory the server
 * refuses the subscription: then the intake goes on as before (the watchdog notices). The
 * subscription is `close`'s to end.
 */
export const watchLeader = (env: IntakeEnv, state: IntakeState, pulls: Pulls): Subscription => {
  const leaderElected = `$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.${env.stream}.${env.durable}`
  return env.connection.connection.subscribe(leaderElected, {
    callback: (error) => {
      if (state.closed) return
      if (error !== null) {
        env.logWarning(`${env.name}: cannot subscribe to ${leaderElected} (${error.message}); a consumer leader change is noticed only after two missed heartbeats`)
        return
      }
      if (state.failure !== undefined) return
      env.logEvent("Info", "intake.leader_changed", `${env.name}: the consumer has a new leader; the open pulls for ${state.requested} messages are given up (undelivered, they stay on the server) and pulled again`, {
        pulled: state.requested
      })
      if (state.requested > 0 || state.waiting.length > 0) pulls.writeOff()
      // A pause already running pulls when it ends; otherwise the next one starts short.
      if (!state.pausing) state.pauseMillis = 0
      pulls.pause()
    }
  })
}

/**
 * Two heartbeats without a word while pulls are open: the server lost them (a restart, a lost
 * connection) or never had them: a pull to a consumer deleted while no pull of ours was open (the
 * server answers an open pull's deletion with a 409) gets no answer at all. The count is reset
 * and the room pulled again once the consumer is known to exist (`pause`), as nats.js does after
 * missed heartbeats. A tick that came late (the event loop was busy) judges nothing: what arrived
 * meanwhile is not read yet. The interval is `close`'s to clear.
 */
export const startWatchdog = (env: IntakeEnv, state: IntakeState, pulls: Pulls): ReturnType<typeof setInterval> => {
  const { heartbeatMillis } = env
  const silenceMillis = 2 * heartbeatMillis + 500
  let lastTick = performance.now()
  const watchdog = setInterval(() => {
    const now = performance.now()
    const late = now - lastTick - heartbeatMillis
    lastTick = now
    if (late > heartbeatMillis / 2) state.lastHeard = now
    else if (state.requested > 0 && !state.pausing && now - state.lastHeard > silenceMillis) {
      const silenceMs = Math.round(now - state.lastHeard)
      // Once per stall (it lasts until a pull is answered, `intake.resumed`), however often the
      // pulls sent meanwhile go unanswered.
      if (state.stalledSince === undefined) {
        env.logEvent(
          "Warning",
          "intake.stalled",
          `${env.name}: no word from the server for ${silenceMs} ms with pulls open for ${state.requested} messages; ` +
            "the pulls are given up (undelivered messages stay on the server) and the consumer checked before pulling again",
          { silenceMs, pulled: state.requested }
        )
        // Readiness says so too, until `intake.resumed`: no message can be taken meanwhile.
        env.reportHealth({
          _tag: "Stalled",
          reason: `intake stalled: the consumer ${env.name} has not answered a pull for ${silenceMs} ms; ` +
            "checking it before pulling again"
        })
        state.stalledSince = state.lastHeard
      }
      pulls.writeOff()
      pulls.pause()
    }
  }, heartbeatMillis)
  watchdog.unref()
  return watchdog
}

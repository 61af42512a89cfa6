"""The watchdog's judgement, pure: from one pass's observations and its memory to one decision.

The peers' watchdogs make the failures that take serving boxes down worse: they restart without
a cap (a restart storm leaks GPU memory on unified-memory boxes until the box needs a reset),
kill slow-loading models at 30-120 s, and trust a /health that can answer 200 while the engine
is stuck. So: act only after N consecutive failed probes, never count probe failures inside the
startup budget after a (re)start, cap restarts per window with exponential backoff, roll back
past the cap, and never restart onto a GPU that logged a hardware Xid.
"""

from __future__ import annotations

from dataclasses import field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from lanectl.recipe.model import WatchdogPolicy
from lanectl.records import frozen

if TYPE_CHECKING:
    from lanectl.host.xid import XidEvent

Action = Literal["none", "restart", "rollback", "stop", "wait"]


@frozen
class Observation:
    """What one pass saw of the active lane."""

    lane: str
    containers_running: bool
    container_detail: str  # e.g. "primary exited with code 1"
    health_ok: bool | None  # None: not probed (container down, or no probe answer in this pass of `run`)
    health_detail: str
    generation_ok: bool | None  # None: not due this pass, or not probed
    generation_detail: str
    fatal_lines: tuple[str, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    started_at: datetime | None = None  # the primary's current run
    ever_ready_since_start: bool = False
    xid_notes: tuple[str, ...] = ()  # where an Xid's GPU was a guess (see xid.xid_on_lane)


@frozen
class WatchdogMemory:
    """What the watchdog remembers between passes about the lane it watches (saved in watchdog.json)."""

    lane: str | None = None
    consecutive_failures: int = 0
    restarts: tuple[str, ...] = ()  # ISO times of the watchdog's restarts of this lane, within the window
    ready_since_start: bool = False

    def for_lane(self, lane: str) -> WatchdogMemory:
        return self if self.lane == lane else WatchdogMemory(lane=lane)


@frozen
class Decision:
    """What a watchdog pass does about what it observed, why, and the memory it leaves for the next pass."""

    action: Action
    reason: str
    failing: bool  # the lane is unhealthy (whether or not anything is done about it)
    memory: WatchdogMemory
    xid_application: tuple[XidEvent, ...] = ()
    xid_hardware: tuple[XidEvent, ...] = ()
    observe_only: bool = False
    # Codes in neither list: counted and journaled by every pass, whatever it decides, never acted on.
    xid_unlisted: tuple[XidEvent, ...] = ()
    backoff_until: datetime | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def backoff_seconds(policy: WatchdogPolicy, restarts_in_window: int) -> float:
    """Before the n-th restart in the window: initial * 2^(n-1), capped; the first restart waits nothing."""
    if restarts_in_window == 0:
        return 0.0
    return min(policy.restart.backoff_initial_seconds * 2 ** (restarts_in_window - 1),
               policy.restart.backoff_max_seconds)


def decide(observation: Observation, memory: WatchdogMemory, policy: WatchdogPolicy, *, now: datetime,
           armed: bool, startup_budget_seconds: float) -> Decision:
    # The Xid tables are imported where a pass decides: `status` reads the watchdog's memory through this module
    # and decides nothing.
    from lanectl.host.xid import XidClass, classify

    decision = _decide(observation, memory, policy, now=now, armed=armed,
                       startup_budget_seconds=startup_budget_seconds)
    # Codes in neither list (63, 92, 121, ...) are recorded and counted, but neither restart nor stop a lane:
    # acting on a code nobody classified would be a guess. Every kind of pass carries them, so a pass that
    # restarts, stops or backs off for another reason does not lose them as the kernel cursor moves on.
    unlisted = tuple(x for x in observation.xids
                     if classify(x, policy.xid.application_codes, policy.xid.hardware_codes) == XidClass.UNKNOWN)
    if not unlisted:
        return decision
    note = f"unlisted Xid {', '.join(str(x.code) for x in unlisted)} recorded (not acted on)"
    return replace(decision, xid_unlisted=unlisted, reason=f"{decision.reason}; {note}")


def _decide(observation: Observation, memory: WatchdogMemory, policy: WatchdogPolicy, *, now: datetime,
            armed: bool, startup_budget_seconds: float) -> Decision:
    memory = memory.for_lane(observation.lane)
    window_start = now - timedelta(minutes=policy.restart.window_minutes)
    restarts = tuple(t for t in memory.restarts if datetime.fromisoformat(t) >= window_start)
    memory = replace(memory, restarts=restarts)
    from lanectl.host.xid import XidClass, classify

    classes = {x: classify(x, policy.xid.application_codes, policy.xid.hardware_codes) for x in observation.xids}
    hardware = tuple(x for x in observation.xids if classes[x] == XidClass.HARDWARE)
    application = tuple(x for x in observation.xids if classes[x] == XidClass.APPLICATION)

    def act(action: Action, reason: str, **extra: object) -> Decision:
        decision = Decision(action, reason, True, memory, application, hardware, observe_only=not armed,
                            **extra)  # type: ignore[arg-type]
        if not armed and action != "none":
            return replace(decision, reason=f"{reason} (disarmed: observed only, would {action})")
        return decision

    if hardware:
        codes = ", ".join(str(x.code) for x in hardware)
        return act("stop", f"hardware Xid {codes}: the GPU needs attention; restarting onto it would loop")

    if observation.ever_ready_since_start or (observation.health_ok and observation.generation_ok is not False):
        memory = replace(memory, ready_since_start=True)
    # Loading means not answering yet (vLLM listens only once loaded). An engine that answers
    # /health but generates nothing is hung, not loading: the budget does not shield that.
    in_startup = (observation.started_at is not None and not memory.ready_since_start
                  and observation.health_ok is not True
                  and now - observation.started_at < timedelta(seconds=startup_budget_seconds))

    crash = None
    if not observation.containers_running:
        crash = observation.container_detail
    elif observation.fatal_lines:
        crash = f"fatal engine line: {observation.fatal_lines[-1]}"
    elif application:
        crash = f"application Xid {', '.join(str(x.code) for x in application)}"
    if crash is not None:
        return _recover(crash, memory, policy, now, act)

    probe_failed = observation.health_ok is False or observation.generation_ok is False
    if observation.health_ok is None and not probe_failed:
        # Running, and no probe answered in this pass: nothing to count either way, so failures
        # counted so far stand (the answers of a hung engine's probes come a timeout later).
        return Decision("none", "running; no probe answer in this pass", False, memory, application,
                        hardware, observe_only=not armed)
    if not probe_failed:
        return Decision("none", "healthy", False, replace(memory, consecutive_failures=0), application,
                        hardware, observe_only=not armed)
    detail = observation.health_detail if observation.health_ok is False else observation.generation_detail
    if in_startup:
        # A slow-loading model is not a failing one: peers' 30-120 s kills are what this avoids.
        return Decision("none", f"starting (inside its startup budget): {detail}", False, memory,
                        application, hardware, observe_only=not armed)
    memory = replace(memory, consecutive_failures=memory.consecutive_failures + 1)
    if memory.consecutive_failures < policy.failures_before_action:
        return Decision("none", f"probe failed {memory.consecutive_failures}/{policy.failures_before_action}: "
                        f"{detail}", True, memory, application, hardware, observe_only=not armed)
    return _recover(f"{memory.consecutive_failures} consecutive failed probes: {detail}", memory, policy, now, act)


def _recover(reason: str, memory: WatchdogMemory, policy: WatchdogPolicy, now: datetime, act) -> Decision:  # type: ignore[no-untyped-def]
    count = len(memory.restarts)
    if count >= policy.restart.max_restarts:
        return act("rollback", f"{reason}; {count} restarts in the last {policy.restart.window_minutes:g} min "
                               f"reached the cap of {policy.restart.max_restarts}: crash loop")
    if memory.restarts:
        wait = backoff_seconds(policy, count)
        until = datetime.fromisoformat(memory.restarts[-1]) + timedelta(seconds=wait)
        if now < until:
            return act("wait", f"{reason}; backing off until {until.isoformat(timespec='seconds')} "
                               f"before restart {count + 1}", backoff_until=until)
    return act("restart", f"{reason}; restart {count + 1} of at most {policy.restart.max_restarts} "
                          f"in {policy.restart.window_minutes:g} min")

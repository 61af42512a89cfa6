from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lanectl.dockerapi.containers import ContainerEngine, ContainerState
from lanectl.health.engine_exit import exit_detail
from lanectl.image.render import plan_image
from lanectl.output import Result
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles, state_dir
from lanectl.state.pushes import PushStore
from lanectl.state.standby import StandbyRecord, StandbyStore


def lane_status(catalog: Catalog) -> Result:
    """Everything an operator asks at 3 a.m.: what runs, is it healthy, which build, and is a way back there.

    The JSON shape (version 1 of the envelope) is documented in the README.
    """
    from lanectl.health.probe import EndpointProbe, probe_base_url

    directory = state_dir()
    engine = ContainerEngine()
    files = StateFiles(directory)
    state = LaneStateStore(files.lanes).load()
    standbys = StandbyStore(files.standby).load()
    journal = Journal(files.journal)
    pushes = PushStore(directory)
    containers = engine.lane_containers()
    by_lane: dict[tuple[str, str], list[ContainerState]] = {}
    for container in containers:
        by_lane.setdefault((container.recipe, container.lane), []).append(container)
    now = datetime.now(UTC)
    # Mid-switch the active lane is stopped on purpose (stop-first); `unfinished_switch` says so instead.
    switching = _unfinished(journal) is not None
    lanes = []
    for lane in sorted(catalog.lanes.values(), key=lambda lane: (lane.recipe.id, lane.name)):
        tag = plan_image(lane).tag
        order = {role: index for index, role in enumerate(lane.roles)}
        own = sorted(by_lane.get((lane.recipe.id, lane.name), []), key=lambda c: order.get(c.role, len(order)))
        health = None
        primary = next((c for c in own if c.role == ROLE_PRIMARY), None)
        if primary is not None and primary.running:
            probe = EndpointProbe(probe_base_url(lane), lane.spec.health).health_ok()
            health = "ok" if probe.ok else probe.detail
        image_labels = engine.image_labels(primary.image) if primary else None
        lanes.append({
            "lane": lane.name,
            "recipe": lane.recipe.id,
            "active": state.active == lane.name,
            "known_good": lane.name in state.known_good,
            "image": tag,
            "built": engine.image_labels(tag) is not None,
            "health": health,
            "dead": _dead(lane, own) if state.active == lane.name and not switching else None,
            "standby": _standby(standbys.standby(lane.name), now, primary),
            "provenance": {k.removeprefix("io.lanectl."): v for k, v in (image_labels or {}).items()
                           if k.startswith("io.lanectl.")},
            "containers": [_container(c, tag, now) for c in own],
            "pushed": _pushed(pushes, tag, lane.spec.image.registry),
        })
    known = {(lane.recipe.id, lane.name) for lane in catalog.lanes.values()}
    lease = state.watchdog_lease
    return Result("status", {
        "state_dir": str(directory),
        "active": state.active,
        "known_good": list(state.known_good),
        "watchdog": {
            "armed": state.watchdog_armed_at(now),
            "lease": None if lease is None else {"until": lease.until, "reason": lease.reason, "by": lease.by,
                                                 "expired": state.lease_expired(now)},
        },
        "unfinished_switch": _unfinished(journal),
        "journal_problems": journal.tail(200).problems,
        "lanes": lanes,
        "unknown_containers": [c.name for c in containers if (c.recipe, c.lane) not in known],
    })


def _pushed(pushes: PushStore, tag: str, registry: str | None) -> dict[str, Any] | None:
    """The registry copy of the current build, as `build --push` recorded it: what fleet nodes pull."""
    record = pushes.find(tag, registry)
    if record is None:
        return None
    return {"reference": record.reference, "tag": record.remote_tag, "digest": record.digest,
            "registry": record.registry, "at": record.at}


def _unfinished(journal: Journal) -> dict[str, Any] | None:
    intent = journal.unfinished_intent()
    if intent is None:
        return None
    return {key: intent.get(key) for key in ("switch", "action", "from", "to", "ts", "who", "steps", "done_steps")}


def _standby(record: StandbyRecord | None, now: datetime, primary: ContainerState | None) -> dict[str, Any] | None:
    """A lane waiting asleep: since when, for how long, the GPU memory it still holds as its engine reported it;
    `alive` false when its container no longer runs (the next rollback drops it and starts the lane cold)."""
    if record is None:
        return None
    since = datetime.fromisoformat(record.since)
    return {"since": record.since, "seconds": round((now - since).total_seconds()), "resident_gib": record.resident_gib,
            "fingerprint_recorded": record.fingerprint.recorded, "alive": primary is not None and primary.running}


def _dead(lane: Lane, own: list[ContainerState]) -> str | None:
    """Why the active lane is not serving when one of its containers is not running: lanectl moves `active` when
    it stops a lane, so an exit here is a death, whatever its code (vLLM exits 0 when its engine core dies)."""
    running = {c.role for c in own if c.running}
    by_role = {c.role: c for c in own}
    down = [f"{role} {'is gone' if role not in by_role else exit_detail(by_role[role].status, by_role[role].exit_code)}"
            for role in lane.roles if role not in running]
    return "; ".join(down) or None


def _container(state: ContainerState, tag: str, now: datetime) -> dict[str, Any]:
    started = state.started_epoch
    uptime = round(now.timestamp() - started) if state.running and started else None
    return {
        "name": state.name,
        "role": state.role,
        "status": state.status,
        "exit_code": state.exit_code,
        "image": state.image,
        "current_build": state.image == tag or state.role != ROLE_PRIMARY,
        "uptime_seconds": uptime,
        "restarts": state.restart_count,
    }

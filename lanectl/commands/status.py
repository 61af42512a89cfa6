from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from lanectl.dockerapi.containers import ContainerEngine, ContainerState
from lanectl.health.engine_exit import exit_detail
from lanectl.host.host_memory import available_gib
from lanectl.lanes.inventory import LANE_LABEL, RECIPE_LABEL, Inventory, LaneContainer
from lanectl.lanes.snapshot import take_snapshot
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.paths import StateFiles, state_dir
from lanectl.state.pushes import PushStore
from lanectl.state.standby import StandbyRecord
from lanectl.watchdog.state import WatchdogStateStore

# A lane may publish no port (validation allows it off Swarm): there is then nothing to probe, which is no failure.
NOT_PROBED = "not probed: its primary publishes no port"

def lane_status(catalog: Catalog) -> Result:
    """Everything an operator asks at 3 a.m.: what runs, is it healthy, which build, is a way back there, what
    differs from the recipes, and what on the engine is in a lane's way.

    The JSON shape (version 1 of the envelope) is documented in the README.
    """
    from lanectl.health.probe import EndpointProbe, probe_base_url

    directory = state_dir()
    engine = ContainerEngine()
    files = StateFiles(directory)
    journal = Journal(files.journal)
    pushes = PushStore(directory)
    # The watchdog restarts a lane by starting its containers again, which Docker's restart count never sees.
    watchdog_restarts = WatchdogStateStore(files.watchdog, quarantine=False).load().restarts_total
    snapshot = take_snapshot(catalog, engine, files, also=catalog.lanes, environ=os.environ,
                             create_secret_key=False, host_memory=available_gib)
    inventory = Inventory(catalog, snapshot)
    # A lane started with --no-gpu is judged against the containers such a start creates: its missing GPUs are said
    # once for the lane, not reported as drift under each container.
    without_gpus = Inventory(catalog, snapshot, with_gpus=False)
    state, standbys = snapshot.state, snapshot.standby
    now = datetime.now(UTC)
    # Mid-switch the active lane is stopped on purpose (stop-first); `unfinished_switch` says so instead.
    switching = snapshot.unfinished is not None
    lanes = []
    for lane in sorted(catalog.lanes.values(), key=lambda lane: (lane.recipe.id, lane.name)):
        plan = snapshot.image_plans[lane.name]
        built = snapshot.images.get(plan.tag)
        own = inventory.containers(lane)
        details = {c.name: engine.container(c.name) for c in own}
        primary = inventory.container(lane, "primary")
        no_gpu = _started_without_gpus(inventory, own)
        judged = without_gpus if no_gpu else inventory
        health = None
        if primary is not None and primary.listed.running and not lane.spec.engine.ports:
            health = NOT_PROBED
        elif primary is not None and primary.listed.running:
            probe = EndpointProbe(probe_base_url(lane), lane.spec.health).health_ok()
            health = "ok" if probe.ok else probe.detail
            if probe.ok and standbys.standby(lane.name) is None:
                health = _asleep(lane, own) or health
        image_labels = engine.image_labels(primary.listed.image_id) if primary else None
        lanes.append({
            "lane": lane.name,
            "recipe": lane.recipe.id,
            "active": state.active == lane.name,
            "known_good": lane.name in state.known_good,
            "image": plan.tag,
            "built": built is not None,
            "health": health,
            "dead": _dead(lane, own) if state.active == lane.name and not switching else None,
            "standby": _standby(standbys.standby(lane.name), now, primary),
            "provenance": {k.removeprefix("io.lanectl."): v for k, v in (image_labels or {}).items()
                           if k.startswith("io.lanectl.")},
            "without_gpus": no_gpu,
            "watchdog_restarts": watchdog_restarts.get(lane.name, 0),
            "containers": [_container(c, details.get(c.name), _wanted_image(inventory, c) or built, judged.drift(c),
                                      now) for c in own],
            "pushed": _pushed(pushes, plan.tag, lane.spec.image.registry),
        })
    known = {(lane.recipe.id, lane.name) for lane in catalog.lanes.values()}
    foreign_names = {f.listed.name for f in inventory.foreign}
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
        "unfinished_switch": _unfinished(snapshot.unfinished),
        "journal_problems": journal.tail(200).problems,
        "lanes": lanes,
        "foreign_containers": [{"name": f.listed.name, "what": f.what, "lanes": list(f.lanes),
                                "status": f.listed.status, "clear_with": f.clearing_command()}
                               for f in inventory.foreign],
        "orphan_containers": [{"name": c.name, "lane": c.lane.name, "role": c.role, "status": c.listed.status}
                              for c in inventory.orphans.values()],
        "unknown_containers": [c.name for c in snapshot.containers
                               if LANE_LABEL in c.labels and c.name not in foreign_names
                               and (c.labels.get(RECIPE_LABEL), c.labels.get(LANE_LABEL)) not in known],
    })


def _pushed(pushes: PushStore, tag: str, registry: str | None) -> dict[str, Any] | None:
    """The registry copy of the current build, as `build --push` recorded it: what fleet nodes pull."""
    record = pushes.find(tag, registry)
    if record is None:
        return None
    return {"reference": record.reference, "tag": record.remote_tag, "digest": record.digest,
            "registry": record.registry, "at": record.at}


def _unfinished(intent: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The snapshot's unfinished intent (the one `switching` is judged by): the journal is read once."""
    if intent is None:
        return None
    return {key: intent.get(key) for key in ("switch", "action", "from", "to", "ts", "who", "steps", "done_steps")}


def _standby(record: StandbyRecord | None, now: datetime, primary: LaneContainer | None) -> dict[str, Any] | None:
    """A lane waiting asleep: since when, for how long, the GPU memory it still holds as its engine reported it;
    `alive` false when its container no longer runs (the next rollback drops it and starts the lane cold)."""
    if record is None:
        return None
    since = datetime.fromisoformat(record.since)
    return {"since": record.since, "seconds": round((now - since).total_seconds()), "resident_gib": record.resident_gib,
            "fingerprint_recorded": record.fingerprint.recorded,
            "alive": primary is not None and primary.listed.running}


def _asleep(lane: Lane, own: list[LaneContainer]) -> str | None:
    """vLLM answers /health 200 while it sleeps (a dev-mode POST /sleep anyone on its port can send): a lane with
    no standby recorded is healthy only when every engine of it says it is awake (invariant 3,
    lanes/invariants.py)."""
    from lanectl.lanes.engine_calls import LaneEngines

    for container in own:
        if container.listed.running and LaneEngines.engine_sleeps(lane, container.role):
            return (f"asleep: {container.name} ({container.role}) answers /health but sleeps, and no switch put it "
                    f"to sleep; `lanectl up {lane.name}` restarts it")
    return None


def _dead(lane: Lane, own: list[LaneContainer]) -> str | None:
    """Why the active lane is not serving when one of its containers is not running: lanectl moves `active` when
    it stops a lane, so an exit here is a death, whatever its code (vLLM exits 0 when its engine core dies)."""
    by_role = {c.role: c.listed for c in own}
    down = []
    for role in lane.roles:
        listed = by_role.get(role)
        if listed is None:
            down.append(f"{role} is gone")
        elif not listed.running:
            down.append(f"{role} {exit_detail(listed.state, listed.exit_code)}")
    return "; ".join(down) or None


def _started_without_gpus(inventory: Inventory, own: list[LaneContainer]) -> bool:
    """Whether the lane's containers were created without the GPUs their recipe asks for (`--no-gpu`)."""
    asked = [(c, desired) for c in own if (desired := inventory.desired(c.lane, c.role)) and desired.fields["gpus"]]
    return bool(asked) and all(c.fields is not None and not c.fields.get("gpus") for c, _ in asked)


def _wanted_image(inventory: Inventory, container: LaneContainer) -> str | None:
    """The image ID the role's container would be created from now (a companion may run an image of its own)."""
    desired = inventory.desired(container.lane, container.role)
    return str(desired.fields["image_id"]) if desired else None


def _container(container: LaneContainer, state: ContainerState | None, built: str | None, drift: list[str],
               now: datetime) -> dict[str, Any]:
    started = state.started_epoch if state else None
    running = container.listed.running
    uptime = round(now.timestamp() - started) if running and started else None
    return {
        "name": container.name,
        "role": container.role,
        "status": container.listed.state,
        "exit_code": state.exit_code if state else container.listed.exit_code,
        "image": container.listed.image,
        "image_id": container.listed.image_id,
        # The image it runs by ID: a rebuild under the same tag is another build.
        "current_build": built is not None and container.listed.image_id == built,
        "drift": drift,
        "uptime_seconds": uptime,
        "restarts": state.restart_count if state else 0,
    }


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "status": {
        "example": """\
$ lanectl status
$ lanectl status --json | jq '.data.lanes[] | select(.active) | .health'
""",
        "exit": {
            0: "the state was read (whatever it shows: status does not judge)",
            2: "an invalid recipe",
        },
    },
}

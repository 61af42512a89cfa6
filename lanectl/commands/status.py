from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from lanectl.dockerapi.containers import ContainerEngine, ContainerState, ListedContainer
from lanectl.health.engine_exit import exit_detail
from lanectl.host.host_memory import available_gib
from lanectl.lanes.inventory import (
    LANE_LABEL,
    RECIPE_LABEL,
    Inventory,
    LabelledLane,
    LaneContainer,
    labelled_lanes,
    recorded_ports,
    role_of,
)
from lanectl.lanes.snapshot import take_snapshot
from lanectl.output import Result, warning
from lanectl.recipe.catalog import Catalog, Lane, unread_summary
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneState
from lanectl.state.paths import StateFiles, state_dir
from lanectl.state.pushes import PushStore
from lanectl.state.standby import StandbyRecord
from lanectl.watchdog.state import WatchdogStateStore

# vLLM's own health route, asked of a lane read from its labels: the recipe's `health_path` is not known without it.
VLLM_HEALTH_PATH = "/health"
LABELLED_PROBE_TIMEOUT_SECONDS = 5.0
# A lane may publish no port (validation allows it off Swarm): there is then nothing to probe, which is no failure.
NOT_PROBED = "not probed: its primary publishes no port"


def lane_status(catalog: Catalog, recipe_problems: Sequence[str] = ()) -> Result:
    """Everything an operator asks at 3 a.m.: what runs, is it healthy, which build, is a way back there, what
    differs from the recipes, and what on the engine is in a lane's way.

    `catalog` holds the lanes of the recipes that load, and `recipe_problems` say why the others do not: a lane no
    recipe that loads has is shown from its containers' labels (`from_labels`), with what only a recipe knows (its
    build, drift) null, and a lane whose image no longer renders with its `recipe_problem`. Status reports, it does
    not judge: it exits 0 whatever it shows, broken recipes included.

    The JSON shape (version 1 of the envelope) is documented in docs/switching.md.
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
    for lane in catalog.lanes.values():
        plan = snapshot.image_plans.get(lane.name)  # None: its image does not render now
        built = snapshot.images.get(plan.tag) if plan else None
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
            "from_labels": False,
            "recipe_problem": snapshot.unrendered.get(lane.name),
            "active": state.active == lane.name,
            "known_good": lane.name in state.known_good,
            "image": plan.tag if plan else None,
            "built": built is not None if plan else None,
            "health": health,
            "dead": _dead(lane, own) if state.active == lane.name and not switching else None,
            "standby": _standby(standbys.standby(lane.name), now, primary is not None and primary.listed.running),
            "provenance": _provenance(image_labels),
            "without_gpus": no_gpu,
            "watchdog_restarts": watchdog_restarts.get(lane.name, 0),
            "containers": [_container(c.listed, c.role, details.get(c.name), now,
                                      current_build=_current(c, _wanted_image(inventory, c) or built, plan is not None),
                                      drift=judged.drift(c) if plan else None) for c in own],
            "pushed": _pushed(pushes, plan.tag, lane.spec.image.registry) if plan else None,
        })
    labelled = labelled_lanes(catalog, snapshot.containers, snapshot.state_dir)
    shown = [found for found in labelled.values() if found.containers]
    if state.active and state.active not in catalog.lanes and not any(f.name == state.active for f in shown):
        shown.append(LabelledLane(state.active, "", ()))  # active, but no recipe and no container of it is left
    for found in shown:
        lanes.append(_labelled(found, engine, snapshot.state.active == found.name and not switching, now,
                               state=state, standby=standbys.standby(found.name), restarts=watchdog_restarts))
    lanes.sort(key=lambda row: (row["recipe"], row["lane"]))
    known = {(lane.recipe.id, lane.name) for lane in catalog.lanes.values()}
    foreign_names = {f.listed.name for f in inventory.foreign}
    read = {c.name for found in shown for c in found.containers}
    problems = list(dict.fromkeys([*recipe_problems, *snapshot.unrendered.values()]))
    lease = state.watchdog_lease
    return Result("status", {
        "state_dir": str(directory),
        "recipe_problems": problems,
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
                               if LANE_LABEL in c.labels and c.name not in foreign_names and c.name not in read
                               and (c.labels.get(RECIPE_LABEL), c.labels.get(LANE_LABEL)) not in known],
    }, messages=(warning(unread_summary(problems)),) if problems else ())


def _labelled(found: LabelledLane, engine: ContainerEngine, judged_dead: bool, now: datetime, *, state: LaneState,
              standby: StandbyRecord | None, restarts: Mapping[str, int]) -> dict[str, Any]:
    """A lane no recipe that loads has, as its containers' labels and the engine show it: health from vLLM's
    `/health` on the port its primary was created with; its build, drift and GPUs are the recipe's to know (null)."""
    primary = found.primary
    running = primary is not None and primary.running
    image_labels = engine.image_labels(primary.image_id) if primary else None
    return {
        "lane": found.name,
        "recipe": found.recipe,
        "from_labels": True,
        "recipe_problem": "no recipe that loads has it",
        "active": state.active == found.name,
        "known_good": found.name in state.known_good,
        "image": primary.image if primary else None,
        "built": None,
        "health": _health_from_labels(primary) if running and primary else None,
        "dead": _dead_from_labels(found) if judged_dead else None,
        "standby": _standby(standby, now, running),
        "provenance": _provenance(image_labels),
        "without_gpus": None,
        "watchdog_restarts": restarts.get(found.name, 0),
        "containers": [_container(c, role_of(c), engine.container(c.name), now, current_build=None, drift=None)
                       for c in found.containers],
        "pushed": None,
    }


def _health_from_labels(primary: ListedContainer) -> str:
    from lanectl.health.engine_http import engine_url
    from lanectl.health.probe import health_at

    ports = recorded_ports(primary.labels)
    if not ports or not 0 < ports[0].published < 65536:
        return NOT_PROBED
    port = ports[0]
    probe = health_at(engine_url(port.host_ip, port.published), VLLM_HEALTH_PATH, LABELLED_PROBE_TIMEOUT_SECONDS)
    return "ok" if probe.ok else probe.detail


def _dead_from_labels(found: LabelledLane) -> str | None:
    """Why the active lane, read from its labels, is not serving: its containers that are not running, or none
    left at all (the roles its recipe had are not known without it)."""
    if not found.containers:
        return "no container of it is left, and no recipe that loads has it"
    down = [f"{role_of(c)} {exit_detail(c.state, c.exit_code)}" for c in found.containers if not c.running]
    return "; ".join(down) or None


def _provenance(image_labels: Mapping[str, str] | None) -> dict[str, str]:
    return {k.removeprefix("io.lanectl."): v for k, v in (image_labels or {}).items() if k.startswith("io.lanectl.")}


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


def _standby(record: StandbyRecord | None, now: datetime, alive: bool) -> dict[str, Any] | None:
    """A lane waiting asleep: since when, for how long, the GPU memory it still holds as its engine reported it;
    `alive` false when its container no longer runs (the next rollback drops it and starts the lane cold)."""
    if record is None:
        return None
    since = datetime.fromisoformat(record.since)
    return {"since": record.since, "seconds": round((now - since).total_seconds()), "resident_gib": record.resident_gib,
            "fingerprint_recorded": record.fingerprint.recorded, "alive": alive}


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


def _current(container: LaneContainer, built: str | None, renders: bool) -> bool | None:
    """Whether it runs the image ID its role would be created from now (a rebuild under the same tag is another
    build); None when the lane's image does not render, so no build is current."""
    return built is not None and container.listed.image_id == built if renders else None


def _container(listed: ListedContainer, role: str, state: ContainerState | None, now: datetime, *,
               current_build: bool | None, drift: list[str] | None) -> dict[str, Any]:
    started = state.started_epoch if state else None
    uptime = round(now.timestamp() - started) if listed.running and started else None
    return {
        "name": listed.name,
        "role": role,
        "status": listed.state,
        "exit_code": state.exit_code if state else listed.exit_code,
        "image": listed.image,
        "image_id": listed.image_id,
        "current_build": current_build,
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
$ lanectl status --json | jq '.data.recipe_problems'   # [] unless a recipe does not load or render
""",
        "exit": {
            0: ("the state was read, whatever it shows (status does not judge): recipes that do not load included, "
                "whose lanes are shown from their containers' labels, with the first problem on one line "
                "(`recipe_problems` in --json)"),
            1: "the Docker engine could not be asked",
            2: "a recipes folder path or a state folder that cannot be used",
        },
    },
}

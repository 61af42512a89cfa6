"""Planning a switch between lanes: pure functions from what the engine shows to a list of steps.

The box runs one lane at a time where lanes share a GPU or a host port: a single GPU cannot
hold two lanes, so a switch stops the old lane first (a start-first rolling update deadlocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lanectl.dockerapi.containers import ContainerState
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane

Action = Literal["stop", "remove", "create", "start", "gate", "activate"]


@dataclass(frozen=True)
class Step:
    action: Action
    lane: str
    container: str = ""
    role: str = ""
    timeout: int = 0

    @property
    def key(self) -> str:
        """Stable name of the step in the journal."""
        return f"{self.action}:{self.container or self.lane}"

    def describe(self) -> str:
        what = f"{self.container} ({self.role} of {self.lane})" if self.container else self.lane
        if self.action == "stop":
            return f"stop {what}, allowing {self.timeout} s to exit"
        if self.action == "remove":
            return f"remove {what}: its image is not the lane's current build"
        if self.action == "create":
            return f"create {what}"
        if self.action == "start":
            return f"start {what}"
        if self.action == "gate":
            return f"hold {self.lane} to its health gate"
        return f"mark {self.lane} active and known-good"


def gpu_ids(lane: Lane) -> set[str] | None:
    """The GPUs a lane's containers ask for; None means "all or an unnamed count" (conflicts with any GPU)."""
    return lane.spec.gpu_ids()


def host_ports(lane: Lane) -> set[tuple[str, int]]:
    engines = [lane.spec.engine, *(c.engine for c in lane.spec.companions.values())]
    return {(port.protocol, port.published) for engine in engines for port in engine.ports}


def uses_gpus(lane: Lane) -> bool:
    return lane.spec.uses_gpus()


def lanes_conflict(a: Lane, b: Lane) -> bool:
    if host_ports(a) & host_ports(b):
        return True
    if uses_gpus(a) and uses_gpus(b):
        ids_a, ids_b = gpu_ids(a), gpu_ids(b)
        return ids_a is None or ids_b is None or bool(ids_a & ids_b)
    return False


def stop_steps(lane: Lane, observed: dict[str, ContainerState]) -> list[Step]:
    """Companions stop before their primary."""
    steps = []
    for role in reversed(lane.roles):
        name = lane.container_name(role)
        state = observed.get(name)
        if state is not None and state.status in ("running", "restarting", "paused"):
            steps.append(Step("stop", lane.name, name, role, _stop_timeout(lane, role)))
    return steps


def bring_up_steps(lane: Lane, image_tag: str, observed: dict[str, ContainerState]) -> list[Step]:
    """Primary first, then companions; a container built from another image is recreated."""
    steps: list[Step] = []
    primary = observed.get(lane.container_name())
    primary_ready = primary is not None and primary.running and primary.image == image_tag
    for role in lane.roles:
        name = lane.container_name(role)
        state = observed.get(name)
        wanted = image_tag if role == ROLE_PRIMARY else (lane.spec.companions[role].image or image_tag)
        if role != ROLE_PRIMARY and not primary_ready and state is not None and state.running:
            # A companion starts after its primary: stop it while the primary is (re)started.
            steps.insert(0, Step("stop", lane.name, name, role, _stop_timeout(lane, role)))
            state = None if state.image != wanted else _stopped(state)
        if state is not None and state.image != wanted:
            steps += [Step("remove", lane.name, name, role), Step("create", lane.name, name, role),
                      Step("start", lane.name, name, role)]
        elif state is None:
            steps += [Step("create", lane.name, name, role), Step("start", lane.name, name, role)]
        elif not state.running:
            steps.append(Step("start", lane.name, name, role))
    return steps


def plan_switch(target: Lane, image_tag: str, catalog: Catalog, observed: list[ContainerState]) -> list[Step]:
    by_name = {state.name: state for state in observed}
    steps: list[Step] = []
    for lane in running_lanes(catalog, observed):
        if lane.name != target.name and lanes_conflict(lane, target):
            steps += stop_steps(lane, by_name)
    steps += bring_up_steps(target, image_tag, by_name)
    steps += [Step("gate", target.name), Step("activate", target.name)]
    return steps


def running_lanes(catalog: Catalog, observed: list[ContainerState]) -> list[Lane]:
    """Lanes of this catalog with a running container; another project's lane of the same name is not ours."""
    keys = dict.fromkeys((s.recipe, s.lane) for s in observed if s.status in ("running", "restarting", "paused"))
    return [catalog.lanes[lane] for recipe, lane in keys
            if lane in catalog.lanes and catalog.lanes[lane].recipe.id == recipe]


def _stop_timeout(lane: Lane, role: str) -> int:
    engine = lane.spec.engine if role == ROLE_PRIMARY else lane.spec.companions[role].engine
    return engine.stop_timeout_seconds


def _stopped(state: ContainerState) -> ContainerState:
    from dataclasses import replace

    return replace(state, status="exited")

"""Planning a switch between lanes: pure functions from what the engine shows to a list of steps.

The box runs one lane at a time where lanes share a GPU or a host port: a single GPU cannot
hold two lanes, so a switch stops the old lane first (a start-first rolling update deadlocks).

A lane whose recipe asks for a standby is put to sleep instead (vLLM sleep mode frees its GPU memory but
keeps its process), so that a rollback to it is a wake; at most one lane sleeps on a GPU, and a lane that
cannot sleep safely (no fingerprint to check its wake against, too little host memory for its weights,
a port the next lane needs, a rollback leaving it) is stopped, with the reason on its step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lanectl.dockerapi.containers import ContainerState
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.recipe.model import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

Action = Literal["stop", "remove", "create", "start", "gate", "activate", "sleep", "check-memory", "wake",
                 "wake-check"]


@dataclass(frozen=True)
class Step:
    action: Action
    lane: str
    container: str = ""
    role: str = ""
    timeout: int = 0
    why: str = field(default="", compare=False)  # why a lane that could wait asleep is stopped instead

    @property
    def key(self) -> str:
        """Stable name of the step in the journal."""
        return f"{self.action}:{self.container or self.lane}"

    def describe(self) -> str:
        what = f"{self.container} ({self.role} of {self.lane})" if self.container else self.lane
        if self.action == "stop":
            return f"stop {what}, allowing {self.timeout} s to exit" + (f" ({self.why})" if self.why else "")
        if self.action == "sleep":
            return f"put {what} to sleep (vLLM sleep mode, level 1): it stays as a standby"
        if self.action == "check-memory":
            return f"check that the GPUs have the memory {self.lane} needs beside the standby"
        if self.action == "wake":
            return f"wake {what}"
        if self.action == "wake-check":
            return f"check {self.lane}'s greedy output against the fingerprint of its last passed gate"
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


def stop_steps(lane: Lane, observed: dict[str, ContainerState], why: str = "") -> list[Step]:
    """Companions stop before their primary."""
    steps = []
    for role in reversed(lane.roles):
        name = lane.container_name(role)
        state = observed.get(name)
        if state is not None and state.status in ("running", "restarting", "paused"):
            steps.append(Step("stop", lane.name, name, role, _stop_timeout(lane, role), why))
    return steps


def sleep_steps(lane: Lane) -> list[Step]:
    """Companions fall asleep before their primary, as they stop before it."""
    return [Step("sleep", lane.name, lane.container_name(role), role) for role in reversed(lane.roles)]


def wake_steps(lane: Lane) -> list[Step]:
    """Every container wakes (the switcher wakes them together: separate engines on separate GPUs), then the
    gate and the wake check."""
    return [*(Step("wake", lane.name, lane.container_name(role), role) for role in lane.roles),
            Step("gate", lane.name), Step("wake-check", lane.name)]


@dataclass(frozen=True)
class StandbyFacts:
    """What a plan needs to know about standbys, measured by the caller."""

    asleep: frozenset[str] = frozenset()  # lanes recorded asleep whose containers all still run
    fingerprinted: frozenset[str] = frozenset()  # lanes with a wake-check fingerprint from a passed gate
    host_available_gib: float | None = None  # MemAvailable
    rollback: bool = False  # a rollback never leaves the lane it rolls away from asleep


def standby_refusal(leaving: Lane, target: Lane, facts: StandbyFacts) -> str | None:
    """Why `leaving` (a lane whose recipe asks for a standby) must be stopped rather than left asleep beside
    `target`; None when it may sleep."""
    standby = leaving.spec.standby
    if standby is None:
        return "its recipe asks for no standby"
    if facts.rollback:
        return "a rollback stops the lane it leaves"
    shared = sorted(host_ports(leaving) & host_ports(target))
    if shared:
        return f"{target.name} publishes its host port {shared[0][1]}/{shared[0][0]}, which a sleeping lane keeps"
    if leaving.name not in facts.fingerprinted:
        return "no wake-check fingerprint is recorded for it, so a wake could not be checked"
    if facts.host_available_gib is None:
        return "host memory is unknown (/proc/meminfo unreadable), and level-1 sleep copies the weights there"
    if facts.host_available_gib < standby.weights_gib:
        return (f"host memory: {facts.host_available_gib:.1f} GiB available, its weights need "
                f"{standby.weights_gib:g} GiB (level-1 sleep copies them to host memory)")
    return None


def gpu_memory_shortfall(target: Lane, memory: dict[str, tuple[int, int]]) -> str | None:
    """vLLM refuses to start when a GPU's free memory is below its --gpu-memory-utilization share of the total:
    the first GPU of `target` where that is so, from nvidia-smi's (total, free) MiB; None when all fit."""
    for role, engine in target.spec.engines():
        if engine.gpus is None:
            continue
        share = engine.gpu_memory_utilization() or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        devices = engine.gpus.device_ids if engine.gpus.device_ids is not None else sorted(
            key for key in memory if key.isdigit())
        for device in devices:
            if device not in memory:
                return f"GPU {device} of {target.name}'s {role} is not among those nvidia-smi lists"
            total, free = memory[device]
            if free < share * total:
                return (f"GPU {device}: {free / 1024:.1f} GiB free, and {target.name}'s {role} needs "
                        f"{share * total / 1024:.1f} GiB (--gpu-memory-utilization {share:g} of "
                        f"{total / 1024:.1f} GiB)")
    return None


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


def plan_switch(target: Lane, image_tag: str, catalog: Catalog, observed: list[ContainerState], *,
                active: str | None = None, standby: StandbyFacts = StandbyFacts()) -> list[Step]:
    """Leave the lanes that conflict with `target` (the active one asleep when its recipe asks and it may;
    every other one stopped), then bring `target` up: wake it when it waits asleep, else start it."""
    by_name = {state.name: state for state in observed}
    waking = target.name in standby.asleep
    leaving = [lane for lane in running_lanes(catalog, observed)
               if lane.name != target.name and lanes_conflict(lane, target)]
    sleeper = next((lane for lane in leaving if lane.name == active and lane.spec.standby is not None), None)
    refusal = None
    if sleeper is not None:
        refusal = ("the lane it rolls back to needs all of its GPU memory back" if waking
                   else standby_refusal(sleeper, target, standby))
    sleeps = sleeper if refusal is None else None
    steps: list[Step] = []
    for lane in running_lanes(catalog, observed):
        if lane is sleeps:
            continue
        if lane.name in standby.asleep and lane in leaving:
            steps += stop_steps(lane, by_name, f"ends its standby: {target.name} takes its GPUs")
        elif lane.name in standby.asleep and sleeps is not None and lanes_conflict(lane, sleeps):
            steps += stop_steps(lane, by_name, f"ends its standby: one per GPU set, and {sleeps.name} takes its place")
        elif lane in leaving:
            steps += stop_steps(lane, by_name, f"not left asleep: {refusal}" if lane is sleeper else "")
    if sleeps is not None:
        steps += [*sleep_steps(sleeps), Step("check-memory", target.name)]
    if waking:
        steps += [*wake_steps(target), Step("activate", target.name)]
        return steps
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

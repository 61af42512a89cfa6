"""Planning every change to the box's lanes: a pure function from a snapshot and an intent to a whole plan.

`plan_up`, `plan_rollback`, `plan_down`, `plan_restart` and `plan_reconcile` take what `take_snapshot` read and
return a `Plan`: the steps in order, grouped in phases; what replaces a phase when one of its steps fails (a
sleep that fails stops the lane instead; a wake that fails starts it cold); and the way back when a step with
no such fallback fails or the switch is interrupted. The executor (`lanes/execute.py`) runs exactly these
steps, and `--dry-run` prints exactly this plan.

The box runs one lane at a time where lanes share a GPU or a host port: a single GPU cannot hold two lanes, so
a switch stops the old lane first (a start-first rolling update deadlocks). A lane whose recipe asks for a
standby is put to sleep instead, so that a rollback to it is a wake; at most one lane sleeps on a GPU, and a
lane that cannot sleep safely is stopped, with the reason on its step. A container whose spec differs from its
lane's recipe (its digest, `image/containers.py`) is recreated, and the step names what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field, replace
from typing import Any, Literal

from lanectl.dockerapi.containers import ContainerSpec, ListedContainer
from lanectl.dockerapi.labels import STATE_DIR_LABEL
from lanectl.errors import BadInput, OperationFailed
from lanectl.health.engine_exit import exit_code_text
from lanectl.lanes.invariants import gpus_overlap
from lanectl.lanes.inventory import (
    ASIDE_MARK,
    LANE_LABEL,
    RECIPE_LABEL,
    Inventory,
    LabelledLane,
    LaneContainer,
    host_ports,
    labelled_lanes,
    recorded_stop_timeout,
    role_of,
)
from lanectl.lanes.snapshot import Snapshot
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.recipe.model import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from lanectl.records import frozen
from lanectl.state.lanes import LaneState

# A switch disarms the watchdog for the target's startup budget plus this margin; the plan re-arms it.
LEASE_MARGIN_SECONDS = 300
# What a stop allows a container that records no stop timeout of its own: Docker's default.
DOCKER_STOP_TIMEOUT = 10

Action = Literal["disarm", "arm", "stop", "remove", "set-aside", "put-back", "create", "start", "gate", "activate",
                 "deactivate", "sleep", "check-memory", "wake", "wake-check", "forget-standby", "gpu-memory",
                 "service-create", "service-update", "service-rollback", "service-remove", "node-gate"]
# finish / undo / finish-down: what a plan for a switch a killed run left unfinished does with it.
Kind = Literal["up", "rollback", "down", "restart", "finish", "undo", "finish-down", "noop"]


@frozen
class Step:
    action: Action
    lane: str
    container: str = ""
    role: str = ""
    seconds: float = 0  # stop: the container's stop timeout; gate: its budget; disarm: the lease
    why: str = field(default="", compare=False)
    spec: ContainerSpec | None = field(default=None, compare=False, repr=False)  # create: exactly what
    rename_to: str = ""  # set-aside: the name it is set aside as; put-back: the name it takes back
    node: str = ""  # a fleet step: the Swarm node it changes (`container` is then the service's name)
    service: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # service-*: exactly what

    @property
    def key(self) -> str:
        """The step's name in the journal and in `--dry-run --json`."""
        return f"{self.action}:{self.container or self.lane}"

    def describe(self) -> str:
        what = f"{self.container} ({self.role} of {self.lane})" if self.container else self.lane
        why = f" ({self.why})" if self.why else ""
        texts = {
            "disarm": f"disarm the watchdog for {self.seconds:.0f} s ({self.lane}'s startup budget and a margin)",
            "arm": "re-arm the watchdog",
            "stop": f"stop {what}, allowing {self.seconds:.0f} s to exit{why}",
            "remove": f"remove {what}{why}",
            "set-aside": f"set {what} aside as {self.rename_to}, until its replacement passes its gate",
            "put-back": f"put {self.container} back as {self.rename_to}, if it was set aside",
            "create": f"create {what}{why}",
            "start": f"start {what}",
            "gate": f"hold {self.lane} to its health gate (within {self.seconds:g} s)",
            "activate": f"mark {self.lane} active and known-good",
            "deactivate": f"mark {self.lane} no longer active{why}",
            "sleep": f"put {what} to sleep (vLLM sleep mode, level 1): it stays as a standby",
            "check-memory": f"check that the GPUs have the memory {self.lane} needs beside the standby",
            "wake": f"wake {self.lane} (every container at once)",
            "wake-check": f"check {self.lane}'s greedy output against the fingerprint of its last passed gate",
            "forget-standby": f"forget {self.lane}'s standby{why}",
            "gpu-memory": f"wait until {self.lane}'s GPUs have released their memory",
            "service-create": f"create service {self.container} on {self.node} ({self.role} of {self.lane}){why}",
            "service-update": f"update service {self.container} on {self.node} to {self.lane}{why}",
            "service-rollback": f"roll service {self.container} on {self.node} back to {self.lane} (Swarm's "
                                "rollback)",
            "service-remove": f"remove service {self.container} from {self.node}{why}",
            "node-gate": f"hold {self.lane} on {self.node} to its health gate (within {self.seconds:g} s)",
        }
        return texts[self.action]


@frozen
class Phase:
    """Steps that run in order. When one fails: the `fallback` runs instead of the rest and the plan goes on
    (a standby that cannot sleep is stopped); with no fallback, the plan takes its way back. An `optional`
    phase's failure is reported and the plan goes on: it comes after the lane passed its gate."""

    steps: tuple[Step, ...]
    fallback: tuple[Step, ...] = ()
    optional: bool = False


@frozen
class Plan:
    kind: Kind
    lane: str | None  # the lane it brings up (or stops, for down)
    previous: str | None = None  # the lane the way back brings back
    phases: tuple[Phase, ...] = ()
    way_back: tuple[Phase, ...] = ()  # when a step with no fallback fails, or the switch is interrupted
    abandon: tuple[Step, ...] = ()  # when the way back fails too
    message: str = ""  # a no-op's answer
    alone: str = ""  # why the way back only stops the lane: "--no-rollback", "there was no lane before it"
    notes: tuple[str, ...] = ()  # what the planner noticed: a standby lost, a cold start and why
    with_gpus: bool = True
    budget_seconds: float = 0  # the longest gate of the plan: how long the watchdog is disarmed, less the margin

    @property
    def steps(self) -> tuple[Step, ...]:
        """The main path: what runs when every step succeeds."""
        return tuple(step for phase in self.phases for step in phase.steps)

    @property
    def keys(self) -> list[str]:
        return [step.key for step in self.steps]

    def lines(self) -> list[str]:
        """The plan as `--dry-run` prints it: every step, each fallback under its phase, then the way back."""
        if self.kind == "noop":
            return [f"would do nothing: {self.message}"]
        lines = [f"note: {note}" for note in self.notes]
        for phase in self.phases:
            lines += [f"would {step.describe()}" for step in phase.steps]
            if phase.fallback:
                lines.append("  if that fails: " + "; ".join(step.describe() for step in phase.fallback))
        if self.way_back:
            reason = f"bring {self.previous} back" if self.previous else f"stop {self.lane}"
            lines.append(f"on a failed step or an interrupt, {reason}:")
            for phase in self.way_back:
                lines += [f"  would {step.describe()}" for step in phase.steps]
                if phase.fallback:
                    lines.append("    if that fails: " + "; ".join(step.describe() for step in phase.fallback))
        return lines

    def as_dict(self) -> dict[str, Any]:
        def phases(group: tuple[Phase, ...]) -> list[dict[str, Any]]:
            return [{"steps": [s.key for s in p.steps], "fallback": [s.key for s in p.fallback],
                     "optional": p.optional} for p in group]

        return {"kind": self.kind, "lane": self.lane, "previous": self.previous, "keys": self.keys,
                "steps": self.lines(), "phases": phases(self.phases), "way_back": phases(self.way_back),
                "abandon": [s.key for s in self.abandon], "notes": list(self.notes), "message": self.message}


# -- conflicts and standbys ----------------------------------------------------------------------------------

def lanes_conflict(a: Lane, b: Lane) -> bool:
    return bool(host_ports(a) & host_ports(b)) or gpus_overlap(a, b)


def standby_refusal(leaving: Lane, target: Lane, snapshot: Snapshot, *, rollback: bool) -> str | None:
    """Why `leaving` (the active lane) must be stopped rather than left asleep beside `target`; None when it may
    sleep."""
    standby = leaving.spec.standby
    if standby is None:
        return "its recipe asks for no standby"
    if rollback:
        return "a rollback stops the lane it leaves"
    shared = sorted(host_ports(leaving) & host_ports(target))
    if shared:
        return f"{target.name} publishes its host port {shared[0][1]}/{shared[0][0]}, which a sleeping lane keeps"
    if leaving.name not in snapshot.standby.fingerprints:
        return "no wake-check fingerprint is recorded for it, so a wake could not be checked"
    memory = snapshot.host_memory_gib
    if memory is None:
        return "host memory is unknown (/proc/meminfo unreadable), and level-1 sleep copies the weights there"
    if memory < standby.weights_gib:
        return (f"host memory: {memory:.1f} GiB available, its weights need {standby.weights_gib:g} GiB "
                "(level-1 sleep copies them to host memory)")
    return None


def standbys(inventory: Inventory, *, drift: bool = True) -> tuple[set[str], list[tuple[str, str]]]:
    """The recorded standbys that can still be woken, and the lost ones with why: a container that died or was
    removed while asleep, a lane gone from the recipes, and with `drift` one whose containers no longer match the
    recipe (a switch judges that; the watchdog, which does not know whether a lane runs with --no-gpu, does not)."""
    asleep: set[str] = set()
    lost: list[tuple[str, str]] = []
    for record in inventory.snapshot.standby.standbys:
        lane = inventory.catalog.lanes.get(record.lane)
        reason = "its lane is no longer in the recipes" if lane is None else _why_lost(inventory, lane, drift)
        if reason is None:
            asleep.add(record.lane)
        else:
            lost.append((record.lane, reason))
    return asleep, lost


def drop_standby_steps(inventory: Inventory, name: str, reason: str, *, stop: bool = True) -> tuple[Step, ...]:
    """Forget a standby that can no longer be woken, and stop what is left of it live (a companion still asleep,
    a container someone paused), each container with its own drain: lanectl never leaves behind, holding GPUs,
    a lane it no longer counts on, and a later start of it begins from stopped. A lane gone from the recipes
    keeps its containers for `status` and `down`, which stop them from their labels."""
    lane = inventory.catalog.lanes.get(name)
    stops = stop_steps(inventory, lane, f"its standby is lost: {reason}") if lane is not None and stop else ()
    return (*stops, Step("forget-standby", name, why=reason))


def plan_drop_lost_standbys(catalog: Catalog, snapshot: Snapshot) -> Plan | None:
    """The watchdog's pass over the lanes waiting asleep: each one that died, was removed or paused while asleep is
    dropped (`drop_standby_steps`), so that the next rollback to it says it starts cold and its GPUs are free for
    the active lane's restart. Drift is not judged here: the watchdog does not know whether a lane runs with
    --no-gpu. None when every standby can still be woken."""
    inventory = Inventory(catalog, snapshot)
    lost = standbys(inventory, drift=False)[1]
    if not lost:
        return None
    phases = []
    for name, reason in lost:
        # A companion its recipe no longer has is asleep with it: stopped too (`up` and `down` remove it).
        why = f"its standby is lost: {reason}"
        orphans = tuple(Step("stop", name, c.name, c.role, _own_stop_timeout(c.listed), why)
                        for c in inventory.orphans.values() if c.lane.name == name and c.listed.live)
        phases.append(Phase((*orphans, *drop_standby_steps(inventory, name, reason))))
    return Plan("down", lost[0][0], phases=tuple(phases))


def _why_lost(inventory: Inventory, lane: Lane, drift: bool) -> str | None:
    for role in lane.roles:
        container = inventory.container(lane, role)
        if container is None:
            # lanectl cannot tell a container removed while its lane slept from a role the recipe gained since.
            return f"it has no {role} container (removed while asleep, or a role added to its recipe since)"
        if container.listed.state == "paused":
            return f"its {role} container was paused while asleep (docker pause): it answers nothing, not even a wake"
        if not container.listed.running:
            code = container.listed.exit_code
            return f"its {role} container {container.listed.state} while asleep" + (
                f" ({exit_code_text(code)})" if code is not None else "")
        changes = inventory.drift(container) if drift else []
        if changes:
            return f"its {role} container no longer matches the recipe ({', '.join(changes)})"
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


# -- step builders --------------------------------------------------------------------------------------------

def stop_steps(inventory: Inventory, lane: Lane, why: str = "", *, every: bool = False) -> tuple[Step, ...]:
    """Companions stop before their primary; only live containers, unless `every` (a way back stops whatever
    the failed switch may have started)."""
    steps = []
    for role in reversed(lane.roles):
        container = inventory.container(lane, role)
        if every or (container is not None and container.listed.live):
            steps.append(Step("stop", lane.name, lane.container_name(role), role,
                              _stop_timeout(inventory, lane, role), why))
    return tuple(steps)


def bring_up_steps(inventory: Inventory, lane: Lane, *, recreate: bool = True) -> tuple[Step, ...]:
    """Primary first, then companions: each created when missing, recreated when its spec differs from the
    recipe (`recreate`; a watchdog restart repairs, it does not upgrade), started when stopped (stopped first
    when paused: Docker refuses to start a paused container, and stops one as it stops a running one). A companion
    starts after its primary: a running one is stopped while its primary is (re)started. A lane whose containers
    may be asleep is stopped first, so that every container starts from stopped or is recreated."""
    asleep = stop_asleep_steps(inventory, lane)
    if asleep:
        inventory = inventory.with_stopped(lane)
    first: list[Step] = []
    steps: list[Step] = []
    primary = inventory.container(lane, ROLE_PRIMARY)
    primary_ready = primary is not None and primary.listed.running and not (recreate and inventory.drift(primary))
    for role in lane.roles:
        name = lane.container_name(role)
        container = inventory.container(lane, role)
        changes = inventory.drift(container) if container is not None and recreate else []
        live = container is not None and container.listed.live
        if role != ROLE_PRIMARY and not primary_ready and live:
            first.append(Step("stop", lane.name, name, role, _stop_timeout(inventory, lane, role),
                              f"its primary is being {'re' if primary else ''}started"))
            live = False
        if container is None:
            steps += [_create(inventory, lane, role, ""), Step("start", lane.name, name, role)]
        elif changes:
            if live:
                steps.append(Step("stop", lane.name, name, role, _stop_timeout(inventory, lane, role),
                                  "to recreate it"))
            # Renamed, not removed: until the new container passes its gate, the old one is the way back.
            steps += [Step("set-aside", lane.name, name, role, rename_to=aside_name(container)),
                      _create(inventory, lane, role, "recreated: " + ", ".join(changes)),
                      Step("start", lane.name, name, role)]
        elif not (container.listed.running and live):
            if live:  # paused (frozen) or restarting: `docker start` refuses a paused container
                steps.append(Step("stop", lane.name, name, role, _stop_timeout(inventory, lane, role),
                                  f"it is {container.listed.state}: a start begins from stopped"))
            steps.append(Step("start", lane.name, name, role))
    return (*asleep, *first, *steps)


def orphan_steps(inventory: Inventory) -> tuple[Step, ...]:
    """Stop (with its own drain) and remove every container lanectl made for a role its lane's recipe no longer
    has: it holds a GPU and a port that no status, down or rollback would otherwise account for."""
    steps: list[Step] = []
    for container in inventory.orphans.values():
        why = f"its role {container.role} is no longer in {container.lane.name}'s recipe"
        if container.listed.live:
            steps.append(Step("stop", container.lane.name, container.name, container.role,
                              _own_stop_timeout(container.listed), why))
        steps.append(Step("remove", container.lane.name, container.name, container.role, why=why))
    return tuple(steps)


def stop_asleep_steps(inventory: Inventory, lane: Lane) -> tuple[Step, ...]:
    """Stop the running containers of a lane that is not woken but may be asleep: its standby is recorded (a
    lost one is not woken), or was dropped since it last served (one whose companion died asleep leaves its
    primary asleep). `docker start` of a sleeping container does nothing, and a sleeping vLLM answers /health
    200 but no request: a start must begin from stopped."""
    standby = inventory.snapshot.standby
    put_to_sleep = {lane.container_name(role) for role in lane.roles} & inventory.snapshot.asleep
    if put_to_sleep:
        # Asleep with no standby recorded: someone sent it POST /sleep (a dev-mode route anyone on the port can use).
        return stop_steps(inventory, lane, f"{sorted(put_to_sleep)[0]} sleeps, by no switch of lanectl's: a start "
                                           "begins stopped")
    if standby.standby(lane.name) is None and lane.name not in standby.dropped:
        return ()
    return stop_steps(inventory, lane, "its standby is dropped and it may still sleep: a cold start begins stopped")


def aside_name(container: LaneContainer) -> str:
    """What a container being replaced is renamed to, until its replacement passes its gate."""
    return f"{container.name}{ASIDE_MARK}{container.listed.id[:12]}"


def _asides(steps: tuple[Step, ...]) -> list[Step]:
    return [step for step in steps if step.action == "set-aside"]


def _drop_asides(asides: list[Step], why: str) -> tuple[Step, ...]:
    return tuple(Step("remove", s.lane, s.rename_to, s.role, why=why) for s in asides)


def _put_back(asides: list[Step]) -> tuple[Step, ...]:
    """The way back from a recreate: the replacement goes and the container set aside takes its name again; a
    step that finds nothing set aside (the switch ended before it) changes nothing."""
    return tuple(Step("put-back", aside.lane, aside.rename_to, aside.role, rename_to=aside.container)
                 for aside in asides)


def _left_aside(inventory: Inventory, lane: Lane) -> list[Step]:
    """What a killed switch set aside of `lane`, as the set-aside steps that did it."""
    return [Step("set-aside", lane.name, lane.container_name(c.role), c.role, rename_to=c.name)
            for c in inventory.aside.values() if c.lane.name == lane.name]


def _create(inventory: Inventory, lane: Lane, role: str, why: str) -> Step:
    desired = inventory.desired(lane, role)
    unrendered = inventory.snapshot.unrendered.get(lane.name)
    if desired is None and unrendered is not None:
        raise OperationFailed(f"{lane.name}: its {role} container must be created, and its image does not render: "
                              f"{unrendered}")
    if desired is None:
        raise OperationFailed(f"{lane.name}: its {role} container must be created, and its image is not here; "
                              f"run `lanectl build {lane.name}` first")
    return Step("create", lane.name, lane.container_name(role), role, why=why, spec=desired.spec)


def _gate(lane: Lane, *, woken: bool = False) -> Step:
    standby = lane.spec.standby
    if woken and standby is not None:
        # A woken lane is held to its gate within the wake's budget, not the model's startup budget: a wake that
        # left the engine broken must fall back to the cold path in seconds, not after 20 minutes.
        return Step("gate", lane.name, seconds=standby.wake_timeout_seconds)
    return Step("gate", lane.name, seconds=lane.spec.health.startup_budget_minutes * 60)


def _wake_phase(inventory: Inventory, lane: Lane) -> Phase:
    """Wake, gate, wake check; on any failure the cold path (stop, start, gate), so a rollback through a standby
    is never worse than one without."""
    cold = (*stop_steps(inventory, lane, "cold path", every=True), *(Step("start", lane.name, lane.container_name(
        role), role) for role in lane.roles), _gate(lane))
    return Phase((Step("wake", lane.name), _gate(lane, woken=True), Step("wake-check", lane.name)), fallback=cold)


def _stop_timeout(inventory: Inventory, lane: Lane, role: str) -> int:
    """The container's own stop timeout, as it was created (its drain was rendered from it: invariant 2,
    `lanes/invariants.py`); the recipe's only for a container that records none. The executor asks the engine
    again before the stop: this is what `--dry-run` shows."""
    container = inventory.container(lane, role)
    recorded = recorded_stop_timeout(container.listed.labels) if container is not None else None
    if recorded is not None:
        return recorded
    engine = lane.spec.engine if role == ROLE_PRIMARY else lane.spec.companions[role].engine
    return engine.stop_timeout_seconds


def _own_stop_timeout(listed: ListedContainer) -> int:
    """A container's own stop timeout, for a container no recipe that loads has a role for."""
    recorded = recorded_stop_timeout(listed.labels)
    return DOCKER_STOP_TIMEOUT if recorded is None else recorded


def _disarm(lane: Lane) -> Step:
    return Step("disarm", lane.name, seconds=lane.spec.health.startup_budget_minutes * 60 + LEASE_MARGIN_SECONDS)


# -- refusals -------------------------------------------------------------------------------------------------

def refuse_foreign(inventory: Inventory, lane: Lane) -> None:
    """Containers lanectl did not make that hold the lane's names or host ports, and live ones it made for a lane
    on the lane's GPUs that someone renamed (lanectl never stops a container under a name that is not a lane's):
    the switch would fail on them after stopping what serves, so it is refused before anything changes (exit 2)."""
    blocking = inventory.blocking(lane)
    blocking += [f for f in inventory.foreign if f not in blocking and f.listed.live and _made_for_gpus_of(
        inventory.catalog, f.listed, lane)]
    if blocking:
        found = "; ".join(f"{f.describe()}: clear it with `{f.clearing_command()}`" for f in blocking)
        raise BadInput(f"{lane.name} cannot start: {found}. lanectl did not create "
                       f"{'it' if len(blocking) == 1 else 'them'} and will not stop or adopt "
                       f"{'it' if len(blocking) == 1 else 'them'}; nothing was changed")


def _made_for_gpus_of(catalog: Catalog, listed: ListedContainer, lane: Lane) -> bool:
    """Whether lanectl made `listed` for a lane (of these recipes) that shares a GPU with `lane`."""
    made_for = catalog.lanes.get(listed.labels.get(LANE_LABEL, ""))
    return made_for is not None and listed.labels.get(RECIPE_LABEL) == made_for.recipe.id and gpus_overlap(
        made_for, lane)


def refuse_other_state_folder(inventory: Inventory) -> None:
    """One engine, one state: lane containers made from another state folder are what that folder's journal,
    active lane and kept lanes count on. A switch from here would stop its active lane and prune its kept ones,
    so it is refused before anything changes, naming the folder (exit 2)."""
    snapshot = inventory.snapshot
    if not snapshot.state_dir:
        return
    others = sorted({owner for c in [*inventory.own.values(), *inventory.aside.values()]
                     if (owner := c.listed.labels.get(STATE_DIR_LABEL)) and owner != snapshot.state_dir})
    if others:
        raise _other_state_folder(others[0], snapshot.state_dir)


def _other_state_folder(other: str, here: str) -> BadInput:
    return BadInput(f"this engine's lanes belong to the state folder {other}, not {here}: one engine has one "
                    f"state. Run lanectl with LANECTL_STATE_DIR={other} (as the user who owns it), or `lanectl down` "
                    "from there first; nothing was changed")


def _refuse_unset_secrets(snapshot: Snapshot, steps: Sequence[Step]) -> None:
    """A container is created with its secrets' values from lanectl's environment: one that is not set would fail
    the create, after the serving lane was stopped or put to sleep. Refused before anything changes."""
    for step in steps:
        unset = sorted(set(step.spec.secret_env) & snapshot.secrets_unset) if step.spec is not None else []
        if step.action == "create" and unset:
            raise BadInput(f"{step.container} must be created, and its secret {unset[0]} is not set in lanectl's "
                           f"environment; export {unset[0]} (or add it to the env file the watchdog reads) and run "
                           "the command again; nothing was changed")


def require_built(snapshot: Snapshot, lane: Lane) -> None:
    if lane.name in snapshot.unrendered:
        raise BadInput(snapshot.unrendered[lane.name])
    if snapshot.built(lane.name) is None:
        tag = snapshot.image_plans[lane.name].tag if lane.name in snapshot.image_plans else lane.name
        raise OperationFailed(f"{lane.name}: image {tag} is not built; run `lanectl build {lane.name}` first")


# -- the intents ----------------------------------------------------------------------------------------------

def plan_up(catalog: Catalog, snapshot: Snapshot, target: Lane, *, rollback: bool = False,
            rollback_on_failure: bool = True, with_gpus: bool = True) -> Plan:
    """Make `target` the serving lane: leave the lanes that conflict with it (the active one asleep when its
    recipe asks and it may; every other one stopped), bring it up (woken when it waits asleep), gate it, mark it
    active; on a failed step, stop it and bring the previous lane back."""
    inventory = Inventory(catalog, snapshot, with_gpus=with_gpus)
    refuse_other_state_folder(inventory)
    require_built(snapshot, target)
    refuse_foreign(inventory, target)
    state = snapshot.state
    asleep, lost = standbys(inventory)
    kind: Kind = "rollback" if rollback else "up"
    orphans = orphan_steps(inventory)
    notes = [f"the standby of {name} is lost: {reason}; a rollback to it is a cold start" for name, reason in lost]
    if (state.active == target.name and target.name not in asleep and inventory.running(target)
            and not any(inventory.drift(c) for c in inventory.containers(target)) and snapshot.active_healthy):
        if not orphans and not lost:
            return Plan("noop", target.name, message=f"{target.name} is already active and healthy; nothing to do")
        # The lane serves as its recipe says, but a role the recipe dropped has a container, or a standby beside
        # it can no longer be woken: only those go. Their failure is reported, never a reason to touch the lane
        # that serves.
        cleanup = (*(Phase(drop_standby_steps(inventory, name, reason), optional=True) for name, reason in lost),
                   *([Phase(orphans, optional=True)] if orphans else []))
        return Plan(kind, target.name, phases=cleanup, with_gpus=with_gpus, notes=tuple(notes))
    if snapshot.secret_key_new:
        notes.append("secret-digest.key was missing and a new key was made: the running containers' secrets cannot "
                     "be compared with lanectl's environment this time, so no container is recreated for them")
    phases = [Phase((_disarm(target),)),
              # The target's own lost standby is stopped by its start, which begins from stopped.
              *(Phase(drop_standby_steps(inventory, name, reason, stop=name != target.name))
                for name, reason in lost),
              *([Phase(orphans)] if orphans else [])]
    waking = target.name in asleep
    live = [lane for lane in inventory.live_lanes() if lane.name != target.name]
    # A recreate of the serving lane leaves the standby beside it as it is: the lane already holds its GPUs, and
    # its way back is the lane as it was, not the standby.
    recreating = state.active == target.name and not waking and inventory.running(target)
    leaving = [lane for lane in live if lanes_conflict(lane, target)
               and not (recreating and lane.name in asleep and not host_ports(lane) & host_ports(target))]
    sleeper = next((lane for lane in leaving if lane.name == state.active and lane.spec.standby is not None), None)
    refusal = None
    if sleeper is not None:
        refusal = ("the lane it rolls back to needs all of its GPU memory back" if waking
                   else standby_refusal(sleeper, target, snapshot, rollback=rollback))
    sleeps = sleeper if refusal is None else None
    if target.spec.standby is not None and not waking and (rollback or target.name in snapshot.standby.dropped):
        dropped = snapshot.standby.dropped.get(target.name)
        notes.append(f"{target.name} has no standby to wake" + (f" (dropped {dropped.at}: {dropped.reason})"
                                                                 if dropped else "") + "; starting it cold")
    for lane in live:
        if lane is sleeps or lane.name in dict(lost):
            continue  # left asleep; or a lost standby, stopped as it is dropped
        if lane.name in asleep and lane in leaving:
            why = f"ends its standby: {target.name} takes its GPUs"
        elif lane.name in asleep and sleeps is not None and lanes_conflict(lane, sleeps):
            why = f"ends its standby: one per GPU set, and {sleeps.name} takes its place"
        elif lane in leaving:
            why = f"not left asleep: {refusal}" if lane is sleeper else ""
        else:
            continue
        forget = (Step("forget-standby", lane.name, why=why),) if lane.name in asleep else ()
        phases.append(Phase((*stop_steps(inventory, lane, why), *forget)))
    if sleeps is not None:
        stop_instead = (*stop_steps(inventory, sleeps, "stopped instead of left asleep"),
                        Step("forget-standby", sleeps.name, why="its sleep failed"))
        phases.append(Phase(tuple(Step("sleep", sleeps.name, sleeps.container_name(role), role)
                                  for role in reversed(sleeps.roles)), fallback=stop_instead))
        memory_short = (*stop_steps(inventory, sleeps, f"GPU memory beside it: {target.name} needs it", every=True),
                        Step("forget-standby", sleeps.name, why=f"{target.name} needs the GPU memory it held"))
        phases.append(Phase((Step("check-memory", target.name),), fallback=memory_short))
    bring_up: tuple[Step, ...] = ()
    if waking:
        phases.append(_wake_phase(inventory, target))
    else:
        bring_up = bring_up_steps(inventory, target)
        phases.append(Phase((*bring_up, _gate(target))))
    asides = _asides(bring_up)
    _refuse_unset_secrets(snapshot, bring_up)
    phases.append(Phase((Step("activate", target.name),), optional=True))
    prune = (*_drop_asides(asides, "replaced by a container that passed its gate"),
             *_prune(inventory, target, {target.name, *(lane.name for lane in live if lane not in leaving),
                                         *([sleeps.name] if sleeps else []),
                                         *(asleep - {lane.name for lane in leaving})}))
    if prune:
        phases.append(Phase(prune, optional=True))
    phases.append(Phase((Step("arm", target.name),), optional=True))
    if state.active == target.name and asides and any(c.listed.live for c in inventory.containers(target)):
        # A recreate of the serving lane goes back to the lane as it was, whatever else it had to stop.
        previous: Lane | None = target
    else:
        # Never to a lost standby: the switch stopped it as it dropped it, and it was serving nothing.
        previous = _previous(state, [lane for lane in leaving if lane.name not in dict(lost)])
    way_back, abandon = _way_back(inventory, target, previous, slept=sleeps, rollback_on_failure=rollback_on_failure,
                                  asides=asides)
    alone = "" if previous and rollback_on_failure else (
        "--no-rollback" if previous else "there was no lane before it")
    return Plan(kind, target.name, previous.name if previous and rollback_on_failure else None, tuple(phases),
                way_back, abandon, alone=alone, notes=tuple(notes), with_gpus=with_gpus,
                budget_seconds=target.spec.health.startup_budget_minutes * 60)


def plan_rollback(catalog: Catalog, snapshot: Snapshot, to: Lane | None, *, with_gpus: bool = True) -> Plan:
    """Back to `to`, or the last known-good lane before the active one, through the same path as `up`."""
    return plan_up(catalog, snapshot, to or rollback_target(catalog, snapshot.state), rollback=True,
                   with_gpus=with_gpus)


def rollback_target(catalog: Catalog, state: LaneState) -> Lane:
    """The last known-good lane before the active one."""
    name = state.last_known_good_before(state.active)
    if name is None:
        raise BadInput("no known-good lane to roll back to (none recorded before "
                       f"{state.active or 'the current state'}); name one with --to")
    if name not in catalog.lanes:
        raise BadInput(f"the last known-good lane {name} is no longer in the recipes; name one with --to")
    return catalog.lanes[name]


def plan_down(catalog: Catalog, snapshot: Snapshot, lane_name: str | None, *, with_standbys: bool) -> Plan:
    """Stop the lane named `lane_name`, and with `with_standbys` every lane waiting asleep too (`lanectl down` of the
    box); their containers are kept for a later start. A lane no recipe that loads has is stopped and removed
    from its containers' labels (`labelled_down_steps`)."""
    inventory = Inventory(catalog, snapshot)
    refuse_other_state_folder(inventory)
    labelled = labelled_lanes(catalog, snapshot.containers, snapshot.state_dir)
    targets = [lane_name] if lane_name is not None else []
    if with_standbys:
        targets += [r.lane for r in snapshot.standby.standbys if r.lane not in targets]
    orphans = orphan_steps(inventory)
    if not targets and not orphans:
        raise BadInput("no active lane and no standby; name the lane to stop")
    phases, notes = [], []
    for name in targets:
        recorded = snapshot.standby.standby(name) is not None
        if name in catalog.lanes:
            steps = [*stop_steps(inventory, catalog.lanes[name], "down" if recorded else "")]
        elif name in labelled and labelled[name].containers:
            steps = [*labelled_down_steps(labelled[name])]
            notes.append(labelled_note(name))
        elif recorded or snapshot.state.active == name:
            steps = []  # its recipe and its containers are gone: only what the state files say of it is left
        elif name in labelled:
            raise _other_state_folder(labelled[name].elsewhere[0], snapshot.state_dir)
        else:
            catalog.lane(name)  # no such lane anywhere: refused, with the names it may have meant
            steps = []
        if recorded:
            steps.append(Step("forget-standby", name, why="down"))
        if snapshot.state.active == name:
            steps.append(Step("deactivate", name, why="down"))
        phases.append(Phase(tuple(steps)))
    if orphans:
        phases.append(Phase(orphans))
    return Plan("down", targets[0] if targets else None, phases=tuple(phases), notes=tuple(notes))


def _asleep_beside(inventory: Inventory, standby: Lane, lane: Lane) -> bool:
    """`standby` is recorded waiting asleep and shares only GPUs with `lane` (a sleeping vLLM keeps its port), each
    live container of it running (a paused one answers nothing, and is the watchdog's to drop first). Whether it
    really sleeps is asked again, of each engine, just before the start (invariant 1, `lanes/invariants.py`)."""
    if inventory.snapshot.standby.standby(standby.name) is None or host_ports(standby) & host_ports(lane):
        return False
    return all(c.listed.running for c in inventory.containers(standby) if c.listed.live)


def labelled_down_steps(lane: LabelledLane) -> tuple[Step, ...]:
    """Stop (companions first, each with the stop timeout it was created with) and remove the containers of a lane
    that no recipe which loads has: without a recipe lanectl cannot start them again, and a lane left stopped here
    would be one that no later `up` or prune accounts for. Those of another state folder are never touched."""
    why = f"no recipe that loads has {lane.name}"
    stops = [Step("stop", lane.name, c.name, role_of(c), _own_stop_timeout(c), why)
             for c in reversed(lane.containers) if c.live]
    removals = [Step("remove", lane.name, c.name, role_of(c), why=why) for c in reversed(lane.containers)]
    return (*stops, *removals)


def labelled_note(lane: str) -> str:
    return (f"{lane} is in no recipe that loads (deleted, renamed, or its recipe file does not load): its containers "
            "are stopped, each with the stop timeout it was created with, and removed, as their labels name them; "
            f"once a recipe has {lane} again, `lanectl up {lane}` creates them anew")


def plan_restart(catalog: Catalog, snapshot: Snapshot, lane: Lane, *, with_gpus: bool) -> Plan:
    """The watchdog's restart of the active lane: stop it, wait for its GPUs' memory, start it as it was (a
    restart repairs, it does not upgrade: a container is recreated only when it is gone), gate it. A lane that
    fails its gate is stopped again, so the next pass counts it. Refused while another lane that conflicts
    with it is live, unless it is a standby waiting asleep on the lane's GPUs (as a switch leaves one beside
    the lane it starts): the watchdog never starts a second lane awake on a GPU."""
    inventory = Inventory(catalog, snapshot, with_gpus=with_gpus)
    refuse_other_state_folder(inventory)
    refuse_foreign(inventory, lane)
    serving = [other.name for other in inventory.live_lanes() if other.name != lane.name
               and lanes_conflict(other, lane) and not _asleep_beside(inventory, other, lane)]
    if serving:
        raise OperationFailed(f"not restarting {lane.name}: {', '.join(serving)} runs on its GPUs or host ports; "
                              "the box must not run two lanes there (run `lanectl status`)")
    notes = [f"{c.name} is restarted as it was; its recipe changed since ({', '.join(changes)}): "
             f"`lanectl up {lane.name}` recreates it" for c in inventory.containers(lane)
             if (changes := inventory.drift(c))]
    phases = (Phase(stop_steps(inventory, lane)), Phase((Step("gpu-memory", lane.name),)),
              Phase((*bring_up_steps(inventory.with_stopped(lane), lane, recreate=False), _gate(lane))),
              Phase((Step("activate", lane.name),), optional=True))
    return Plan("restart", lane.name, lane.name, phases, way_back=(Phase(stop_steps(inventory, lane, every=True)),),
                notes=tuple(notes), with_gpus=with_gpus,
                budget_seconds=lane.spec.health.startup_budget_minutes * 60)


def plan_reconcile(catalog: Catalog, snapshot: Snapshot, *, with_gpus: bool = True) -> Plan | None:
    """Finish or undo the switch a killed run left unfinished, against what the engine shows: its target runs
    and passes its gate (finish), or it is stopped and the lane before it brought back (undo, which is also the
    finish's way back). An unfinished `down` is finished."""
    intent = snapshot.unfinished
    if intent is None:
        return None
    inventory = Inventory(catalog, snapshot, with_gpus=with_gpus)
    to_name, from_name = intent.get("to"), intent.get("from")
    previous = catalog.lanes.get(from_name) if isinstance(from_name, str) else None
    if intent.get("action") == "down":
        # A down converges as it would have gone on, planned again from what the engine shows: its lane, the
        # standbys when it was stopping them too (`lanectl down` of the box), the orphans. Finishing only its lane
        # left a standby or an orphan it was about to stop running.
        name = from_name if isinstance(from_name, str) else None
        with_standbys = any(str(key).startswith("forget-standby:") for key in intent.get("steps") or [])
        try:
            down = plan_down(catalog, snapshot, name, with_standbys=with_standbys)
        except BadInput:
            down = Plan("down", name)  # nothing it named is left
        return replace(down, kind="finish-down")
    target = catalog.lanes.get(to_name) if isinstance(to_name, str) else None
    # Containers of a role its recipe dropped since the killed run (orphans) go first, as in any switch: the
    # recipe's roles alone would leave them running, unaccounted for, whether the switch is undone or finished.
    orphans = orphan_steps(inventory)
    cleanup = (Phase(orphans, optional=True),) if orphans else ()
    # A killed restart (from and to the same lane) is undone by restarting the lane: stop it, start it, gate it.
    slept = previous if previous is not None and previous.name in standbys(inventory)[0] else None
    if target is None:
        way_back, abandon = _restore(inventory, previous, slept=slept)
        return Plan("undo", to_name if isinstance(to_name, str) else None, previous.name if previous else None,
                    (*cleanup, *way_back), abandon=abandon, alone="there was no lane before it")
    asides = _left_aside(inventory, target)
    way_back, abandon = _way_back(inventory, target, previous, slept=slept, rollback_on_failure=True, asides=asides)
    alone = "" if previous else "there was no lane before it"
    primary = inventory.container(target, ROLE_PRIMARY)
    if primary is None or not primary.listed.running or not _whole(inventory, target):
        return Plan("undo", target.name, previous.name if previous else None, (*cleanup, *way_back),
                    abandon=abandon, alone=alone)
    # The companions the killed run had not started yet start now; nothing is recreated here (a later `up` does).
    # A target still recorded asleep was being woken: the wake finishes it (a wake of an awake vLLM does nothing).
    asleep = standbys(inventory)[0]
    waking = target.name in asleep
    bring = _wake_phase(inventory, target) if waking else Phase(
        (*bring_up_steps(inventory, target, recreate=False), _gate(target)))
    phases = (*_leave_for(inventory, target, asleep, waking),
              *([Phase(orphans)] if orphans else []),
              bring,
              Phase((Step("activate", target.name),), optional=True),
              Phase((*_drop_asides(asides, "replaced by a container that passed its gate"),
                     Step("arm", target.name)), optional=True))
    return Plan("finish", target.name, previous.name if previous else None, phases, way_back, abandon, alone=alone,
                with_gpus=with_gpus, budget_seconds=target.spec.health.startup_budget_minutes * 60)


def _leave_for(inventory: Inventory, target: Lane, asleep: set[str], waking: bool) -> tuple[Phase, ...]:
    """What finishing a killed switch to `target` stops first, from what is live now rather than from the steps the
    killed run journaled (invariant 5, `lanes/invariants.py`): every other lane live on its GPUs or ports, except a
    standby left asleep beside a cold start, as the switch would have left it."""
    phases = []
    for lane in inventory.live_lanes():
        if lane.name == target.name or not lanes_conflict(lane, target):
            continue
        if lane.name in asleep and not waking and not host_ports(lane) & host_ports(target):
            continue
        why = f"finishing the switch to {target.name}, which takes its GPUs"
        forget = (Step("forget-standby", lane.name, why=why),) if lane.name in asleep else ()
        phases.append(Phase((*stop_steps(inventory, lane, why), *forget)))
    return tuple(phases)


def _whole(inventory: Inventory, lane: Lane) -> bool:
    """Every container of the lane is there (a killed recreate may have set one aside and not made its new one)."""
    return all(inventory.container(lane, role) is not None for role in lane.roles)


# -- the way back ---------------------------------------------------------------------------------------------

def _previous(state: LaneState, leaving: list[Lane]) -> Lane | None:
    """The lane a failed switch goes back to: the active one if the switch stops it, else the first it stops."""
    for lane in leaving:
        if lane.name == state.active:
            return lane
    return leaving[0] if leaving else None


def _way_back(inventory: Inventory, target: Lane, previous: Lane | None, *, slept: Lane | None,
              rollback_on_failure: bool, asides: Sequence[Step] = ()) -> tuple[tuple[Phase, ...], tuple[Step, ...]]:
    """Stop the target (and put back any container the switch set aside), then bring the previous lane back
    (woken if the switch left it asleep), gate it and mark it active; without a previous lane (or with
    --no-rollback) the target stays stopped for debugging."""
    replaced = _companions_replaced(inventory, target, previous, asides)
    stop_target = Phase((*[step for step in stop_steps(inventory, target, every=True)
                           if replaced is None or step.role in replaced], *_put_back(list(asides))))
    if previous is None or not rollback_on_failure:
        touched = previous or target
        return (stop_target, Phase((Step("deactivate", touched.name, why="nothing serves"),
                                    Step("arm", touched.name)))), ()
    phases, abandon = _restore(inventory.with_put_back(target), previous, slept=slept, roles=replaced)
    return (stop_target, *phases), abandon


def _companions_replaced(inventory: Inventory, target: Lane, previous: Lane | None,
                         asides: Sequence[Step]) -> frozenset[str] | None:
    """The companions a recreate of the serving lane replaced, when it replaced only companions of a primary that
    ran: their way back leaves that primary running (on a real engine a restart is a cold start, minutes without
    service, for a change the primary never saw). None: the way back stops and restarts the whole lane."""
    if previous is None or previous.name != target.name or not asides:
        return None
    replaced = frozenset(step.role for step in asides)
    primary = inventory.container(target, ROLE_PRIMARY)
    if ROLE_PRIMARY in replaced or primary is None or not primary.listed.running:
        return None
    return replaced


def _restore(inventory: Inventory, lane: Lane | None, *, slept: Lane | None = None,
             roles: frozenset[str] | None = None) -> tuple[tuple[Phase, ...], tuple[Step, ...]]:
    """Bring `lane` back as it was: woken if it was left asleep, else its kept containers started (created
    when gone; only `roles` when the way back stopped only those), gated and marked active."""
    if lane is None:
        return (Phase((Step("arm", "watchdog"),)),), ()
    if slept is not None and slept.name == lane.name:
        bring = _wake_phase(inventory, lane)
    else:
        bring = Phase((*stop_asleep_steps(inventory, lane),
                       *bring_up_steps(inventory.with_stopped(lane, roles), lane, recreate=False), _gate(lane)))
    # A lane that did not come back is stopped, not left half-started: nothing awake goes unwatched (the watchdog
    # guards the active lane only) or sits beside whatever kept it from coming back.
    abandon = (*stop_steps(inventory.with_stopped(lane), lane, "it did not come back", every=True),
               Step("deactivate", lane.name, why=f"{lane.name} did not come back"), Step("arm", lane.name))
    # Past its gate the lane serves: a state file that cannot be written is reported, never a reason to stop it.
    return (bring, Phase((Step("activate", lane.name), Step("arm", lane.name)), optional=True)), abandon


def _prune(inventory: Inventory, target: Lane, running_after: set[str]) -> tuple[Step, ...]:
    """Keep the stopped containers of the last few known-good lanes (a rollback is then a start); remove older
    ones of the target's recipe. Only containers lanectl created; never one that runs after the switch."""
    keep = target.recipe.keep_stopped_lanes
    known = [name for name in inventory.snapshot.state.known_good if name != target.name]
    recent = set(list(reversed(known))[:keep])
    steps = [Step("remove", c.lane.name, c.name, c.role, why="set aside by a switch that did not finish")
             for c in inventory.aside.values() if c.lane.recipe.id == target.recipe.id]
    for container in inventory.own.values():
        lane = container.lane
        if lane.recipe.id != target.recipe.id or lane.name in recent or lane.name in running_after:
            continue
        steps.append(Step("remove", lane.name, container.name, container.role,
                          why=f"older than the last {keep} lanes kept for rollback"))
    return tuple(steps)

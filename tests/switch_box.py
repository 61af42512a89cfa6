"""A box in memory for the switch's pure planner and its executor: snapshots built by hand, and a small engine
with the Docker operations a plan's steps make (`lanes/execute.Engine`), behind the same interface as
ContainerEngine. No Docker: what only Docker can show stays in the Docker tests."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from lanectl.dockerapi.containers import LIVE_STATES, ContainerSpec, ContainerState, ListedContainer
from lanectl.errors import OperationFailed
from lanectl.health.gate import GateResult
from lanectl.image.render import ImagePlan, plan_image
from lanectl.lanes.inventory import Inventory
from lanectl.lanes.snapshot import Snapshot
from lanectl.lanes.standby import StandbyError
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, Lane, load_catalog
from lanectl.state.lanes import LaneState
from lanectl.state.standby import Fingerprint, StandbyRecord, StandbyState
from tests.conftest import REPO

ROOMY_GIB = 64.0  # host memory: the demo lanes' weights (2 GiB) fit


def repo_catalog() -> Catalog:
    return load_catalog(Project.locate(REPO / "recipes"))


def with_lane(catalog: Catalog, name: str, **spec_changes: Any) -> Catalog:
    """The catalog with one lane's spec changed (`engine=…`, `companions=…`): a recipe edited since."""
    lane = catalog.lanes[name]
    changed = replace(lane, spec=replace(lane.spec, **spec_changes))
    return replace(catalog, lanes={**catalog.lanes, name: changed})


def with_engine(catalog: Catalog, name: str, **engine_changes: Any) -> Catalog:
    lane = catalog.lanes[name]
    return with_lane(catalog, name, engine=replace(lane.spec.engine, **engine_changes))


def fingerprint(text: str = "2, 3, 5, 7, 11") -> Fingerprint:
    return Fingerprint(prompt="List the first five prime numbers:", max_tokens=8, text=text,
                       recorded="2026-12-01T00:00:00.000Z")


@dataclass
class Box:
    """What a snapshot holds, built up by a test: lanes built, containers on the engine, the state files."""

    catalog: Catalog
    containers: dict[str, ListedContainer] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    state: LaneState = field(default_factory=LaneState)
    standby: StandbyState = field(default_factory=StandbyState)
    unfinished: dict[str, Any] | None = None
    host_memory_gib: float | None = ROOMY_GIB
    active_healthy: bool | None = True
    secret_digests: dict[str, str] = field(default_factory=dict)
    with_gpus: bool = True
    sleeping: set[str] = field(default_factory=set)  # containers whose engine is asleep (vLLM sleep mode)
    published: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # container -> the ports it publishes

    def build(self, *lanes: str, catalog: Catalog | None = None, build_id: str = "") -> Box:
        for name in lanes:
            self.images[image_plan((catalog or self.catalog).lanes[name]).tag] = f"sha256:{name}-build{build_id}"
        return self

    def run(self, lane: str, status: str = "running", *, roles: tuple[str, ...] | None = None,
            catalog: Catalog | None = None) -> Box:
        """The lane's containers, as lanectl created them from the recipe (of `catalog`, when the recipe has
        changed since) and its build, in `status`."""
        source = catalog or self.catalog
        target = source.lanes[lane]
        if image_plan(target).tag not in self.images:
            self.build(lane, catalog=source)
        made = Inventory(source, self.snapshot(catalog=source), with_gpus=self.with_gpus)
        for role in roles or tuple(target.roles):
            desired = made.desired(target, role)
            assert desired is not None, f"{lane} is built"
            self.containers[desired.spec.name] = listed(desired.spec, str(desired.fields["image_id"]), status)
            self.published[desired.spec.name] = list(desired.spec.ports)
        return self

    def put(self, container: ListedContainer) -> Box:
        self.containers[container.name] = container
        return self

    def active(self, lane: str | None, *known_good: str) -> Box:
        self.state = dataclasses.replace(self.state, active=lane, known_good=tuple(known_good))
        return self

    def asleep(self, lane: str) -> Box:
        """The lane waits asleep as a standby: recorded, and each of its running containers' engines asleep."""
        self.standby = self.standby.with_standby(StandbyRecord(lane=lane, since="2026-12-01T00:00:00.000Z",
                                                               fingerprint=fingerprint()))
        named = {self.catalog.lanes[lane].container_name(role) for role in self.catalog.lanes[lane].roles}
        self.sleeping |= {name for name in named if name in self.containers and self.containers[name].running}
        return self.fingerprinted(lane)

    def fingerprinted(self, *lanes: str) -> Box:
        for lane in lanes:
            self.standby = self.standby.with_fingerprint(lane, fingerprint())
        return self

    def snapshot(self, catalog: Catalog | None = None) -> Snapshot:
        source = catalog or self.catalog
        return Snapshot(containers=tuple(self.containers.values()), state=self.state, standby=self.standby,
                        unfinished=self.unfinished, images=dict(self.images),
                        image_plans={name: image_plan(lane) for name, lane in source.lanes.items()},
                        secret_digests=self.secret_digests, host_memory_gib=self.host_memory_gib,
                        active_healthy=self.active_healthy)


_ids = itertools.count(1)
_plans: dict[int, tuple[Lane, ImagePlan]] = {}


def image_plan(lane: Lane) -> ImagePlan:
    """plan_image, once per lane object (rendering every lane for every snapshot would dominate the tests)."""
    if id(lane) not in _plans:
        _plans[id(lane)] = (lane, plan_image(lane))
    return _plans[id(lane)][1]


def listed(spec: ContainerSpec, image_id: str, status: str = "running", **changes: Any) -> ListedContainer:
    """A container as the engine's listing shows one created from `spec`."""
    # A paused container keeps its ports, as a running one: it holds them until it is stopped.
    ports = tuple(sorted({(p["protocol"], int(p["host"])) for p in spec.ports})) if status in LIVE_STATES else ()
    words = {"running": "Up 1 minute", "paused": "Up 1 minute (Paused)"}.get(status, "Exited (0) 1 minute ago")
    container = ListedContainer(name=spec.name, id=f"id{next(_ids)}", image=spec.image, image_id=image_id,
                                state=status, status=words, labels=dict(spec.labels), host_ports=ports)
    return replace(container, **changes)


def keys(plan_or_steps: Any) -> list[str]:
    steps = plan_or_steps.steps if hasattr(plan_or_steps, "steps") else plan_or_steps
    return [step.key for step in steps]


def way_back(plan: Any) -> list[str]:
    return [step.key for phase in plan.way_back for step in phase.steps]


# -- an engine in memory --------------------------------------------------------------------------------------

@dataclass
class Held:
    spec: ContainerSpec
    state: str = "created"
    starts: int = 0
    asleep: bool = False  # its engine sleeps (vLLM sleep mode); a stop ends that, a docker start of it does not
    id: str = field(default_factory=lambda: f"id{next(_ids)}")  # as Docker's: the same in every listing


class MemoryEngine:
    """The Docker operations of a plan's steps on a dict: enough to run plans in tests, counting every call."""

    def __init__(self, images: Mapping[str, str] | None = None):
        self.held: dict[str, Held] = {}
        self.images = dict(images or {})
        self.calls: list[str] = []
        self.fail: dict[str, Exception] = {}  # "start:NAME" -> what that call raises
        self.on_call: dict[str, Any] = {}  # "stop:NAME" -> a function run before the call returns
        self.stops: list[tuple[str, int]] = []  # (name, the timeout its stop allowed)

    def _call(self, what: str) -> None:
        self.calls.append(what)
        hook = self.on_call.get(what)
        if hook is not None:
            hook()
        if what in self.fail:
            raise self.fail[what]

    def create(self, spec: ContainerSpec, *, with_gpus: bool, environ: Mapping[str, str]) -> str:
        self._call(f"create:{spec.name}")
        assert spec.name not in self.held, f"{spec.name} exists (409)"
        self.held[spec.name] = Held(spec)
        return spec.name

    def start(self, name: str) -> bool:
        self._call(f"start:{name}")
        if self.held[name].state == "paused":
            raise OperationFailed(f"{name}: start failed: cannot start a paused container, try unpause instead")
        if self.held[name].state == "running":
            return False
        self.held[name].state = "running"
        self.held[name].asleep = False  # a container started from stopped runs a new engine, awake
        self.held[name].starts += 1
        return True

    def stop(self, name: str, timeout: int) -> None:
        self._call(f"stop:{name}")
        self.stops.append((name, timeout))
        if name in self.held:
            self.held[name].state = "exited"
            self.held[name].asleep = False

    def remove(self, name: str) -> None:
        self._call(f"remove:{name}")
        self.held.pop(name, None)

    def rename(self, name: str, new_name: str) -> None:
        self._call(f"rename:{name}")
        assert new_name not in self.held, f"{new_name} exists (409)"
        self.held[new_name] = self.held.pop(name)

    def container(self, name: str) -> ContainerState | None:
        self._call(f"inspect:{name}")
        held = self.held.get(name)
        if held is None:
            return None
        return ContainerState(name=name, id=name, lane="", role=held.spec.role, recipe="", inputs="",
                              image=held.spec.image, status=held.state,
                              exit_code=0 if held.state == "exited" else None, started_at=None, finished_at=None,
                              restart_count=0, device_requests=(), stop_timeout=held.spec.stop_timeout_seconds)

    def logs(self, name: str, *, since: float | None = None, tail: int | None = None) -> str:
        self._call(f"logs:{name}")
        # What vLLM's worker logs once asleep, which a sleep step reads back.
        asleep = name in self.held and self.held[name].asleep
        return "Sleep mode freed 70.00 GiB memory, 1.00 GiB memory is still in use.\n" if asleep else ""

    def list_containers(self) -> list[ListedContainer]:
        self._call("list")
        return [listed(h.spec, self.images.get(h.spec.image, ""), h.state, name=name, id=h.id)
                for name, h in self.held.items()]

    def lane_images(self) -> dict[str, str]:
        self._call("images")
        return dict(self.images)

    def image_id(self, ref: str) -> str | None:
        self._call(f"image:{ref}")
        return self.images.get(ref)

    def image_env(self, ref: str) -> dict[str, str] | None:
        self._call(f"image-env:{ref}")
        return None  # the images here are IDs alone

    def image_labels(self, ref: str) -> dict[str, str] | None:
        """An image's labels, by tag or ID: none kept here beyond the image being there."""
        self._call(f"image-labels:{ref}")
        return {} if ref in self.images or ref in self.images.values() else None

    def running(self) -> set[str]:
        return {name for name, held in self.held.items() if held.state == "running"}

    def asleep(self, lane: Lane) -> list[str]:
        """The lane's containers whose engine is asleep."""
        names = [lane.container_name(role) for role in lane.roles]
        return [name for name in names if name in self.held and self.held[name].asleep]


class FakeEngines:
    """The engines' side of the steps (gate, sleep, wake, greedy output), answering as a test tells it."""

    def __init__(self, engine: MemoryEngine):
        self.engine = engine
        self.failing_gates: set[str] = set()
        self.failing_sleeps: set[str] = set()
        self.failing_wakes: set[str] = set()
        self.greedy_text = fingerprint().text
        self.gates: list[str] = []
        self.gated_asleep: list[str] = []  # containers asleep when their lane was held to its gate
        self.on_gate: Any = None

    def gate(self, lane: Lane, budget_seconds: float, since: float | None) -> GateResult:
        self.gates.append(lane.name)
        if self.on_gate is not None:
            self.on_gate(lane)
        # A real gate holds each companion to its readiness beside the primary: one that does not run fails it.
        running = {lane.container_name(role) for role in lane.roles} <= self.engine.running()
        asleep = self.engine.asleep(lane)
        self.gated_asleep += asleep
        if lane.name in self.failing_gates or not running:
            check = "generation" if running else "container-exited"
            return GateResult(False, check, f"{lane.name} is broken", 0.1, ("a log line",), ())
        elsewhere = self._not_published_there(lane)
        if elsewhere:
            # A real gate probes the lane's ports: a container that publishes others does not answer there.
            return GateResult(False, "health", f"{elsewhere}: connection refused", 0.1, (), ())
        if lane.container_name() in asleep:
            # A sleeping vLLM answers /health 200 and queues the generation probe unanswered.
            return GateResult(False, "generation", "generation probe timed out (health 200: engine stuck?)", 0.1,
                              ("a log line",), ())
        return GateResult(True, None, "ready", 0.1, (), ())

    def _not_published_there(self, lane: Lane) -> str:
        """The first running container of the lane that does not publish the host ports the gate is given."""
        for role, engine in lane.spec.engines():
            held = self.engine.held.get(lane.container_name(role))
            if held is None or held.state != "running" or not held.spec.ports:
                continue
            given = {int(port.published) for port in engine.ports}
            if {int(port["host"]) for port in held.spec.ports} != given:
                return f"{lane.container_name(role)} does not publish {sorted(given)}"
        return ""

    def sleep(self, lane: Lane, role: str) -> str:
        if lane.name in self.failing_sleeps:
            raise StandbyError("POST /sleep?level=1&mode=wait answered 500: Call to sleep method failed")
        held = self.engine.held.get(lane.container_name(role))
        if held is None or held.state != "running":
            raise StandbyError(f"{lane.container_name(role)}: POST /sleep: connection refused")
        held.asleep = True
        return "no request in flight"

    def wake(self, lane: Lane) -> None:
        if lane.name in self.failing_wakes:
            raise StandbyError("POST /wake_up answered 500: CUDA error")
        names = [lane.container_name(role) for role in lane.roles]
        unanswered = [name for name in names if name not in self.engine.running()]
        if unanswered:
            raise StandbyError(f"{unanswered[0]}: POST /wake_up: connection refused")
        for name in names:
            self.engine.held[name].asleep = False

    def greedy(self, lane: Lane, prompt: str, max_tokens: int) -> str:
        return self.greedy_text

    def in_flight(self, lane: Lane, role: str) -> int | None:
        return None

    def is_sleeping(self, lane: Lane, role: str) -> bool | None:
        held = self.engine.held.get(lane.container_name(role))
        return None if held is None or held.state != "running" else held.asleep

    def is_sleeping_in(self, container: ListedContainer) -> bool | None:
        """As asked on the host port the container publishes: only it can answer there while it runs."""
        held = self.engine.held.get(container.name)
        published = any(protocol == "tcp" for protocol, _ in container.host_ports)
        return None if held is None or held.state != "running" or not published else held.asleep


class QuietReporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, text: str, *, ok: bool = True) -> None:
        self.lines.append(("✓ " if ok else "✗ ") + text)

    def gate(self, progress: object) -> None: ...

    def note(self, text: str) -> None:
        self.lines.append("! " + text)


def engine_from(box: Box) -> MemoryEngine:
    """A memory engine holding the box's containers and builds, so a plan made from the box can run on it."""
    from lanectl.dockerapi.labels import LABEL_PREFIX

    engine = MemoryEngine(box.images)
    for container in box.containers.values():
        spec = ContainerSpec(name=container.name, role=container.labels.get(LABEL_PREFIX + "role", ""),
                             image=container.image, command=None, entrypoint=None, env={}, secret_env=[],
                             ports=box.published.get(container.name, []),
                             volumes=[], gpus=None, shm_size=None, ipc=None, init=True, user=None,
                             stop_timeout_seconds=10, labels=dict(container.labels))
        engine.held[container.name] = Held(spec, container.state, asleep=container.name in box.sleeping)
        engine.images.setdefault(container.image, container.image_id)
    return engine


class Killed(BaseException):
    """What kill -9 does to a switch: nothing after the step that was journaled runs, and nothing is cleaned."""


class Interrupting(QuietReporter):
    """Acts after the Nth step is shown, which is after it was journaled: as the test seams do for real."""

    def __init__(self, after: int, act: Any) -> None:
        super().__init__()
        self.after, self.act, self.shown = after, act, 0

    def step(self, text: str, *, ok: bool = True) -> None:
        super().step(text, ok=ok)
        self.shown += 1
        if self.shown == self.after:
            self.act()

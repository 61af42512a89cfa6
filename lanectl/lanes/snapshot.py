"""What a command knows before it plans: one snapshot of the engine, the state files and the lanes' builds.

`take_snapshot` reads everything a switch is planned from, once: one listing of the engine's containers (no
inspect), one listing of the lane images (and the env of both images of a primary whose build changed),
`state.json`, `standby.json`, the journal's unfinished switch, each lane's image plan (rendered once; a lane whose
image no longer renders is named with why, and has none), the keyed digests of the secrets in lanectl's
environment, the host's free memory, and whether the active lane answers `/health` with every engine of it awake.
The planner (`lanes/plan.py`) is a pure function of it; nothing re-reads a file or asks the engine again while
planning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import Any, Protocol

from lanectl.dockerapi.containers import ListedContainer
from lanectl.image.render import ImagePlan, plan_images_apart
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.records import frozen
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneState, LaneStateStore
from lanectl.state.paths import StateFiles
from lanectl.state.secret_digests import secret_digests
from lanectl.state.standby import StandbyState, StandbyStore


class EngineListing(Protocol):
    def list_containers(self) -> list[ListedContainer]: ...

    def lane_images(self) -> dict[str, str]: ...

    def image_id(self, ref: str) -> str | None: ...

    def image_env(self, ref: str) -> dict[str, str] | None: ...


@frozen
class Snapshot:
    """What the box holds at one moment: containers, lane state, standbys and an unfinished switch."""

    containers: tuple[ListedContainer, ...]
    state: LaneState
    standby: StandbyState
    unfinished: Mapping[str, Any] | None  # the journal's intent without an outcome, with its done_steps
    images: Mapping[str, str]  # image reference -> ID, for the lane builds (and companion images) present
    image_plans: Mapping[str, ImagePlan]  # lane -> its build, for the lanes the command may touch
    # lane -> why its image does not render (a template broken since validation): it has no image plan, so no
    # container of it can be created, but what runs of it can be seen and stopped.
    unrendered: Mapping[str, str] = field(default_factory=dict)
    secret_digests: Mapping[str, str] = field(default_factory=dict)  # secret name -> keyed digest (set ones)
    host_memory_gib: float | None = None  # MemAvailable: where a sleeping lane's weights go
    active_healthy: bool | None = None  # the active lane's /health with every engine awake, when its primary runs
    asleep: frozenset[str] = frozenset()  # the active lane's containers whose engine says it sleeps (/is_sleeping)
    state_dir: str = ""  # the real path of the state folder this snapshot's state files are in
    # secret-digest.key was missing, and this snapshot made a new one: no container was stamped with it, so the
    # secrets' digests cannot tell a changed secret from a lost key (drift does not judge them; a dry run, which
    # makes no key, plans the same).
    secret_key_new: bool = False
    secrets_unset: frozenset[str] = frozenset()  # secrets the lanes in scope name that lanectl's environment lacks
    # image ID -> the env it bakes in, for a primary whose image is not its lane's build and for that build: a
    # primary's env is in its image, so this is how its drift names the variables that changed.
    image_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def built(self, lane: str) -> str | None:
        """The image ID of the lane's current build, None when it is not built."""
        plan = self.image_plans.get(lane)
        return None if plan is None else self.images.get(plan.tag)

    def listed(self, name: str) -> ListedContainer | None:
        return next((c for c in self.containers if c.name == name), None)


def lanes_in_scope(catalog: Catalog, state: LaneState, standby: StandbyState, containers: Iterable[ListedContainer],
                   *, also: Iterable[str] = ()) -> list[Lane]:
    """The lanes a switch may touch: those named, the active one, the known-good ones (a way back), the
    standbys, and every lane with a container on the engine."""
    names = {*also, *(state.known_good), *(r.lane for r in standby.standbys)}
    if state.active:
        names.add(state.active)
    recipes = {lane.recipe.id for lane in catalog.lanes.values()}
    names |= {c.labels.get("io.lanectl.lane", "") for c in containers if c.labels.get("io.lanectl.recipe") in recipes}
    return [catalog.lanes[name] for name in sorted(names) if name in catalog.lanes]


def take_snapshot(catalog: Catalog, engine: EngineListing, files: StateFiles, *, also: Iterable[str] = (),
                  environ: Mapping[str, str], create_secret_key: bool,
                  host_memory: Callable[[], float | None],
                  health: Callable[[Lane], bool] | None = None,
                  asleep: Callable[[Lane, str], bool | None] | None = None) -> Snapshot:
    state = LaneStateStore(files.lanes).load()
    standby = StandbyStore(files.standby).load()
    unfinished = Journal(files.journal).unfinished_intent()
    containers = tuple(engine.list_containers())
    lanes = lanes_in_scope(catalog, state, standby, containers, also=[*also, *_intent_lanes(unfinished)])
    plans, unrendered = plan_images_apart(lanes)
    images = dict(engine.lane_images())
    for lane in lanes:
        for companion in lane.spec.companions.values():
            if companion.image and companion.image not in images:
                found = engine.image_id(companion.image)
                if found is not None:
                    images[companion.image] = found
    rebuilt = _rebuilt_primaries(lanes, plans, images, containers)
    image_env = {image: env for image in rebuilt if (env := engine.image_env(image)) is not None}
    secrets = {name for lane in lanes for _, role in lane.spec.engines() for name in role.secret_env}
    key_new = create_secret_key and any(name in environ for name in secrets) and not os.path.lexists(
        files.secret_key)
    active_healthy = None
    sleeping: frozenset[str] = frozenset()
    if health is not None and state.active in catalog.lanes:
        lane = catalog.lanes[state.active]
        running = {c.name for c in containers if c.running}
        if lane.container_name() in running:
            # A sleeping vLLM answers /health 200 (invariant 3, lanes/invariants.py): healthy is every engine awake.
            sleeping = frozenset(lane.container_name(role) for role in lane.roles
                                 if lane.container_name(role) in running and asleep is not None
                                 and asleep(lane, role) is True)
            active_healthy = health(lane) and not sleeping
    return Snapshot(containers=containers, state=state, standby=standby, unfinished=unfinished, images=images,
                    image_plans=plans, unrendered=unrendered,
                    secret_digests=secret_digests(files.secret_key, secrets, environ, create=create_secret_key),
                    host_memory_gib=host_memory(), active_healthy=active_healthy, asleep=sleeping,
                    state_dir=os.path.realpath(files.root), secret_key_new=key_new,
                    secrets_unset=frozenset(name for name in secrets if name not in environ), image_env=image_env)


def _rebuilt_primaries(lanes: Iterable[Lane], plans: Mapping[str, ImagePlan], images: Mapping[str, str],
                       containers: Iterable[ListedContainer]) -> set[str]:
    """The images of the lanes' primaries that are not their lane's build now, and those builds."""
    running_image = {c.name: c.image_id for c in containers}
    found: set[str] = set()
    for lane in lanes:
        built = images.get(plans[lane.name].tag) if lane.name in plans else None
        current = running_image.get(lane.container_name())
        if built and current and current != built:
            found |= {built, current}
    return found


def _intent_lanes(intent: Mapping[str, Any] | None) -> list[str]:
    if intent is None:
        return []
    return [name for name in (intent.get("from"), intent.get("to")) if isinstance(name, str)]

"""Which containers on the engine are lanes, and how each differs from its lane's recipe. Pure, from a snapshot.

A container is a lane container when lanectl created it for that lane's role: its creation label holds its own
name, and its lane, recipe and role labels are those of the lane whose naming gives that name. A container
merely made from a lane image carries the image's lane labels but no creation label; one renamed since carries
a creation label with another name. Those, and any container that holds a lane's name or publishes its host
port, are *foreign*: reported, never adopted, stopped or pruned, and a switch that would need what they hold is
refused before it changes anything.

Containers lanectl created before it stamped them (a role label, the right name, no creation label) are lane
containers whose spec is unknown: a switch recreates them.

Containers lanectl created for a lane that no recipe which loads has (its recipe file deleted or broken, the lane
renamed) are *labelled lanes*: what their labels say is all there is to go on, and it is enough to show them
(`status`) and to stop and remove them (`down`), each with the stop timeout it was created with.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import replace
from functools import cached_property
from typing import Any

from lanectl.dockerapi.containers import ContainerSpec, ListedContainer
from lanectl.dockerapi.labels import CREATED_AS_LABEL, LABEL_PREFIX, SPEC_FIELDS_LABEL, SPEC_LABEL, STATE_DIR_LABEL
from lanectl.image.containers import (
    env_names_changed,
    plan_containers,
    spec_changes,
    spec_digest,
    spec_fields,
    stamped,
)
from lanectl.lanes.snapshot import Snapshot
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.recipe.model import PortMapping
from lanectl.records import frozen

# A container being replaced is renamed `<name>.was-<id>` until its replacement passes its gate (lanes/plan.py).
ASIDE_MARK = ".was-"
LANE_LABEL = LABEL_PREFIX + "lane"
RECIPE_LABEL = LABEL_PREFIX + "recipe"
ROLE_LABEL = LABEL_PREFIX + "role"


@frozen
class LaneContainer:
    """A container lanectl created for one role of a lane."""

    listed: ListedContainer
    lane: Lane
    role: str
    fields: dict[str, Any] | None  # the spec it was created from; None: before lanectl recorded it

    @property
    def name(self) -> str:
        return self.listed.name


@frozen
class ForeignContainer:
    """A container that is not a lane container but holds what a lane needs, or claims to be one."""

    listed: ListedContainer
    what: str  # what it is: "renamed", "not created by lanectl", "holds the name", "holds a host port"
    lanes: tuple[str, ...]  # the lanes whose name or port it holds, or whose image it was made from

    def describe(self) -> str:
        return f"{self.listed.name} ({self.what})"

    def clearing_command(self) -> str:
        return f"docker rm -f {self.listed.name}" if self.what != "holds a host port" else \
            f"docker stop {self.listed.name}"


@frozen
class Desired:
    """A role's container as lanectl would create it now: the stamped spec and the fields it covers."""

    spec: ContainerSpec
    fields: dict[str, Any]

    @property
    def digest(self) -> str:
        return spec_digest(self.fields)


class Inventory:
    """The snapshot's containers sorted into lane containers and foreign ones, and each lane's desired specs."""

    def __init__(self, catalog: Catalog, snapshot: Snapshot, *, with_gpus: bool = True):
        self.catalog = catalog
        self.snapshot = snapshot
        self.with_gpus = with_gpus
        self.by_name: dict[str, tuple[Lane, str]] = {
            lane.container_name(role): (lane, role) for lane in catalog.lanes.values() for role in lane.roles}
        self.own: dict[str, LaneContainer] = {}
        self.aside: dict[str, LaneContainer] = {}  # set aside by a switch that has not finished, by their names
        self.foreign: list[ForeignContainer] = []
        # Made by lanectl for a role its lane's recipe no longer has (a companion removed since), by their names.
        self.orphans: dict[str, LaneContainer] = {}
        for listed in snapshot.containers:
            self._sort(listed)

    def _sort(self, listed: ListedContainer) -> None:
        labels = listed.labels
        owner = self.by_name.get(listed.name)
        created_as = labels.get(CREATED_AS_LABEL)
        set_aside = created_as is not None and listed.name.startswith(created_as + ASIDE_MARK)
        if set_aside and not listed.live and created_as in self.by_name and self._made_for(
                listed, *self.by_name[created_as]):
            lane, role = self.by_name[created_as]
            self.aside[listed.name] = LaneContainer(listed, lane, role, _fields(labels))
            return
        if owner is not None and self._made_for(listed, *owner):
            lane, role = owner
            if created_as == listed.name or (created_as is None and ROLE_LABEL in labels):
                self.own[listed.name] = LaneContainer(listed, lane, role, _fields(labels))
                return
        claimed = labels.get(LANE_LABEL, "")
        claims = claimed in self.catalog.lanes and labels.get(RECIPE_LABEL) == self.catalog.lanes[claimed].recipe.id
        if claims and owner is None and created_as is not None and (
                created_as == listed.name or listed.name.startswith(created_as + ASIDE_MARK)):
            lane = self.catalog.lanes[claimed]
            role = labels.get(ROLE_LABEL, "")
            if role and role not in lane.roles:
                self.orphans[listed.name] = LaneContainer(listed, lane, role, _fields(labels))
                return
        lanes = self._held(listed)
        if created_as is not None and created_as != listed.name and (claims or lanes):
            self.foreign.append(ForeignContainer(listed, f"renamed: lanectl created it as {created_as}",
                                                 tuple(dict.fromkeys([*([claimed] if claims else []), *lanes]))))
        elif claims and created_as is None:
            self.foreign.append(ForeignContainer(listed, f"made from {claimed}'s image but not created by lanectl",
                                                 tuple(dict.fromkeys([claimed, *lanes]))))
        elif owner is not None:
            self.foreign.append(ForeignContainer(listed, f"holds the name of {owner[0].name}'s {owner[1]} container",
                                                 tuple(dict.fromkeys([owner[0].name, *lanes]))))
        elif lanes:
            self.foreign.append(ForeignContainer(listed, "holds a host port", tuple(lanes)))

    def _made_for(self, listed: ListedContainer, lane: Lane, role: str) -> bool:
        labels = listed.labels
        return (labels.get(LANE_LABEL), labels.get(RECIPE_LABEL), labels.get(ROLE_LABEL, role)) == (
            lane.name, lane.recipe.id, role)

    def _held(self, listed: ListedContainer) -> list[str]:
        """The lanes one of whose host ports this container publishes while it runs."""
        if not listed.live or not listed.host_ports:
            return []
        held = set(listed.host_ports)
        return [lane.name for lane in self.catalog.lanes.values() if held & host_ports(lane)]

    # -- lanes -------------------------------------------------------------------------------------------

    def container(self, lane: Lane, role: str) -> LaneContainer | None:
        return self.own.get(lane.container_name(role))

    def containers(self, lane: Lane) -> list[LaneContainer]:
        """The lane's containers in role order (primary first)."""
        return [c for c in (self.container(lane, role) for role in lane.roles) if c is not None]

    def live_lanes(self) -> list[Lane]:
        """Lanes with a lane container that holds its GPUs and ports (running, restarting or paused)."""
        names = dict.fromkeys(c.lane.name for c in self.own.values() if c.listed.live)
        return [self.catalog.lanes[name] for name in names]

    def running(self, lane: Lane) -> bool:
        """Every container of the lane runs."""
        return all((c := self.container(lane, role)) is not None and c.listed.running for role in lane.roles)

    def blocking(self, lane: Lane) -> list[ForeignContainer]:
        """Foreign containers holding one of the lane's container names, or (running) one of its host ports."""
        names = {lane.container_name(role) for role in lane.roles}
        ports = host_ports(lane)
        return [f for f in self.foreign
                if f.listed.name in names or (f.listed.live and set(f.listed.host_ports) & ports)]

    def with_put_back(self, lane: Lane) -> Inventory:
        """The inventory as it is once what a switch set aside of `lane` has its names back (stopped)."""
        from copy import copy
        from dataclasses import replace

        back = copy(self)
        back.own = dict(self.own)
        back.aside = dict(self.aside)
        for name, container in self.aside.items():
            if container.lane.name == lane.name:
                original = lane.container_name(container.role)
                back.own[original] = replace(container, listed=replace(container.listed, name=original))
                del back.aside[name]
        return back

    def with_stopped(self, lane: Lane, roles: Collection[str] | None = None) -> Inventory:
        """The inventory as it is once `lane` (or only its `roles`) was stopped: what bringing it back must
        start."""
        from copy import copy
        from dataclasses import replace

        stopped = copy(self)
        stopped.own = {name: replace(c, listed=replace(c.listed, state="exited"))
                       if c.lane.name == lane.name and (roles is None or c.role in roles) else c
                       for name, c in self.own.items()}
        return stopped

    # -- specs -------------------------------------------------------------------------------------------

    @cached_property
    def _desired(self) -> dict[str, dict[str, Desired]]:
        found: dict[str, dict[str, Desired]] = {}
        for name, plan in self.snapshot.image_plans.items():
            lane = self.catalog.lanes.get(name)
            if lane is None or self.snapshot.images.get(plan.tag) is None:
                continue
            roles: dict[str, Desired] = {}
            for spec in plan_containers(lane, plan, with_gpus=self.with_gpus):
                image_id = self.snapshot.images.get(spec.image)
                if image_id is None:
                    break  # a companion image that is not here: the lane cannot be created as it stands
                fields = spec_fields(spec, image_id, self.snapshot.secret_digests)
                roles[spec.role] = Desired(stamped(spec, fields), fields)
            else:
                found[name] = roles
        return found

    def desired(self, lane: Lane, role: str) -> Desired | None:
        """The role's container as lanectl would create it now; None when the lane's images are not all here."""
        return self._desired.get(lane.name, {}).get(role)

    def drift(self, container: LaneContainer) -> list[str]:
        """How the container differs from what its lane's recipe says now ([] when current, or when the lane's
        build is not here to compare with)."""
        desired = self.desired(container.lane, container.role)
        if desired is None:
            return []
        if container.listed.labels.get(SPEC_LABEL) == desired.digest:
            return []
        now = desired.fields
        if self.snapshot.secret_key_new:
            now = {**now, "secret_env": {name: "" for name in now.get("secret_env") or {}}}
        return [self._with_image_env(change, container.fields, now) for change in spec_changes(container.fields, now)]

    def _with_image_env(self, change: str, was: dict[str, Any] | None, now: dict[str, Any]) -> str:
        """A primary's env is baked into its image: its image change names the variables its env changed in."""
        envs = self.snapshot.image_env
        old, new = envs.get(str((was or {}).get("image_id"))), envs.get(str(now.get("image_id")))
        if not change.startswith("image ") or old is None or new is None:
            return change
        names = env_names_changed(old, new)
        return f"{change} (env {names})" if names else change


@frozen
class LabelledLane:
    """A lane that no recipe which loads has, as the labels of the containers lanectl created for it show it."""

    name: str
    recipe: str  # the recipe id its containers were made from
    containers: tuple[ListedContainer, ...]  # those of this state folder: the primary first, then by role
    # Other state folders with containers of a lane of this name (another project's, or this one's run from
    # there): never touched from here.
    elsewhere: tuple[str, ...] = ()

    @property
    def primary(self) -> ListedContainer | None:
        return next((c for c in self.containers if role_of(c) == ROLE_PRIMARY and c.name == created_as(c)), None)


def labelled_lanes(catalog: Catalog, containers: Iterable[ListedContainer], state_dir: str) -> dict[str, LabelledLane]:
    """Every lane no lane of `catalog` names that lanectl made containers for, by name, with those of the state
    folder `state_dir`: a container counts when its creation label holds its own name (or the name it was set aside
    as), so a renamed or hand-made one never does."""
    found: dict[str, list[ListedContainer]] = {}
    for listed in containers:
        name = listed.labels.get(LANE_LABEL)
        made_as = created_as(listed)
        if not name or name in catalog.lanes or made_as is None:
            continue
        if listed.name == made_as or listed.name.startswith(made_as + ASIDE_MARK):
            found.setdefault(name, []).append(listed)
    lanes = {}
    for name, made in sorted(found.items()):
        ours = sorted((c for c in made if _of_state_folder(c, state_dir)),
                      key=lambda c: (role_of(c) != ROLE_PRIMARY, role_of(c), c.name))
        elsewhere = sorted({c.labels[STATE_DIR_LABEL] for c in made if not _of_state_folder(c, state_dir)})
        lanes[name] = LabelledLane(name, (ours or made)[0].labels.get(RECIPE_LABEL, ""), tuple(ours),
                                   tuple(elsewhere))
    return lanes


def _of_state_folder(listed: ListedContainer, state_dir: str) -> bool:
    """Made from the state folder `state_dir`, or before lanectl stamped containers with theirs."""
    owner = listed.labels.get(STATE_DIR_LABEL)
    return not owner or not state_dir or owner == state_dir


def created_as(listed: ListedContainer) -> str | None:
    return listed.labels.get(CREATED_AS_LABEL)


def role_of(listed: ListedContainer) -> str:
    return listed.labels.get(ROLE_LABEL, ROLE_PRIMARY)


def recorded_stop_timeout(labels: dict[str, str]) -> int | None:
    """The stop timeout a container was created with, as its spec-fields label records it (its drain was
    rendered from it); None when it records none."""
    recorded = (_fields(labels) or {}).get("stop_timeout_seconds")
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None


def recorded_ports(labels: dict[str, str]) -> list[PortMapping] | None:
    """The ports a container was created with, as its spec-fields label records them; None when unreadable."""
    return _ports((_fields(labels) or {}).get("ports"))


def as_published(lane: Lane, listed: Iterable[ListedContainer]) -> Lane:
    """The lane with each role's ports as its container was created with them (its recorded spec), where that
    differs from the recipe: a container put back after a failed recreate serves on its own port, and is held
    to its gate there, not on the port the recipe names now."""
    by_name = {c.name: c for c in listed}
    spec = lane.spec
    for role in lane.roles:
        container = by_name.get(lane.container_name(role))
        fields = _fields(container.labels) if container is not None else None
        recorded = _ports((fields or {}).get("ports"))
        engine = spec.engine if role == ROLE_PRIMARY else spec.companions[role].engine
        if recorded is None or recorded == list(engine.ports):
            continue
        if role == ROLE_PRIMARY:
            spec = replace(spec, engine=replace(spec.engine, ports=recorded))
        else:
            companion = spec.companions[role]
            spec = replace(spec, companions={**spec.companions,
                                             role: replace(companion, engine=replace(companion.engine,
                                                                                     ports=recorded))})
    return lane if spec is lane.spec else replace(lane, spec=spec)


def _ports(texts: Any) -> list[PortMapping] | None:
    """Ports as a container's spec fields record them (`127.0.0.1:18000->8000/tcp`); None when unreadable."""
    if not isinstance(texts, list):
        return None
    ports = []
    for text in texts:
        published, arrow, rest = str(text).partition("->")
        inside, slash, protocol = rest.partition("/")
        address, colon, host = published.rpartition(":")
        if not (arrow and slash and host.isdigit() and inside.isdigit() and protocol in ("tcp", "udp")):
            return None
        ports.append(PortMapping(container=int(inside), host=int(host), host_ip=address if colon else "0.0.0.0",
                                 protocol=protocol))  # type: ignore[arg-type]
    return ports


def host_ports(lane: Lane) -> set[tuple[str, int]]:
    engines = [lane.spec.engine, *(c.engine for c in lane.spec.companions.values())]
    return {(port.protocol, port.published) for engine in engines for port in engine.ports}


def _fields(labels: dict[str, str]) -> dict[str, Any] | None:
    raw = labels.get(SPEC_FIELDS_LABEL)
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None

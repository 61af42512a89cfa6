"""The shipped recipes as lanectl itself loads and renders them, with where each value is written."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.project import Project
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane, load_catalog
from lanectl.recipe.yaml_source import PathKey, YamlDocument, read_yaml_file

REPO = Path(__file__).resolve().parents[2]


@cache
def catalog() -> Catalog:
    # The whole recipes folder, validated by lanectl's own loader (no cache: paths are given).
    project = Project.locate(REPO / "recipes")
    return load_catalog(project, [REPO / "recipes"])


def lanes() -> list[Lane]:
    return sorted(catalog().lanes.values(), key=lambda lane: lane.name)


@cache
def _document(file: Path) -> YamlDocument:
    return read_yaml_file(file, str(file.relative_to(REPO)))


def where(lane: Lane, path: PathKey) -> str:
    """`recipes/…yaml:LINE` of a value of the lane: its own key, else the recipe's default it inherits
    (the same rule lanectl's loader locates its problems by)."""
    doc = _document(lane.recipe.file)
    own = ("lanes", lane.name, *path)
    located = own if doc.has(own) or not doc.has(("defaults", *path)) else ("defaults", *path)
    line, _ = doc.position(located)
    return f"{doc.file}:{line}"


@dataclass(frozen=True)
class RoleArgs:
    lane: Lane
    role: str
    args: tuple[str, ...]
    env: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.lane.name}/{self.role}"

    def where(self) -> str:
        base: PathKey = ("engine", "args") if self.role == ROLE_PRIMARY else ("companions", self.role, "engine", "args")
        return where(self.lane, base)


def baked_args(lane: Lane) -> list[RoleArgs]:
    """What each role's engine is started with, from lanectl's own plans: the primary's serve flags as the
    rendered Dockerfile bakes them (its CMD), each companion's as its container spec passes them."""
    image = plan_image(lane)
    cmd = [line for line in image.dockerfile.splitlines() if line.startswith("CMD ")]
    assert cmd, f"{lane.name}: the rendered Dockerfile has no CMD line"
    out = [RoleArgs(lane, ROLE_PRIMARY, tuple(json.loads(cmd[-1][4:])), dict(lane.spec.engine.env))]
    for spec in plan_containers(lane, image):
        if spec.role != ROLE_PRIMARY:
            assert spec.command is not None
            out.append(RoleArgs(lane, spec.role, tuple(spec.command), dict(spec.env)))
    return out


def uses_vllm_entrypoint(lane: Lane) -> bool:
    """Lanes whose image runs `vllm serve` (the vllm template) or imitates it (the stub engine's)."""
    template = lane.spec.image.template
    return lane.spec.engine.entrypoint is None and re.fullmatch(r"vllm|stub-engine", template) is not None

"""`status` and `down` see and stop what runs whatever state the recipes are in.

The engine is the in-memory one (tests/switch_box.py) standing in for the Docker adapter of the commands, and the
lane is brought up by a real `up` on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanectl.lanes.switcher import LaneSwitcher
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles, create_state_dir
from tests.lane_fixtures import LaneProject, make_lane_project
from tests.switch_box import Box, FakeEngines, MemoryEngine, QuietReporter

LANE = "demo-h1"


@pytest.fixture
def lanes(tmp_path: Path) -> LaneProject:
    return make_lane_project(tmp_path)


@pytest.fixture
def engine(lanes: LaneProject, monkeypatch: pytest.MonkeyPatch) -> MemoryEngine:
    """An engine in memory, in place of the Docker adapter the commands make, holding every lane's build."""
    catalog = load_catalog(Project.locate(lanes.root / "recipes"))
    memory = MemoryEngine(Box(catalog).build(*catalog.lanes).images)
    for module in ("lanectl.commands.status", "lanectl.commands.switch"):
        monkeypatch.setattr(f"{module}.ContainerEngine", lambda: memory)
    return memory


def brought_up(lanes: LaneProject, engine: MemoryEngine, state: Path, lane: str = LANE) -> None:
    """`up` of the lane on the engine in memory, as the real switch makes it (its gate answered by a fake)."""
    catalog = load_catalog(Project.locate(lanes.root / "recipes"))
    create_state_dir(state)
    files = StateFiles(state)
    switcher = LaneSwitcher(catalog, engine, Journal(files.journal), LaneStateStore(files.lanes),  # type: ignore[arg-type]
                            reporter=QuietReporter(), no_gpu=True, environ={}, calls=FakeEngines(engine),
                            host_memory=lambda: 64.0, gpu_memory=lambda: None)
    outcome = switcher.up(catalog.lanes[lane])
    assert outcome.result == "ok", outcome.message


def lanectl(lanes: LaneProject, state: Path, *args: str, code: int = 0):
    result = lanes.invoke(*args, state=state)
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def status(lanes: LaneProject, state: Path) -> dict:
    return json.loads(lanectl(lanes, state, "status", "--json").stdout)["data"]


def row(data: dict, lane: str) -> dict:
    return next(r for r in data["lanes"] if r["lane"] == lane)


def test_status_of_a_running_lane_whose_primary_publishes_no_port_says_it_is_not_probed(lanes, engine, tmp_path):
    state = tmp_path / "state"
    lanes.edit_lane(LANE, "    engine:\n      ports: []\n")
    brought_up(lanes, engine, state)
    assert row(status(lanes, state), LANE)["health"] == "not probed: its primary publishes no port"

"""`status` and `down` see and stop what runs whatever state the recipes are in: a template broken after `up`, a
recipe file deleted or no longer valid, a lane renamed. A lane no recipe that loads has is read from its
containers' labels; one whose recipe loads but whose image no longer renders is the recipe's lane as before.

The engine is the in-memory one (tests/switch_box.py) standing in for the Docker adapter of the commands, and the
lane is brought up by a real `up` on it; tests/test_switch_docker.py holds the same on the real engine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lanectl.dockerapi.labels import STATE_DIR_LABEL
from lanectl.errors import BadInput
from lanectl.lanes.plan import plan_down, plan_reconcile, plan_up
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles, create_state_dir
from tests.lane_fixtures import LaneProject, make_lane_project
from tests.switch_box import Box, FakeEngines, MemoryEngine, QuietReporter, keys, repo_catalog

LANE = "demo-h1"
# The tests' stop timeout (tests/lane_fixtures.py): what each container was created with, and must be stopped with.
STOP_TIMEOUT = 18


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


def containers(lanes: LaneProject, lane: str = LANE) -> list[str]:
    return [lanes.container(lane), lanes.container(lane, "rtx")]


def active(state: Path) -> str | None:
    return LaneStateStore(StateFiles(state).lanes).load().active


def test_a_lane_whose_template_breaks_after_up_is_shown_and_stopped_as_its_recipe_says(lanes, engine, tmp_path):
    state = tmp_path / "state"
    brought_up(lanes, engine, state)
    template = lanes.root / "images" / "stub-engine" / "Dockerfile.j2"
    template.write_text("{% if %}\n" + template.read_text())

    data = status(lanes, state)
    lane = row(data, LANE)
    assert lane["from_labels"] is False and lane["active"] and lane["image"] is None and lane["built"] is None
    assert "stub-engine/Dockerfile.j2:1: the image template does not render" in lane["recipe_problem"]
    assert [c["name"] for c in lane["containers"]] == containers(lanes)
    assert {c["status"] for c in lane["containers"]} == {"running"}
    assert {(c["current_build"], c["drift"]) for c in lane["containers"]} == {(None, None)}
    assert data["recipe_problems"] == [lane["recipe_problem"]]
    text = lanectl(lanes, state, "status")
    assert f"{LANE}  active known-good (its image does not render)" in text.stdout
    assert "recipes do not all load: " in text.stderr and "Dockerfile.j2:1" in text.stderr

    planned = json.loads(lanectl(lanes, state, "down", "--dry-run", "--json").stdout)["data"]
    down = json.loads(lanectl(lanes, state, "down", "--json").stdout)["data"]
    # The lane its recipe still has is stopped as down always stops it: companion first, each container with its own
    # stop timeout, and kept for a later start.
    assert down["steps"] == planned["keys"] == [f"stop:{lanes.container(LANE, 'rtx')}", f"stop:{lanes.container(LANE)}",
                                                f"deactivate:{LANE}"]
    assert engine.stops == [(lanes.container(LANE, "rtx"), STOP_TIMEOUT), (lanes.container(LANE), STOP_TIMEOUT)]
    assert sorted(engine.held) == sorted(containers(lanes)) and not engine.running()
    assert active(state) is None


def test_a_lane_whose_recipe_file_is_deleted_after_up_is_shown_and_stopped_and_removed_from_its_labels(
        lanes, engine, tmp_path):
    state = tmp_path / "state"
    brought_up(lanes, engine, state)
    (lanes.root / "recipes" / "lanes.yaml").unlink()

    data = status(lanes, state)
    lane = row(data, LANE)
    assert lane["from_labels"] is True and lane["recipe_problem"] == "no recipe that loads has it"
    assert lane["recipe"] == lanes.recipe_id and lane["active"] and lane["known_good"]
    assert lane["image"].startswith(f"lanectl/{lanes.recipe_id}:{LANE}-")
    assert [(c["name"], c["role"], c["status"]) for c in lane["containers"]] == [
        (lanes.container(LANE), "primary", "running"), (lanes.container(LANE, "rtx"), "rtx", "running")]
    assert lane["health"] is not None and "connection refused" in lane["health"]  # nothing listens in memory
    assert lane["dead"] is None and {(c["current_build"], c["drift"]) for c in lane["containers"]} == {(None, None)}
    assert data["unknown_containers"] == [] and data["recipe_problems"] == []
    assert f"{LANE}  active known-good lanectl/{lanes.recipe_id}:{LANE}-" in lanectl(lanes, state, "status").stdout

    planned = json.loads(lanectl(lanes, state, "down", "--dry-run", "--json").stdout)["data"]
    removal = [f"stop:{lanes.container(LANE, 'rtx')}", f"stop:{lanes.container(LANE)}",
               f"remove:{lanes.container(LANE, 'rtx')}", f"remove:{lanes.container(LANE)}", f"deactivate:{LANE}"]
    assert planned["keys"] == removal
    assert f"would stop {lanes.container(LANE, 'rtx')} (rtx of {LANE}), allowing {STOP_TIMEOUT} s to exit (no " \
           f"recipe that loads has {LANE})" in planned["steps"]
    assert any(line.startswith(f"note: {LANE} is in no recipe that loads") for line in planned["steps"])
    assert engine.running() == set(containers(lanes)), "a dry run changes nothing"

    down = json.loads(lanectl(lanes, state, "down", "--json").stdout)["data"]
    assert down["result"] == "ok" and down["steps"] == removal
    assert down["message"] == (f"{lanes.container(LANE)}-rtx, {lanes.container(LANE)} stopped and removed: no "
                               f"recipe that loads has {LANE}")
    assert engine.stops == [(lanes.container(LANE, "rtx"), STOP_TIMEOUT), (lanes.container(LANE), STOP_TIMEOUT)]
    assert engine.held == {} and active(state) is None
    intent = [r for r in Journal(StateFiles(state).journal).read().records if r["kind"] == "intent"][-1]
    assert intent["action"] == "down" and intent["from"] == LANE and intent["steps"] == removal
    assert status(lanes, state)["lanes"] == []


def test_a_recipe_that_no_longer_validates_hides_no_lane_and_status_names_its_first_problem(lanes, engine,
                                                                                            tmp_path):
    state = tmp_path / "state"
    brought_up(lanes, engine, state)
    recipe = lanes.root / "recipes" / "lanes.yaml"
    recipe.write_text(recipe.read_text().replace("keep_stopped_lanes: 3", "keep_stopped_lanes: many"))
    # Another recipe file, valid on its own: its lanes are read from it as ever.
    (lanes.root / "recipes" / "other.yaml").write_text(OTHER)

    result = lanectl(lanes, state, "status", "--json")
    data = json.loads(result.stdout)["data"]
    assert row(data, LANE)["from_labels"] is True and row(data, LANE)["active"]
    other = row(data, "other-a")
    assert other["from_labels"] is False and other["recipe"] == "other" and other["containers"] == []
    assert len(data["recipe_problems"]) == 1 and data["recipe_problems"][0].startswith("recipes/lanes.yaml:")
    assert "keep_stopped_lanes" in data["recipe_problems"][0]
    text = lanectl(lanes, state, "status")
    assert text.stderr.splitlines()[-1] == f"recipes do not all load: {data['recipe_problems'][0]}"

    result = lanectl(lanes, state, "down")
    assert f"stopped and removed: no recipe that loads has {LANE}" in result.stdout
    assert "recipes do not all load: recipes/lanes.yaml:" in result.stderr
    assert engine.held == {}


def test_down_of_a_lane_no_recipe_engine_or_state_file_knows_is_refused_before_anything(lanes, engine, tmp_path):
    state = tmp_path / "state"
    brought_up(lanes, engine, state)
    journal = Journal(StateFiles(state).journal)
    records, engine.calls = journal.read().records, []
    result = lanectl(lanes, state, "down", "demo-h9", code=2)
    assert result.stderr.startswith("lanectl: no lane 'demo-h9'; did you mean ")
    assert engine.calls == ["list"] and journal.read().records == records


def test_status_of_a_running_lane_whose_primary_publishes_no_port_says_it_is_not_probed(lanes, engine, tmp_path):
    state = tmp_path / "state"
    lanes.edit_lane(LANE, "    engine:\n      ports: []\n")
    brought_up(lanes, engine, state)
    assert row(status(lanes, state), LANE)["health"] == "not probed: its primary publishes no port"


OTHER = """\
schema: lanectl/v1
id: other
naming: {container: "other-{lane}"}
defaults:
  image: {template: stub-engine, base: lanectl/base-python:bookworm, local_base: true, python_site: /opt/stub}
  engine:
    args: [/model, --served-model-name, other, --port, "8000"]
    ports: [{container: 8000, host: 18990, host_ip: 127.0.0.1}]
  health: {startup_budget_minutes: 1, served_model_name: other}
lanes:
  other-a: {}
"""


# -- the plan, from a box built by hand -----------------------------------------------------------------------

H2 = "lanectl-demo-demo-h2"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return repo_catalog()


def without(catalog: Catalog, lane: str) -> Catalog:
    return replace(catalog, lanes={name: found for name, found in catalog.lanes.items() if name != lane})


def test_a_lane_read_from_labels_is_stopped_companion_first_and_removed_and_its_standby_forgotten(catalog):
    box = Box(catalog).run("demo-h1", "exited").run("demo-h2").active("demo-h1", "demo-h1").asleep("demo-h2")
    plan = plan_down(without(catalog, "demo-h2"), box.snapshot(), "demo-h1", with_standbys=True)
    assert keys(plan) == ["deactivate:demo-h1", f"stop:{H2}-rtx", f"stop:{H2}", f"remove:{H2}-rtx", f"remove:{H2}",
                          "forget-standby:demo-h2"]
    assert [step.seconds for step in plan.steps if step.action == "stop"] == [30, 30]  # as each was created


def test_containers_of_another_state_folder_are_never_read_as_this_ones(catalog):
    box = Box(catalog).run("demo-h2")
    for name, container in box.containers.items():
        box.containers[name] = replace(container, labels={**container.labels, STATE_DIR_LABEL: "/srv/other-state"})
    snapshot = replace(box.snapshot(), state_dir="/var/lib/lanectl")
    with pytest.raises(BadInput, match="belong to the state folder /srv/other-state, not /var/lib/lanectl"):
        plan_down(without(catalog, "demo-h2"), snapshot, "demo-h2", with_standbys=False)
    # Another project's lane of the same name beside this one's: only this one's are stopped.
    ours = Box(catalog).run("demo-h2").containers
    box.containers.update({f"{name}-ours": replace(c, name=f"{name}-ours", labels={
        **c.labels, "io.lanectl.container": f"{name}-ours", STATE_DIR_LABEL: "/var/lib/lanectl"}) for name, c in
        ours.items()})
    snapshot = replace(box.snapshot(), state_dir="/var/lib/lanectl")
    assert keys(plan_down(without(catalog, "demo-h2"), snapshot, "demo-h2", with_standbys=False)) == [
        f"stop:{H2}-rtx-ours", f"stop:{H2}-ours", f"remove:{H2}-rtx-ours", f"remove:{H2}-ours"]


def test_a_lane_whose_image_does_not_render_is_refused_by_up_and_keeps_no_other_lane_from_switching(catalog):
    box = Box(catalog).run("demo-h1").build("demo-h2").active("demo-h1", "demo-h1").fingerprinted("demo-h1")
    why = "images/stub-engine/Dockerfile.j2:1: the image template does not render: …; fix the template"
    snapshot = box.snapshot()
    snapshot = replace(snapshot, unrendered={"demo-h1": why},
                       image_plans={k: v for k, v in snapshot.image_plans.items() if k != "demo-h1"})
    with pytest.raises(BadInput, match="Dockerfile.j2:1: the image template does not render"):
        plan_up(catalog, snapshot, catalog.lane("demo-h1"))
    plan = plan_up(catalog, snapshot, catalog.lane("demo-h2"))
    assert f"start:{H2}" in keys(plan) and plan.previous == "demo-h1"
    assert "gate:demo-h1" in [key for phase in plan.way_back for key in keys(phase.steps)], "the way back is there"


def test_a_killed_down_of_a_lane_read_from_labels_is_finished_from_its_labels(catalog):
    box = Box(catalog).run("demo-h2").active("demo-h2", "demo-h2")
    box.containers.pop(f"{H2}-rtx")  # the killed down had removed the companion
    box.unfinished = {"switch": "s1", "action": "down", "from": "demo-h2", "to": None, "done_steps": []}
    plan = plan_reconcile(without(catalog, "demo-h2"), box.snapshot())
    assert plan is not None and plan.kind == "finish-down"
    assert keys(plan) == [f"stop:{H2}", f"remove:{H2}", "deactivate:demo-h2"]

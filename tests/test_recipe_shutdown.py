"""What a lane's engine does with requests in flight when it is stopped: the --shutdown-timeout lanectl renders into
every `vllm serve` role from its stop timeout, or checks when the recipe gives one, and the drain budget the switch
reads (lanectl.recipe.shutdown). Exact, located messages for a drain that cannot fit.

Also here: the rules that fail a lane (`startup_log.forbid`, `watchdog.fatal_log_lines`) must be anchored at the
start of a record's message, where no client's text can be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanectl.errors import RecipeInvalid
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.shutdown import TEARDOWN_SECONDS, drain_seconds
from tests.test_cli import lanectl

REPO = Path(__file__).resolve().parent.parent
RECIPE = """
schema: lanectl/v1
id: t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, m, --port, "8000"]
    stop_timeout_seconds: 120
  companions:
    rtx:
      engine:
        args: [/model, --port, "8001"]
        stop_timeout_seconds: 60
  health:
    startup_budget_minutes: 1
    served_model_name: m
lanes:
  a: {}
"""


def problems() -> list[str]:
    with pytest.raises(RecipeInvalid) as caught:
        load_catalog(Project.locate())
    return [str(p) for p in caught.value.problems]


def serve_args(lane_name: str = "a", root: Path | None = None) -> dict[str, list[str]]:
    """Each role's serve flags as lanectl hands them to Docker: the image's CMD, each companion's command."""
    lane = load_catalog(Project.locate(root)).lane(lane_name)
    image = plan_image(lane)
    cmd = next(line for line in reversed(image.dockerfile.splitlines()) if line.startswith("CMD "))
    out = {"primary": json.loads(cmd[4:])}
    out.update({spec.role: list(spec.command or []) for spec in plan_containers(lane, image) if spec.role != "primary"})
    return out


def test_each_vllm_role_stops_with_its_stop_timeout_less_the_teardown_margin(write_recipe) -> None:
    write_recipe(RECIPE)
    assert serve_args() == {
        "primary": ["/model", "--served-model-name", "m", "--port", "8000", "--shutdown-timeout", "105"],
        "rtx": ["/model", "--port", "8001", "--shutdown-timeout", "45"],
    }
    spec = load_catalog(Project.locate()).lane("a").spec
    assert drain_seconds(spec, "primary") == 120 - TEARDOWN_SECONDS
    assert drain_seconds(spec, "rtx") == 60 - TEARDOWN_SECONDS


def test_the_shipped_lanes_drain_for_their_stop_timeout_less_15_s() -> None:
    production = serve_args("h2-REF", REPO / "recipes")
    assert production["primary"][-2:] == ["--shutdown-timeout", "105"]
    assert production["rtx"][-2:] == ["--shutdown-timeout", "45"]
    demo = serve_args("demo-h1", REPO / "recipes")
    assert demo["primary"][-2:] == demo["rtx"][-2:] == ["--shutdown-timeout", "15"]


@pytest.mark.parametrize("flag", [["--shutdown-timeout", "30"], ["--shutdown-timeout=30"], ["--shutdown-timeout", "0"]])
def test_a_flag_the_recipe_gives_is_kept_as_given_and_is_the_drain(write_recipe, flag: list[str]) -> None:
    write_recipe(RECIPE.replace('args: [/model, --served-model-name, m, --port, "8000"]',
                                f'args: [/model, --served-model-name, m, --port, "8000", {json.dumps(flag)[1:-1]}]'))
    assert serve_args()["primary"] == ["/model", "--served-model-name", "m", "--port", "8000", *flag]
    spec = load_catalog(Project.locate()).lane("a").spec
    assert drain_seconds(spec, "primary") == int(flag[-1].rsplit("=", 1)[-1])


def test_a_role_lanectl_does_not_run_as_vllm_serve_gets_no_flag_and_no_known_drain(write_recipe) -> None:
    write_recipe(RECIPE.replace('        args: [/model, --port, "8001"]',
                                '        entrypoint: [python3, -m, http.server]\n        args: ["8001"]'))
    assert serve_args()["rtx"] == ["8001"]
    assert drain_seconds(load_catalog(Project.locate()).lane("a").spec, "rtx") is None


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param(
        ("    stop_timeout_seconds: 120\n", "    stop_timeout_seconds: 15\n"),
        "recipes/r.yaml:11:27: defaults.engine.stop_timeout_seconds: 15 s leaves the primary engine no time to drain "
        "its requests on a stop: lanectl gives vLLM stop_timeout_seconds - 15 s (--shutdown-timeout) and keeps 15 s "
        "for its teardown before Docker kills it. Raise stop_timeout_seconds to at least 16",
        id="no-room-to-drain"),
    pytest.param(
        ('args: [/model, --port, "8001"]', 'args: [/model, --port, "8001", --shutdown-timeout, "50"]'),
        "recipes/r.yaml:15:40: defaults.companions.rtx.engine.args[3]: --shutdown-timeout 50 does not fit the rtx's "
        "stop_timeout_seconds (60): a drain of 50 s and vLLM's teardown (15 s kept for it) outlast Docker's stop, "
        "which kills the engine mid-drain and leaves its streams hanging. Lower --shutdown-timeout to at most 45, "
        "raise stop_timeout_seconds to at least 65, or drop the flag (lanectl then sets stop_timeout_seconds - 15)",
        id="explicit-too-long"),
    pytest.param(
        ('args: [/model, --port, "8001"]', 'args: [/model, --port, "8001", --shutdown-timeout=-5]'),
        "recipes/r.yaml:15:40: defaults.companions.rtx.engine.args[3]: --shutdown-timeout '-5': vLLM takes a whole "
        "number of seconds, 0 (abort requests in flight) or more (let them finish)",
        id="explicit-negative"),
])
def test_a_drain_that_cannot_fit_is_refused_where_it_is_written(write_recipe, change, expected) -> None:
    write_recipe(RECIPE.replace(*change))
    assert problems() == [expected]


def test_validate_exits_2_naming_the_line_and_builds_nothing(project, write_recipe) -> None:
    write_recipe(RECIPE.replace("    stop_timeout_seconds: 120\n", "    stop_timeout_seconds: 10\n"))
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(
        "recipes/r.yaml:11:27: defaults.engine.stop_timeout_seconds: 10 s leaves the primary engine no time to drain")
    assert result.stderr.splitlines()[-1] == "1 problem(s); nothing was built or started."


@pytest.mark.parametrize(("rule", "where"), [
    ("startup_log: {forbid: ['NCCL error']}", "health.startup_log.forbid[0]"),
    ("startup_log: {forbid: ['^.*NCCL error']}", "health.startup_log.forbid[0]"),
])
def test_a_forbid_rule_a_client_could_set_off_is_refused(write_recipe, rule: str, where: str) -> None:
    write_recipe(RECIPE.replace("    served_model_name: m\n", f"    served_model_name: m\n    {rule}\n"))
    (problem,) = problems()
    assert f"defaults.{where}: " in problem and "can match past the start of a record's message" in problem
    assert "Error with model" in problem and problem.endswith("e.g. '^NCCL error'")


def test_a_fatal_log_line_a_client_could_set_off_is_refused_and_an_anchored_one_loads(write_recipe) -> None:
    write_recipe(RECIPE.replace("  a: {}\n", "  a:\n    watchdog: {fatal_log_lines: ['NCCL error']}\n"))
    (problem,) = problems()
    assert problem.startswith("recipes/r.yaml:22:34: lanes.a.watchdog.fatal_log_lines[0]: 'NCCL error' can match")
    write_recipe(RECIPE.replace("  a: {}\n", "  a:\n    watchdog: {fatal_log_lines: ['^NCCL error']}\n"))
    assert load_catalog(Project.locate()).lane("a").spec.watchdog.fatal_log_lines == ["^NCCL error"]

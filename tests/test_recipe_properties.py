"""Validation is total: a property test over recipes generated from the schema `lanectl schema` prints.

Each example is the good two-lane recipe with some of its lane's sections (and the recipe's own keys) replaced by
values hypothesis-jsonschema draws from that section's schema, then made hostile: a string gains a lone surrogate,
a terminal control, a bidi mark, a line separator, a path that climbs out or is too long for the OS, a Jinja or
shell fragment; a number becomes one at the edges (0, -1, 2^63, 1e308, inf). Whatever comes out:

- `lanectl validate` exits 0 or 2, never with a traceback (the in-process runner fails the test on one);
- what it accepts renders: `render` of each lane and `lanes` exit 0;
- and `status` and `down --dry-run` work with it: with a lane's containers as `up` creates them on an engine in
  memory (tests/switch_box.py, in place of the Docker adapter), read through the recipe or from their labels
  alone once the recipe is gone (each in a third of the examples);
- nothing raw from the recipe reaches the terminal: no C0/C1 control but newline and tab, no bidi mark, no
  line separator, no lone surrogate in anything printed.

The schema is generated with every list, mapping and string capped small (the recipe schema in full takes
seconds an example to draw), and the run is derandomized, so CI runs the same examples every time. Each failure it
found is also an example test of its own (tests/test_recipe_totality.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from lanectl.lanes.inventory import Inventory
from lanectl.output import has_controls
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog
from lanectl.state.lanes import LaneState, LaneStateStore
from lanectl.state.paths import StateFiles, create_state_dir
from tests.cli_in_process import run_cli
from tests.conftest import REPO
from tests.switch_box import Box, Held, MemoryEngine
from tests.test_cli import environment
from tests.test_recipe_validation import GOOD

HOSTILE = ["\udc80", "\ud800", "\x1b]0;owned\x07", "\x1b[2J", "\x9b31m", "\u202e", "\u2066", "\u2028", "\x85",
           "\r", "\x0b", "../../../etc/passwd", "/" + "n" * 300, "n" * 300, "loop/x", "{{ 7 * 7 }}", "{% raw %}",
           "$(reboot)", "; rm -rf /", "\\", "\"'", "\ufeff", ""]
EDGES = [0, -1, 1, 2**31, 2**63, -(2**63), 2**64, 1e308, -1e308, 5e-324, float("inf")]
SECTIONS = ["image", "engine", "health", "watchdog", "placement", "standby", "companions", "patches", "kernels"]
EXAMPLES = 400


def recipe_schema() -> dict[str, Any]:
    from hypothesis_jsonschema._resolve import resolve_all_refs

    from lanectl.recipe.schema import recipe_json_schema

    return resolve_all_refs(recipe_json_schema())


def capped(node: Any) -> Any:
    """The schema with every list, mapping and free string kept small, so an example takes milliseconds."""
    if isinstance(node, list):
        return [capped(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: capped(value) for key, value in node.items()}
    limits = {"array": ("maxItems", 4), "object": ("maxProperties", 3), "string": ("maxLength", 24)}
    kind = node.get("type")
    if isinstance(kind, str) and kind in limits and "pattern" not in node:
        key, most = limits[kind]
        node[key] = min(node.get(key, most), most)
    return node


@functools.cache
def section_strategies() -> dict[str, st.SearchStrategy[Any]]:
    """A strategy per lane section and per recipe key, each from its own part of the schema (made once: building
    one canonicalises its schema, which costs more than drawing from it)."""
    from hypothesis_jsonschema import from_schema

    schema = recipe_schema()
    lane = schema["properties"]["lanes"]["additionalProperties"]["anyOf"][0]["properties"]
    sections = {f"lane.{name}": from_schema(capped(lane[name])) for name in SECTIONS}
    top = {f"top.{name}": from_schema(capped(schema["properties"][name]))
           for name in ("id", "naming", "keep_stopped_lanes")}
    return {**sections, **top}


@st.composite
def hostile(draw: st.DrawFn, value: Any) -> Any:
    """`value` with some of its strings (keys too) and numbers replaced by hostile ones."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[draw(hostile(key)) if isinstance(key, str) else key] = draw(hostile(item))
        return out
    if isinstance(value, list):
        return [draw(hostile(item)) for item in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        extra = draw(st.sampled_from([None, None, *HOSTILE]))
        return value if extra is None else draw(st.sampled_from([value + extra, extra + value, extra]))
    if isinstance(value, int | float):
        return draw(st.sampled_from([value, value, *EDGES]))
    return value


@st.composite
def recipes(draw: st.DrawFn) -> str:
    """The good recipe, one of its sections (or the recipe's own keys) drawn from the schema, and now and then
    made hostile."""
    recipe = yaml.safe_load(GOOD)
    strategies = section_strategies()
    key = draw(st.sampled_from(sorted(strategies)))
    where, name = key.split(".")
    value = draw(strategies[key])
    if draw(st.booleans()):
        value = draw(hostile(value))
    if where == "top":
        recipe[name] = value
    else:
        recipe["lanes"][draw(st.sampled_from(["a", "b"]))][name] = value
    if draw(st.integers(0, 3)) == 0:
        recipe["defaults"]["engine"] = draw(hostile(recipe["defaults"]["engine"]))
    if draw(st.integers(0, 5)) == 0:
        name = draw(st.one_of(hostile("b"), st.text(max_size=70), st.sampled_from(["b.", "-b", "B", "b" * 64])))
        recipe["lanes"] = {"a": recipe["lanes"]["a"], name: recipe["lanes"]["b"]}
    return yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True, width=1000)


@pytest.fixture(scope="module")
def project_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    root = tmp_path_factory.mktemp("properties") / "project"
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "recipes").mkdir()
    (root / "patches" / "loop").symlink_to(root / "patches" / "loop")  # a path the OS refuses to follow
    return root


def shows_nothing_raw(text: str) -> bool:
    return not has_controls(text)


class Engines:
    """The engine in memory the commands get in place of the Docker adapter: one per example."""

    def __init__(self) -> None:
        self.current = MemoryEngine()

    def made_for(self, catalog: Catalog, name: str) -> MemoryEngine:
        """The lane's build, and its containers, stopped, as `up` creates them from it."""
        lane = catalog.lanes[name]
        alone = replace(catalog, lanes={name: lane})
        box = Box(alone).build(name)
        inventory = Inventory(alone, box.snapshot())
        self.current = MemoryEngine(box.images)
        for role in lane.roles:
            desired = inventory.desired(lane, role)
            assert desired is not None, f"{name} is built"
            self.current.held[desired.spec.name] = Held(desired.spec, "exited")
        return self.current


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    made = Engines()
    with pytest.MonkeyPatch.context() as patch:
        for module in ("lanectl.commands.status", "lanectl.commands.switch"):
            patch.setattr(f"{module}.ContainerEngine", lambda: made.current)
        yield made


# No shrinking: a failing recipe is shown as drawn (shrinking one took Hypothesis over five minutes).
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])
@given(text=recipes())
def test_validate_is_total_and_what_it_accepts_renders(project_dir: Path, engines: Engines, text: str) -> None:
    recipe = project_dir / "recipes" / "r.yaml"
    recipe.write_text(text, encoding="utf-8")
    state = project_dir.parent / "state"
    env = environment({"LANECTL_CACHE_DIR": str(project_dir.parent / "cache"),
                       "LANECTL_STATE_DIR": str(state), "NO_COLOR": "1"})

    def lanectl(*args: str) -> Any:
        result = run_cli(*args, cwd=project_dir, env=env)
        shown = result.stdout + result.stderr
        assert shows_nothing_raw(shown), f"lanectl {' '.join(args)} printed a raw control:\n{shown!r}"
        return result

    validated = lanectl("validate", "--json")
    assert validated.returncode in (0, 2), validated.stderr
    event(f"validate exit {validated.returncode}")
    if validated.returncode != 0:
        assert validated.stderr.strip(), "refused without a word"
        return
    lanes = json.loads(validated.stdout)["data"]["lanes"]
    for lane in lanes:
        rendered = lanectl("render", lane)
        assert rendered.returncode == 0, f"validate accepted lane {lane!r}, render refused it:\n{rendered.stderr}"
    assert lanectl("lanes").returncode == 0
    # status and down --dry-run of the first lane, through its recipe or from its containers' labels alone, in a
    # third of the examples each (chosen by the recipe's length: both in every example would cost CI 10 s).
    # Stopped containers for status (a running one is probed over the network, as is the active lane's in down's
    # look), running ones for down to plan their stops.
    way = len(text) % 3
    if way == 2:
        return
    engine = engines.made_for(load_catalog(Project.locate(project_dir / "recipes"), [recipe]), lanes[0])
    if way == 1:
        recipe.unlink()
    create_state_dir(state)
    states = LaneStateStore(StateFiles(state).lanes)
    states.save(LaneState(active=lanes[0], known_good=(lanes[0],)))
    shown = lanectl("status")
    assert shown.returncode == 0, shown.stderr
    states.save(LaneState())
    for held in engine.held.values():
        held.state = "running"
    planned = lanectl("down", "--dry-run", "--", lanes[0])
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.strip(), "a lane that runs, and a plan that stops nothing"

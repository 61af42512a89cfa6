"""Numbers and booleans in recipes and kernel files are YAML numbers and booleans, as the field reference says:
text that reads like one ("30", "139.8", "no") is refused where it is written, with what to write instead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.kernel import KernelSpec
from lanectl.recipe.model import LaneSpec, RecipeFile
from tests import test_recipe_standby as standby
from tests.test_recipe_validation import GOOD, problems

ENGINE_END = "  health:\n"  # the line after the defaults' engine section
HEALTH_END = "    served_model_name: m\n"  # the defaults' last health line


def added(anchor: str, lines: str) -> tuple[str, str]:
    """The change that writes `lines` after `anchor`, the line GOOD's defaults section ends a part with."""
    return (anchor, lines + anchor) if anchor == ENGINE_END else (anchor, anchor + lines)


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param(added(ENGINE_END, '    init: "no"\n'),
                 "recipes/r.yaml:13:11: defaults.engine.init: 'no' is text, not a boolean; write false, without "
                 "quotes", id="boolean-no"),
    pytest.param(added(ENGINE_END, "    init: 1\n"),
                 "recipes/r.yaml:13:11: defaults.engine.init: 1 is a number, not a boolean; write true",
                 id="boolean-as-number"),
    pytest.param(added(ENGINE_END, '    stop_timeout_seconds: "30"\n'),
                 "recipes/r.yaml:13:27: defaults.engine.stop_timeout_seconds: '30' is text, not an integer; "
                 "write 30, without quotes", id="integer"),
    pytest.param(added(ENGINE_END, "    stop_timeout_seconds: true\n"),
                 "recipes/r.yaml:13:27: defaults.engine.stop_timeout_seconds: Input should be a valid integer, "
                 "got True", id="boolean-as-integer"),
    pytest.param(("id: t\n", 'id: t\nkeep_stopped_lanes: "3"\n'),
                 "recipes/r.yaml:3:21: keep_stopped_lanes: '3' is text, not an integer; write 3, without quotes",
                 id="top-level-integer"),
    pytest.param(("startup_budget_minutes: 1\n", 'startup_budget_minutes: "1.5"\n'),
                 "recipes/r.yaml:14:29: defaults.health.startup_budget_minutes: '1.5' is text, not a number; "
                 "write 1.5, without quotes", id="number"),
    pytest.param(("startup_budget_minutes: 1\n", "startup_budget_minutes: 1e3\n"),
                 "recipes/r.yaml:14:29: defaults.health.startup_budget_minutes: '1e3' is text, not a number; "
                 "write 1000, without quotes (YAML reads an exponent as a number only after a dot and with its "
                 "sign: 1.0e+3)", id="exponent-without-dot"),
    pytest.param(("startup_budget_minutes: 1\n", "startup_budget_minutes: true\n"),
                 "recipes/r.yaml:14:29: defaults.health.startup_budget_minutes: Input should be a valid number, "
                 "got True", id="boolean-as-number-field"),
    pytest.param(added(HEALTH_END, '    generation_probe: {timeout_seconds: "10"}\n'),
                 "recipes/r.yaml:16:41: defaults.health.generation_probe.timeout_seconds: '10' is text, not a "
                 "number; write 10, without quotes", id="nested-number"),
    pytest.param(added(ENGINE_END, '    gpus: {count: "1"}\n'),
                 "recipes/r.yaml:13:19: defaults.engine.gpus.count: '1' is text, not an integer; write 1, "
                 "without quotes", id="number-or-all"),
    pytest.param(added(ENGINE_END, "    gpus: {count: 2.0}\n"),
                 "recipes/r.yaml:13:19: defaults.engine.gpus.count: 2.0 is a decimal number, not an integer; write 2",
                 id="decimal-as-integer"),
    pytest.param(("{container: 8000, host: 18000}", '{container: 8000, host: "18000"}'),
                 "recipes/r.yaml:12:33: defaults.engine.ports[0].host: '18000' is text, not an integer; write "
                 "18000, without quotes", id="port"),
    pytest.param(added(ENGINE_END, '    volumes: [{target: /data, source: /srv, read_only: "yes"}]\n'),
                 "recipes/r.yaml:13:56: defaults.engine.volumes[0].read_only: 'yes' is text, not a boolean; "
                 "write true, without quotes", id="boolean-in-list"),
    pytest.param(added(HEALTH_END, '  watchdog: {xid: {hardware_codes: [48, "79"]}}\n'),
                 "recipes/r.yaml:16:41: defaults.watchdog.xid.hardware_codes[1]: '79' is text, not an integer; "
                 "write 79, without quotes", id="integer-list-item"),
    pytest.param(added(HEALTH_END, '  watchdog: {restart: {window_minutes: "30"}}\n'),
                 "recipes/r.yaml:16:40: defaults.watchdog.restart.window_minutes: '30' is text, not a number; "
                 "write 30, without quotes", id="watchdog-number"),
    pytest.param(added(HEALTH_END, '    startup_log: {stall: [{after: a, until: b, minutes: "3"}]}\n'),
                 "recipes/r.yaml:16:57: defaults.health.startup_log.stall[0].minutes: '3' is text, not a number; "
                 "write 3, without quotes", id="number-in-list-of-sections"),
    pytest.param(("  b:\n    engine:\n", '  b:\n    health: {startup_budget_minutes: "2"}\n    engine:\n'),
                 "recipes/r.yaml:19:38: lanes.b.health.startup_budget_minutes: '2' is text, not a number; write 2, "
                 "without quotes", id="in-a-lane"),
])
def test_text_that_reads_like_a_number_or_boolean_is_refused(project, write_recipe, change, expected):
    old, new = change
    assert old in GOOD
    write_recipe(GOOD.replace(old, new, 1))
    assert problems(project) == [expected]


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param(("gpu_memory_gib: 80", 'gpu_memory_gib: "139.8"'),
                 "recipes/r.yaml:18:86: defaults.standby.gpu_memory_gib: '139.8' is text, not a number; write "
                 "139.8, without quotes", id="gib"),
    pytest.param(("level: 1", 'level: "1"'),
                 "recipes/r.yaml:18:33: defaults.standby.level: '1' is text, not an integer; write 1, without "
                 "quotes", id="level"),
])
def test_a_standby_takes_plain_numbers(project, write_recipe, change, expected):
    old, new = change
    assert old in standby.GOOD
    write_recipe(standby.GOOD.replace(old, new, 1))
    assert problems(project) == [expected]


def test_a_kernel_file_takes_a_plain_boolean(project, write_recipe):
    kernel = project / "kernels" / "flashmla-splitkv.yaml"
    text = kernel.read_text()
    assert "builder:\n  requires:" in text
    kernel.write_text(text.replace("builder:\n", 'builder:\n  local: "no"\n', 1))
    write_recipe(GOOD.replace('  b:\n    engine:\n      env: {X: "1"}\n', "  b:\n    kernels: [flashmla-splitkv]\n", 1))
    assert problems(project) == [
        "kernels/flashmla-splitkv.yaml:19:10: builder.local: 'no' is text, not a boolean; write false, without quotes"]


def test_text_that_reads_as_nothing_keeps_the_type_s_own_message(project, write_recipe):
    write_recipe(GOOD.replace("startup_budget_minutes: 1\n", "startup_budget_minutes: soon\n", 1)
                 .replace("  health:\n", "    init: maybe\n  health:\n", 1))
    assert problems(project) == [
        "recipes/r.yaml:13:11: defaults.engine.init: Input should be a valid boolean, got 'maybe'",
        "recipes/r.yaml:15:29: defaults.health.startup_budget_minutes: Input should be a valid number, got 'soon'",
    ]


def test_yaml_numbers_and_booleans_stay_valid(project, write_recipe):
    """Unquoted, as YAML writes them: `no` is YAML's false, an integer is a number, `1.5e+1` is 15.0."""
    write_recipe(GOOD.replace("startup_budget_minutes: 1\n", "startup_budget_minutes: 1.5e+1\n", 1)
                 .replace("  health:\n", "    init: no\n    stop_timeout_seconds: 30\n  health:\n", 1)
                 .replace(HEALTH_END, HEALTH_END + "  watchdog: {restart: {window_minutes: 30, "
                                                   "backoff_initial_seconds: 2.5}}\n", 1))
    spec = load_catalog(Project.locate()).lane("a").spec
    assert (spec.engine.init, spec.engine.stop_timeout_seconds) == (False, 30)
    assert (spec.health.startup_budget_minutes, spec.watchdog.restart.window_minutes) == (15.0, 30)
    assert spec.watchdog.restart.backoff_initial_seconds == 2.5


def scalar_schemas(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every integer, number and boolean in a pydantic core schema, with where it sits."""
    if isinstance(schema, dict):
        if schema.get("type") in ("int", "float", "bool"):
            yield path, schema
        for key, value in schema.items():
            if key not in ("default", "metadata"):
                yield from scalar_schemas(value, f"{path}/{key}")
    elif isinstance(schema, list | tuple):
        for index, item in enumerate(schema):
            yield from scalar_schemas(item, f"{path}/{index}")


@pytest.mark.parametrize(("record", "at_least"), [(RecipeFile, 1), (LaneSpec, 30), (KernelSpec, 1)])
def test_every_number_and_boolean_the_schema_names_refuses_text(record, at_least):
    """What `lanectl schema` calls integer, number or boolean is validated strictly, wherever it sits (a union, a
    list, a record a later field adds): the schema and `validate` agree on what a number is."""
    from pydantic import TypeAdapter

    found = list(scalar_schemas(TypeAdapter(record).core_schema))
    assert len(found) >= at_least
    assert [path for path, node in found if not node.get("strict")] == []

"""The quick commands import only what they use.

`lanectl status` is what an operator waits for, `lanectl watchdog check` runs from cron every
minute, `--help` is typed by hand: a module imported at the top of a module they pass through costs
each of them its import time whether it is used or not. The real CLI runs in a subprocess with
`-X importtime`, which names every module the command imported; speed itself is measured by
`make bench` (benchmarks/lanes.py, benchmarks/watchdog.py), not here.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Imported by none of the three: the plot extra, the Dockerfile templates (a pass that acts renders
# through the switcher; a healthy pass does not), the switch machinery, the webhook retries, the
# benchmark and fleet code, the Docker SDK with its HTTP stack (lanectl's own client speaks to the
# engine; the SDK is for registry logins, by builds and pushes), and httpx (the probes use dockerapi.http1;
# httpx is for the load generator, the webhooks and downloads), nor http.client with the email parser and ssl
# it imports (+17 ms of CPU; an engine reached over TLS imports ssl then).
NEVER = {"matplotlib", "jinja2", "tenacity", "lanectl.lanes.switcher", "lanectl.state.lock", "lanectl.bench",
         "lanectl.fleet", "lanectl.image.build", "lanectl.watchdog.alerts", "docker", "requests", "urllib3",
         "httpx", "http.client", "email", "ssl"}
# The recipes are parsed and validated once; later commands load the validated catalog from the cache, plain
# dataclasses that pydantic validated and that need no pydantic to be read.
CACHED_CATALOG = {"yaml", "lanectl.recipe.yaml_source", "lanectl.recipe.validation", "pydantic", "pydantic_core"}
# What `status` does not watch with: the Xid tables (the recipe model's default Xid lists are made at validation).
STATUS = {"lanectl.host.xid"}
# Output that is not a terminal (cron, CI, a pipe; here, a capture) shows no styles: it is printed without rich.
PLAIN_OUTPUT = {"rich", "lanectl.cli.rich_console"}
# --help, --version and the completion of command names touch neither the engine nor the recipes, and print
# through click alone: not rich (nor typer's rich help, with its Markdown parser), no command's module.
HELP = {"docker", "httpx", "pydantic", "yaml", "rich", "typer.rich_utils", "markdown_it", "lanectl.recipe",
        "lanectl.dockerapi", "lanectl.commands", "lanectl.output", "lanectl.project", "lanectl.cli.views",
        "lanectl.cli.terminal"}


def imported(*args: str, cwd: Path, env: dict[str, str]) -> set[str]:
    """Every module the CLI imported (and each package above it); fails on a non-zero exit below 2."""
    environment = {**{k: v for k, v in os.environ.items()
                      if not k.startswith("LANECTL_") and k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}, **env}
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "lanectl", *args], cwd=cwd, env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    names = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return {prefix for name in names for prefix in _prefixes(name)}


def undocumented_dataclasses(modules: set[str]) -> list[str]:
    """lanectl's dataclasses among `modules` without a docstring of their own. Python 3.11 writes one from
    `inspect.signature` for each such class as it is created, which doubles what the class costs to import
    (0.8 ms against 0.45 ms for six fields, measured here); the quick commands create about seventy."""
    found = []
    for name in sorted(m for m in modules if m.startswith("lanectl.") and not m.endswith("__main__")):
        for cls in vars(importlib.import_module(name)).values():
            if inspect.isclass(cls) and cls.__module__ == name and dataclasses.is_dataclass(cls) and (
                    cls.__doc__ is None or cls.__doc__.startswith(cls.__name__ + "(")):
                found.append(f"{name}.{cls.__qualname__}")
    return found


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@pytest.fixture
def lane_project(project: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (project / "recipes" / "demo.yaml").write_text((REPO / "recipes" / "demo" / "stub.yaml").read_text()
                                                   .replace("id: demo-stub", "id: import-hygiene"))
    env = {"LANECTL_STATE_DIR": str(tmp_path / "state"), "LANECTL_CACHE_DIR": str(tmp_path / "cache")}
    return project, env


def test_help_imports_neither_the_engine_nor_the_recipes(project: Path) -> None:
    modules = imported("--help", cwd=project, env={})
    assert "lanectl.cli.app" in modules  # it ran the CLI, not only the interpreter
    assert modules & (NEVER | HELP) == set()


def test_version_is_answered_before_typer_is_imported(project: Path) -> None:
    assert imported("--version", cwd=project, env={}) & {"typer", "click", "lanectl.cli.app"} == set()


def test_a_group_help_and_completing_a_command_name_import_neither_the_engine_nor_the_recipes(project: Path):
    group_help = imported("watchdog", "--help", cwd=project, env={})
    completed = imported(cwd=project, env={"_LANECTL_COMPLETE": "complete_bash", "COMP_WORDS": "lanectl st",
                                           "COMP_CWORD": "1"})
    assert "lanectl.cli.app" in group_help and "typer" in completed  # they ran the CLI, not only the interpreter
    assert (group_help | completed) & (NEVER | HELP) == set()


@pytest.mark.docker
def test_status_imports_no_heavy_module_and_a_cached_catalog_no_yaml(lane_project) -> None:
    project, env = lane_project
    first = imported("status", cwd=project, env=env)
    assert "yaml" in first  # the first run validates the recipes: the check below can see the difference
    again = imported("status", cwd=project, env=env)
    assert again & (NEVER | CACHED_CATALOG | STATUS | PLAIN_OUTPUT) == set()
    assert undocumented_dataclasses(again) == [], "give each a docstring"


@pytest.mark.docker
def test_watchdog_check_imports_no_heavy_module(lane_project, tmp_path: Path) -> None:
    from lanectl.state.lanes import LaneStateStore

    project, env = lane_project
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    # The active lane's container does not exist: the pass observes it down, decides, and (disarmed,
    # as a fresh state is) acts on nothing, so everything a watching pass imports is imported.
    (tmp_path / "state").mkdir()
    LaneStateStore(tmp_path / "state" / "state.json").update(lambda s: s.with_active("demo-h1"))
    imported("validate", cwd=project, env=env)
    modules = imported("watchdog", "check", "--kernel-log", f"file:{kernel_log}", cwd=project, env=env)
    assert modules & (NEVER | CACHED_CATALOG | PLAIN_OUTPUT) == set()
    assert undocumented_dataclasses(modules) == [], "give each a docstring"
    assert {"lanectl.watchdog.runner", "lanectl.health.probe", "lanectl.dockerapi.engine_api"} <= modules  # it watched

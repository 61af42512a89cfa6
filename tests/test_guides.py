"""The guides (docs/guides/) run as written: the blocks each marks `<!-- runnable -->` run in order in one shell,
as a reader would type them, against the real Docker engine and lanectl's CPU stub engine.

Only the project's name and its host port are made unique (`lanectl init my-lanes` becomes `lanectl init
g-<hex> --port <free port>`), so that a run never meets another run's containers; state and lock folders are the
test's own. Blocks a guide does not mark (a GPU build, a root install) are read, not run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.lane_fixtures import free_port

REPO = Path(__file__).resolve().parent.parent
GUIDES = REPO / "docs" / "guides"
JM_FIXTURE = REPO / "tests" / "fixtures" / "jm"
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:sh|bash)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# Guides that read a vLLM release's source from the package index.
NETWORK = {"moving-the-vllm-pin.md"}
# What each guide's run must print, beyond exiting 0: the outcomes its prose describes.
PRINTED = {
    "moving-the-vllm-pin.md": ["pin check exited 1", "breaks build: vLLM 0.32.0 images need `vllm download-kernels`",
                               "ok: 4 lanes in 2 recipes (dsv41, dsv41-032, stub-a, stub-b)",
                               "dsv41-032 (recipes/dsv41.yaml, pinned to 0.32.0)"],
    "upgrading.md": ["ok: 2 lanes in 1 recipes (stub-a, stub-b)", "LANECTL_STATE_DIR="],
    "gate-and-release-note.md": ["gate exited 0", "verdict: PASS", "# Passed, not promoted: stub-b"],
    "first-lane.md": ["ok: 3 lanes in 2 recipes (dsv41, stub-a, stub-b)", "ok: stub-a is serving"],
    "switching-in-production.md": ["ok: stub-b is serving", "up exited 1",
                                   "rolled-back: stub-broken failed its health gate"],
    "watchdog.md": ["check exited 1", "none: healthy", "restarted 1x by the watchdog",
                    "lanectl_watchdog_restarts_total{lane=\"stub-a\"} 1",
                    "LANECTL_LOCK_DIR="],
}


def runnable(markdown: str) -> list[str]:
    return [match.group(1) for match in RUNNABLE.finditer(markdown)]


def guides() -> list[str]:
    return sorted(path.name for path in GUIDES.glob("*.md"))


def test_only_the_blocks_marked_runnable_are_run() -> None:
    text = ("# G\n\n```sh\nlanectl build h2-REF\n```\n\n<!-- runnable -->\n```sh\nlanectl validate\n```\n\n"
            "<!-- runnable -->\n```text\nnot a command\n```\n")
    assert runnable(text) == ["lanectl validate\n"]


@pytest.mark.parametrize("guide", guides())
def test_every_guide_has_runnable_commands_and_an_expectation(guide: str) -> None:
    assert runnable((GUIDES / guide).read_text()), f"{guide}: no block marked <!-- runnable -->"
    assert guide in PRINTED


@pytest.mark.docker
@pytest.mark.parametrize("guide", [pytest.param(guide, marks=[pytest.mark.network] if guide in NETWORK else [])
                                   for guide in guides()])
def test_a_guide_runs_as_written(guide: str, tmp_path: Path) -> None:
    name = f"g-{uuid.uuid4().hex[:8]}"
    script = "\n".join(runnable((GUIDES / guide).read_text()))
    script = script.replace("lanectl init my-lanes", f"lanectl init {name} --port {free_port()}")
    script = script.replace("my-lanes", name)
    shutil.copytree(JM_FIXTURE, tmp_path / "J-M-Recipes" / "recipes")
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "LANECTL_STATE_DIR": str(tmp_path / "state"), "LANECTL_LOCK_DIR": os.environ["LANECTL_LOCK_DIR"],
                "COLUMNS": "200"})
    try:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, f"{guide} stopped (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
        for expected in PRINTED[guide]:
            assert expected in result.stdout, f"{guide}: {expected!r} not printed:\n{result.stdout}"
    finally:
        _remove(name)


def _remove(name: str) -> None:
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=io.lanectl.recipe={name}"],
                                capture_output=True, text=True).stdout.split()
    if containers:
        subprocess.run(["docker", "rm", "-f", *containers], capture_output=True)
    images = subprocess.run(["docker", "images", "-q", f"lanectl/{name}"], capture_output=True, text=True).stdout
    if images.split():
        subprocess.run(["docker", "rmi", "-f", *sorted(set(images.split()))], capture_output=True)

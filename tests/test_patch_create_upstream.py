"""`lanectl patches check` on patches that create files, as a user runs it, against the real pinned
vLLM 0.31.0 sdist (marked `network`: downloaded once into the shared test cache)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "data" / "patches"
OPS = "vllm/models/deepseek_v41/nvidia/ops"


def patches_check(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cache = os.environ.get("LANECTL_TEST_CACHE", str(Path.home() / ".cache" / "lanectl-test"))
    env = {key: value for key, value in os.environ.items() if key != "LANECTL_RECIPES"}
    env.update({"COLUMNS": "200", "LANECTL_CACHE_DIR": cache})
    return run_cli("patches", "check", *args, cwd=project, env=env)


def project_with(tmp_path: Path, *fixtures: str) -> Path:
    project = tmp_path / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "patches" / "vllm").mkdir(parents=True)
    for name in fixtures:
        shutil.copy(FIXTURES / name, project / "patches" / "vllm" / name)
    return project


@pytest.mark.network
def test_a_patch_creating_a_file_the_release_lacks_reports_creates(tmp_path: Path) -> None:
    project = project_with(tmp_path, "create-probe.patch")

    text = patches_check(project)
    as_json = patches_check(project, "--json")

    assert (text.returncode, text.stdout) == (
        0,
        f"applies          vllm/create-probe.patch  (creates {OPS}/_lanectl_probe.py)  "
        "Add a probe module to the DeepSeek v4.1 NVIDIA ops\n",
    )
    [report] = json.loads(as_json.stdout)["data"]["patches"]
    assert (as_json.returncode, report["status"], report["targets"], report["files"]) == (
        0,
        "applies",
        [f"{OPS}/_lanectl_probe.py"],
        [{"path": f"{OPS}/_lanectl_probe.py", "status": "creates"}],
    )


@pytest.mark.network
def test_creating_a_file_the_release_has_conflicts_unless_the_content_is_the_same(tmp_path: Path) -> None:
    project = project_with(tmp_path, "create-existing-conflict.patch", "create-existing-same.patch")

    text = patches_check(project)
    as_json = patches_check(project, "--json")

    assert (text.returncode, text.stdout) == (
        1,
        "conflicts        vllm/create-existing-conflict.patch  "
        "Create the ops package marker (it already exists upstream)\n"
        f"  {OPS}/__init__.py: the patch creates this file, but it already exists with other content "
        "(2 lines; first difference at line 2); rebase the patch on what is there, or rename the new file\n"
        f"already-upstream vllm/create-existing-same.patch  ({OPS}/__init__.py exists with this content; "
        "nothing to do)  Create the ops package marker exactly as upstream has it\n",
    )
    files = {p["patch"]: p["files"] for p in json.loads(as_json.stdout)["data"]["patches"]}
    assert (as_json.returncode, files) == (
        1,
        {
            "vllm/create-existing-conflict.patch": [{"path": f"{OPS}/__init__.py", "status": "conflicts"}],
            "vllm/create-existing-same.patch": [{"path": f"{OPS}/__init__.py", "status": "already-upstream"}],
        },
    )

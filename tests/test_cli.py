"""The CLI as a user runs it: exact messages and exit codes, in this process (tests/cli_in_process.py); the
installed entry point's own contract is held by `lanectl_process` below and tests/test_installed_wheel.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli
from tests.conftest import REPO
from tests.test_recipe_validation import GOOD


def environment(env: dict[str, str] | None) -> dict[str, str]:
    import os

    return {**{key: value for key, value in os.environ.items() if key != "LANECTL_RECIPES"}, "COLUMNS": "200",
            **(env or {})}


def lanectl(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=environment(env))


def lanectl_process(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command's way in: `python -m lanectl`, its own process and exit status."""
    return subprocess.run([sys.executable, "-m", "lanectl", *args], cwd=cwd, capture_output=True, text=True,
                          env=environment(env), timeout=60)


def test_validate_ok(project, write_recipe):
    write_recipe(GOOD)
    result = lanectl("validate", cwd=project)
    assert (result.returncode, result.stdout) == (0, "ok: 2 lanes in 1 recipes (a, b)\n")


def test_validate_lists_every_problem_and_exits_2(project, write_recipe):
    write_recipe(GOOD.replace("template: stub-engine", "template: nope").replace("host: 18000", "host: 0"))
    result = lanectl_process("validate", cwd=project)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "recipes/r.yaml:5:15: defaults.image.template: no template images/nope/Dockerfile.j2; known templates: "
        "stub-engine, vllm",
        "recipes/r.yaml:12:33: defaults.engine.ports[0].host: Input should be greater than or equal to 1, got 0",
        "2 problem(s); nothing was built or started.",
    ]
    assert result.stdout == ""


def test_unknown_lane_exits_2_with_a_suggestion(project, write_recipe):
    write_recipe(GOOD.replace("  a: {}", "  h2-REF: {}"))
    result = lanectl("render", "h3-REF", cwd=project)
    assert (result.returncode, result.stderr) == (2, "lanectl: no lane 'h3-REF'; did you mean h2-REF?\n")


def test_recipes_folder_from_option_and_environment(project, write_recipe, tmp_path):
    write_recipe(GOOD)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert lanectl("--recipes", str(project / "recipes"), "validate", cwd=elsewhere).returncode == 0
    assert lanectl("validate", cwd=elsewhere, env={"LANECTL_RECIPES": str(project / "recipes")}).returncode == 0
    missing = lanectl("validate", cwd=elsewhere)
    assert missing.returncode == 2 and "no recipes folder at" in missing.stderr


def test_usage_error_exits_2(project):
    assert lanectl_process("build", cwd=project).returncode == 2
    assert lanectl("lanes", "--bogus", cwd=project).returncode == 2


def test_render_writes_the_context_and_changes_nothing_else(project, write_recipe, tmp_path):
    write_recipe(GOOD)
    out = tmp_path / "ctx"
    result = lanectl("render", "b", "--out", str(out), "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["lanectl"] == 1 and data["command"] == "render"
    rendered = data["data"]
    assert (out / "Dockerfile").read_text() == rendered["dockerfile"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(
        [item["path"] for item in rendered["context"]] + ["containers.json"])
    assert [c["name"] for c in rendered["containers"]] == ["b"]
    again = lanectl("render", "b", "--out", str(out), cwd=project)
    assert again.returncode == 2 and "is not empty" in again.stderr


def test_schema_is_json_schema_for_recipes():
    result = lanectl("schema", cwd=REPO)
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert "LanePartial" in schema["$defs"]
    assert schema["properties"]["schema"]["const"] == "lanectl/v1"


@pytest.mark.network
def test_patches_check_reports_each_patch_and_exit_codes(project, write_recipe):
    """Against the real pinned vLLM source (downloaded once into the shared test cache)."""
    import os

    cache = os.environ.get("LANECTL_TEST_CACHE", str(Path.home() / ".cache" / "lanectl-test"))
    ok = lanectl("patches", "check", "--json", cwd=project, env={"LANECTL_CACHE_DIR": cache})
    assert ok.returncode == 0, ok.stderr
    reports = json.loads(ok.stdout)["data"]["patches"]
    statuses = {p["patch"]: p["status"] for p in reports}
    assert statuses == {"stub-engine/0001-rejection-sampler-guard.patch": "applies",
                        "vllm/57711-splitkv-overlay.patch": "applies",
                        "vllm/60945-rejection-sampler-guard.patch": "applies"}
    overlay = next(p for p in reports if p["patch"] == "vllm/57711-splitkv-overlay.patch")
    assert {f["path"]: f["status"] for f in overlay["files"]} == {
        "vllm/envs.py": "applies",
        "vllm/models/deepseek_v41/nvidia/flash_mla_mega_attn.py": "applies",
        "vllm/models/deepseek_v41/nvidia/splitkv.py": "creates",
        "vllm/models/deepseek_v41/nvidia/ops/splitkv_combine.py": "creates",
    }
    sampler = project / "images/stub-engine/stubengine/rejection_sampler.py"
    patch = (project / "patches/stub-engine/0001-rejection-sampler-guard.patch").read_text()
    added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]
    source = sampler.read_text()
    sampler.write_text(source.replace("\n".join(removed), "\n".join(added)))
    upstream = lanectl("patches", "check", cwd=project, env={"LANECTL_CACHE_DIR": cache})
    assert upstream.returncode == 0
    import re

    assert re.search(r"^already-upstream +stub-engine/0001-rejection-sampler-guard.patch", upstream.stdout, re.M)
    sampler.write_text(source.replace(removed[0], removed[0] + "  # drifted"))
    conflict = lanectl("patches", "check", cwd=project, env={"LANECTL_CACHE_DIR": cache})
    assert conflict.returncode == 1
    assert "conflicts" in conflict.stdout and "@@" in conflict.stdout


def test_an_in_process_run_leaves_the_environment_folder_and_signal_handlers_as_they_were(project, write_recipe,
                                                                                         tmp_path):
    import os
    import signal

    write_recipe(GOOD)
    before = (dict(os.environ), os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_env = {"LANECTL_RECIPES": str(project / "recipes"), "FORCE_COLOR": "1", "TERM": "xterm-256color",
               "PATH": os.environ["PATH"]}
    assert run_cli("validate", cwd=elsewhere, env=run_env).returncode == 0
    assert run_cli("render", "nope", cwd=elsewhere, env=run_env).returncode == 2
    after = (dict(os.environ), os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
    assert after == before
    # Nor the consoles made for a run: text printed after it is coloured (or not) as this process's own would be.
    from lanectl.cli.app import err, out
    from lanectl.cli.rich_console import TerminalConsole

    assert out().is_terminal == err().is_terminal == TerminalConsole().is_terminal
    # The next run sees its own environment, not the last run's: no recipes folder here without the variable.
    missing = lanectl("validate", cwd=elsewhere)
    assert missing.returncode == 2 and "no recipes folder at" in missing.stderr

"""The low findings of the third hostile pass, through the real CLI: a null lane key, a file of tens of
thousands of lanes, `history -n -1`, and `watchdog status` counters."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from lanectl.recipe.yaml_source import MAX_NODES
from tests.cli_in_process import run_cli
from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD

RECIPE = textwrap.dedent(GOOD).lstrip("\n")


@pytest.mark.parametrize("key", ["null", "~", "Null"])
def test_a_null_lane_key_is_refused_not_named_none(project, key):
    text = RECIPE.replace("\n  b:", f"\n  {key}:")
    (project / "recipes" / "r.yaml").write_text(text)
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2 and "None" not in result.stdout + result.stderr
    assert ": lanes: a null key (`null:`, `~:` or nothing before the colon); give it a name, or quote it " \
           "('null') if you mean the word" in result.stderr


def test_a_quoted_null_is_a_name_like_any_other_text(project):
    (project / "recipes" / "r.yaml").write_text(RECIPE.replace("\n  b:", "\n  'null':"))
    result = lanectl("validate", cwd=project)
    assert (result.returncode, result.stdout) == (0, "ok: 2 lanes in 1 recipes (a, null)\n")


def test_a_file_of_80k_lanes_is_called_too_large_not_a_billion_laughs(project):
    lanes = "".join(f"  l{i}: {{}}\n" for i in range(80_000))
    (project / "recipes" / "r.yaml").write_text(RECIPE.split("lanes:")[0] + "lanes:\n" + lanes)
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2
    assert "billion laughs" not in result.stderr and "aliases" not in result.stderr
    assert (f"this value holds more than {MAX_NODES} YAML nodes, more than lanectl reads from one file; split it "
            "into several files") in result.stderr


def cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "COLUMNS": "200"})
    return run_cli(*args, cwd=Path.cwd(), env=env)


@pytest.mark.parametrize("count", ["-1", "0"])
def test_history_refuses_a_count_below_one(tmp_path: Path, count: str):
    result = cli("history", "-n", count, state=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "Invalid value for '-n'" in result.stderr


def test_watchdog_status_shows_counters_as_people_read_them(tmp_path: Path):
    (tmp_path / "watchdog.json").write_text(json.dumps(
        {"version": 1, "xid_total": {"94": 1, "31": 2, "119": 1}, "restarts_total": {"h2-REF": 3}}))
    (tmp_path / "watchdog.json").chmod(0o600)
    result = cli("watchdog", "status", state=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "restarts: 3 (h2-REF: 3); rollbacks: 0; Xid: 4 (31: 2, 94: 1, 119: 1) (hardware 0)" in (
        result.stdout.splitlines())
    assert "{" not in result.stdout

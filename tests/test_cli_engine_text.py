"""Text from outside lanectl (engine messages, log lines, operator reasons, paths) is printed as it is:
never parsed as rich markup (which would restyle it, drop it, or crash on `[/...]`) nor emoji codes.
Through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli
from tests.conftest import REPO

HOSTILE = "[/] [/bold] [core.py:700] [bold red]boom[/bold red] :fire: \\[x] [link=file:///etc/passwd]y[/link]"


def lanectl(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes"), "COLUMNS": "400",
                "TERM": "xterm-256color", "FORCE_COLOR": "1"})
    result = run_cli(*args, cwd=REPO, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def plain(text: str) -> str:
    """The output without the colour codes FORCE_COLOR adds."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


@pytest.mark.docker
def test_status_prints_a_lease_reason_verbatim(state: Path):
    assert lanectl("watchdog", "disarm", "--for", "1h", "--reason", HOSTILE, state=state).returncode == 0

    result = lanectl("status", state=state)
    status = lanectl("watchdog", "status", state=state)
    history = lanectl("history", state=state)

    assert result.returncode == 0, result.stderr
    assert f"({HOSTILE})" in plain(result.stdout)
    assert HOSTILE in plain(status.stdout)
    assert HOSTILE in plain(history.stdout)
    assert "🔥" not in result.stdout + status.stdout + history.stdout


@pytest.mark.docker
def test_doctor_prints_a_path_with_brackets_verbatim(tmp_path: Path):
    state = tmp_path / "[bold red]st[/]:fire:"
    state.mkdir(mode=0o700, parents=True)

    result = lanectl("doctor", state=state)
    as_json = lanectl("doctor", "--json", state=state)

    finding = next(f for f in json.loads(as_json.stdout)["data"]["findings"] if f["check"] == "state dir")
    assert f"state dir: {finding['detail']}" in plain(result.stdout)
    assert str(state) in plain(result.stdout)


def test_a_pass_failure_message_with_markup_is_printed_verbatim(state: Path, tmp_path: Path):
    # The reason of a failed pass quotes what it found: here a lane name written into state.json.
    (state / "state.json").write_text(json.dumps({"version": 1, "active": HOSTILE}))
    log = tmp_path / "kern.log"
    log.write_text("")

    result = lanectl("watchdog", "check", "--kernel-log", f"file:{log}", state=state)

    assert result.returncode == 2
    assert f"the active lane {HOSTILE} is not in the recipes" in plain(result.stdout)

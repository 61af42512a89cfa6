"""`lanectl status` and `lanectl watchdog status` read the same state.json and must say the same thing
about the watchdog: an expired maintenance lease means armed, whether or not a pass has re-armed it
in the file yet. Through the CLI, in-process (`status` asks the real Docker engine for the lanes)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lanectl.state.journal import utc_timestamp
from lanectl.state.paths import StateFiles
from tests.cli_in_process import run_cli
from tests.conftest import REPO


def lanectl(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes"), "COLUMNS": "200"})
    result = run_cli(*args, cwd=REPO, env=env)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def write_state_with_lease(state: Path, until: datetime) -> None:
    """As `watchdog disarm` leaves it: disarmed in the file, with a lease ending at `until`."""
    lease = {"until": utc_timestamp(until), "reason": "bench", "by": "op@box"}
    StateFiles(state).lanes.write_text(json.dumps({"version": 1, "active": None, "known_good": [],
                                                  "watchdog_armed": False, "watchdog_lease": lease}))


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


@pytest.mark.docker
@pytest.mark.parametrize(("lease_ends", "armed"), [(-timedelta(minutes=5), True), (timedelta(hours=1), False)],
                         ids=["expired-lease", "live-lease"])
def test_status_and_watchdog_status_agree_on_the_arm_state(state: Path, lease_ends: timedelta, armed: bool):
    write_state_with_lease(state, datetime.now(UTC) + lease_ends)
    before = StateFiles(state).lanes.read_bytes()

    status = json.loads(lanectl("status", "--json", state=state).stdout)["data"]["watchdog"]
    watchdog = json.loads(lanectl("watchdog", "status", "--json", state=state).stdout)["data"]
    status_text = lanectl("status", state=state).stdout
    watchdog_text = lanectl("watchdog", "status", state=state).stdout

    assert status["armed"] is watchdog["armed"] is armed
    assert status["lease"] == watchdog["lease"]
    assert status["lease"]["expired"] is armed
    shown = "watchdog: armed;" if armed else "watchdog: disarmed;"
    assert [line for line in status_text.splitlines() if line.startswith("watchdog: ")][0].startswith(shown)
    assert watchdog_text.splitlines()[0].startswith(shown)
    assert StateFiles(state).lanes.read_bytes() == before, "both only read the state"

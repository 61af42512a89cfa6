"""The Docker engine restarted between two lanectl commands (a host reboot, a dockerd upgrade).

Restarts the real dockerd of this machine, as CI runs it (scripts/setup-host.sh): root only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from tests.lane_fixtures import LaneProject, make_lane_project, remove_everything

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dockerd") is None,
                       reason="restarting the engine needs root and a dockerd this test may restart"),
]


def restart_dockerd() -> None:
    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    assert len(pids) == 1, f"expected one dockerd, found {pids}"
    subprocess.run(["kill", "-TERM", pids[0]], check=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "dockerd did not stop"
        time.sleep(0.2)
    environment = dict(os.environ)  # as scripts/setup-host.sh starts it
    with open("/var/log/lanectl-dockerd.log", "ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, env=environment, start_new_session=True)
    while True:
        if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            return
        assert time.monotonic() < deadline + 60, "dockerd did not come back"
        time.sleep(0.3)


@dataclass
class Restarted:
    """Two lane projects on the one engine, restarted once: `lanes` with demo-h1 then demo-h2 up and nothing
    watching, `watched` with demo-h1 up and `watchdog run` watching it through the restart."""

    lanes: LaneProject
    state: Path
    watched: LaneProject
    watched_state: Path
    run: subprocess.Popen[str]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory):
    # One restart serves both tests: it takes the engine down for every group's containers, so the tests run
    # alone, after the others (the solo group), and each restart is time no other test can use.
    base = tmp_path_factory.mktemp("engine-restart")
    lanes = make_lane_project(base / "a", companions=False)  # the engine's restart is the claim, not the roles
    watched = make_lane_project(base / "b", companions=False)
    state, watched_state = base / "a" / "state", base / "b" / "state"
    kernel_log = base / "kern.log"
    kernel_log.write_text("")
    run = None
    try:
        lanes.invoke("build", "demo-h1", "demo-h2", state=state, check=True, timeout=600)
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        lanes.invoke("up", "demo-h2", "--no-gpu", state=state, check=True)
        watched.invoke("build", "demo-h1", state=watched_state, check=True, timeout=600)
        watched.invoke("up", "demo-h1", "--no-gpu", state=watched_state, check=True)
        run = subprocess.Popen([sys.executable, "-m", "lanectl", "watchdog", "run", "--kernel-log",
                                f"file:{kernel_log}"], cwd=watched.root, env=watched.env(watched_state),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        restart_dockerd()  # the engine stops the lanes' containers (no restart policy)
        yield Restarted(lanes, state, watched, watched_state, run)
    finally:
        if run is not None:
            run.terminate()
            run.communicate(timeout=30)
        docker.from_env().ping()
        remove_everything(lanes)
        remove_everything(watched)


def test_lanes_survive_an_engine_restart_between_commands(restarted: Restarted):
    lanes, state = restarted.lanes, restarted.state
    data = json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]
    row = next(r for r in data["lanes"] if r["lane"] == "demo-h2")
    assert row["active"] and row["health"] is None
    assert {c["status"] for c in row["containers"]} == {"exited"}, "no restart policy: the engine stopped it"

    again = lanes.invoke("up", "demo-h2", "--no-gpu", state=state)
    assert again.returncode == 0, again.stderr
    assert "start " + lanes.container("demo-h2") in again.stderr
    back = lanes.invoke("rollback", "--no-gpu", state=state)
    assert back.returncode == 0, back.stderr
    data = json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]
    assert next(r for r in data["lanes"] if r["lane"] == "demo-h1")["health"] == "ok"


def test_watchdog_run_survives_an_engine_restart_and_brings_the_lane_back(restarted: Restarted):
    lanes, state, run = restarted.watched, restarted.watched_state, restarted.run
    # restarts_total counts a restart when it is decided (so one killed midway is not counted twice); the
    # restart's outcome is written once it ended, as last_action.
    deadline = time.monotonic() + 90
    action = None
    while time.monotonic() < deadline and action is None:
        time.sleep(0.5)
        status = lanes.invoke("watchdog", "status", "--json", state=state)
        if status.returncode == 0:
            action = json.loads(status.stdout)["data"]["last_action"]
    assert run.poll() is None, "the watchdog must outlive the engine restart"
    assert action is not None, "the watchdog took no action after the engine restart"
    assert (action["action"], action["outcome"]) == ("restart", "demo-h1 restarted and passed its gate"), action
    data = json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]
    assert next(r for r in data["lanes"] if r["lane"] == "demo-h1")["health"] == "ok"

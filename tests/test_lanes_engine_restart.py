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

import docker
import pytest

from tests.lane_fixtures import make_lane_project, remove_everything

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


def test_lanes_survive_an_engine_restart_between_commands(tmp_path):
    lanes = make_lane_project(tmp_path, companions=False)  # the engine's restart is the claim, not the roles
    state = tmp_path / "state"
    try:
        lanes.invoke("build", "demo-h1", "demo-h2", state=state, check=True, timeout=600)
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        lanes.invoke("up", "demo-h2", "--no-gpu", state=state, check=True)
        restart_dockerd()
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
    finally:
        docker.from_env().ping()
        remove_everything(lanes)


def test_watchdog_run_survives_an_engine_restart_and_brings_the_lane_back(tmp_path):
    lanes = make_lane_project(tmp_path, companions=False)  # the engine's restart is the claim, not the roles
    state = tmp_path / "state"
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    run = None
    try:
        lanes.invoke("build", "demo-h1", state=state, check=True, timeout=600)
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        run = subprocess.Popen([sys.executable, "-m", "lanectl", "watchdog", "run", "--kernel-log",
                                f"file:{kernel_log}"], cwd=lanes.root, env=lanes.env(state),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        restart_dockerd()  # the engine stops the lane's containers (no restart policy)
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
    finally:
        if run is not None:
            run.terminate()
            run.communicate(timeout=30)
        docker.from_env().ping()
        remove_everything(lanes)

"""Lanes on the real Docker engine with stub-engine images: switch, gate failures, rollback, crash safety.

Every test has its own state dir; containers are removed between tests, images once at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import httpx
import pytest

from tests.lane_fixtures import LaneProject, make_lane_project, remove_containers, remove_everything

pytestmark = pytest.mark.docker

LANES = ["demo-h1", "demo-h2", "t-spare", "t-crash", "t-unhealthy", "t-autotune", "t-hang"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("lanes"))
    state = tmp_path_factory.mktemp("build-state")
    project.invoke("build", *LANES, state=state, check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    yield tmp_path / "state"
    remove_containers(lanes)


def status(lanes: LaneProject, state: Path) -> dict:
    result = lanes.invoke("status", "--json", state=state, check=True)
    return json.loads(result.stdout)["data"]


def lane_row(data: dict, lane: str) -> dict:
    return next(row for row in data["lanes"] if row["lane"] == lane)


def serving(lanes: LaneProject, data: dict, lane: str) -> bool:
    row = lane_row(data, lane)
    return row["active"] and row["health"] == "ok" and all(c["status"] == "running" for c in row["containers"]) \
        and len(row["containers"]) == 2


def generate(lanes: LaneProject) -> str:
    recipe = (lanes.root / "recipes" / "lanes.yaml").read_text()
    port = int(recipe.split("host: ", 1)[1].split(",", 1)[0])
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                       json={"model": "demo-model", "prompt": "hi", "max_tokens": 3})
    reply.raise_for_status()
    return reply.json()["choices"][0]["text"]


def test_up_switch_noop_and_rollback(lanes, state):
    first = lanes.invoke("up", "demo-h1", "--no-gpu", state=state)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ok: demo-h1 is serving")
    second = lanes.invoke("up", "demo-h2", "--no-gpu", state=state)
    assert second.returncode == 0, second.stderr
    stderr_steps = [line for line in second.stderr.splitlines()
                    if line.startswith(("✓ stop", "✓ create", "✓ start"))]
    order = [line.split()[2] for line in stderr_steps[:4]]
    assert order == [lanes.container("demo-h1", "rtx"), lanes.container("demo-h1"), lanes.container("demo-h2"),
                     lanes.container("demo-h2")], "companion stops before primary; primary starts first"
    data = status(lanes, state)
    assert serving(lanes, data, "demo-h2") and not lane_row(data, "demo-h1")["active"]
    assert [c["status"] for c in lane_row(data, "demo-h1")["containers"]] == ["exited", "exited"], "kept for rollback"
    assert data["watchdog"]["armed"] and data["watchdog"]["lease"] is None
    assert generate(lanes)

    again = lanes.invoke("up", "demo-h2", "--no-gpu", state=state)
    assert (again.returncode, again.stdout) == (0, "noop: demo-h2 is already active and healthy; nothing to do\n")

    back = lanes.invoke("rollback", "--no-gpu", state=state)
    assert back.returncode == 0, back.stderr
    assert "start " + lanes.container("demo-h1") in back.stderr and "create " + lanes.container("demo-h1") \
        not in back.stderr, "a rollback to kept containers is a start, not a create"
    data = status(lanes, state)
    assert serving(lanes, data, "demo-h1")
    assert data["known_good"] == ["demo-h2", "demo-h1"]

    history = json.loads(lanes.invoke("history", "--json", state=state, check=True).stdout)["data"]["records"]
    outcomes = [r["result"] for r in history if r["kind"] == "outcome"]
    assert outcomes == ["ok", "ok", "ok"]
    assert all(r["who"] and r["ts"] for r in history)


@pytest.mark.parametrize(("bad_lane", "check"), [
    ("t-crash", "container-exited|fatal-engine-line"),
    ("t-unhealthy", "startup-budget"),
    ("t-autotune", "startup-stall"),
    ("t-hang", "generation"),
])
def test_a_failing_gate_brings_the_previous_lane_back(lanes, state, bad_lane, check):
    import re

    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.invoke("up", bad_lane, "--no-gpu", state=state)
    assert result.returncode == 1
    assert re.search(rf"failed its health gate \(({check})\)", result.stdout), result.stdout
    assert "Rolled back: demo-h1 is serving again" in result.stdout
    gate_lines = [line for line in result.stderr.splitlines() if f"hold {bad_lane} to its health gate" in line]
    assert len(gate_lines) == 1 and gate_lines[0].startswith("✗ ") and "; failed " in gate_lines[0], result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("✓") and "failed" in line]
    data = status(lanes, state)
    assert serving(lanes, data, "demo-h1")
    assert all(c["status"] != "running" for c in lane_row(data, bad_lane)["containers"])
    assert bad_lane not in data["known_good"]
    assert generate(lanes)
    records = json.loads(lanes.invoke("history", "--json", state=state, check=True).stdout)["data"]["records"]
    diagnostics = [r for r in records if r["kind"] == "diagnostics"]
    assert diagnostics and diagnostics[-1]["lane"] == bad_lane and diagnostics[-1]["log_tail"]
    assert [r["result"] for r in records if r["kind"] == "outcome"][-1] == "rolled-back"


def test_no_rollback_leaves_the_failed_lane_stopped_and_says_so(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.invoke("up", "t-crash", "--no-gpu", "--no-rollback", state=state)
    assert result.returncode == 1
    assert "is stopped for debugging; nothing else was started (--no-rollback)" in result.stdout
    data = status(lanes, state)
    assert data["active"] is None
    assert not any(c["status"] == "running" for row in data["lanes"] for c in row["containers"])


def test_up_of_an_unbuilt_lane_says_to_build_it_and_changes_nothing(lanes, state):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    try:
        recipe.write_text(original.replace('STUB_DECODE_TOKENS_PER_S: "100"', 'STUB_DECODE_TOKENS_PER_S: "101"'))
        result = lanes.invoke("up", "demo-h1", "--no-gpu", state=state)
        assert result.returncode == 1
        assert "is not built; run `lanectl build demo-h1` first" in result.stderr
        ours = {"label": f"io.lanectl.recipe={lanes.recipe_id}"}
        assert docker.from_env().containers.list(all=True, filters=ours) == []
    finally:
        recipe.write_text(original)


def test_rollback_recreates_containers_removed_behind_lanectls_back(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    lanes.invoke("up", "demo-h2", "--no-gpu", state=state, check=True)
    client = docker.from_env()
    for role in ("primary", "rtx"):
        client.containers.get(lanes.container("demo-h1", role)).remove(force=True)
    result = lanes.invoke("rollback", "--no-gpu", state=state)
    assert result.returncode == 0, result.stderr
    assert "create " + lanes.container("demo-h1") in result.stderr
    assert serving(lanes, status(lanes, state), "demo-h1")


def test_the_active_lane_removed_behind_lanectls_back_is_recreated_by_up(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    docker.from_env().containers.get(lanes.container("demo-h1")).remove(force=True)
    assert not lane_row(status(lanes, state), "demo-h1")["health"]
    result = lanes.invoke("up", "demo-h1", "--no-gpu", state=state)
    assert result.returncode == 0, result.stderr
    assert serving(lanes, status(lanes, state), "demo-h1")


def test_two_ups_at_once_the_second_waits_then_gives_up_naming_the_holder(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    slow = subprocess.Popen([sys.executable, "-m", "lanectl", "up", "t-unhealthy", "--no-gpu"], cwd=lanes.root,
                            env=lanes.env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        locks = lanes.root / "engine-lock"
        while not list(locks.glob("engine-*.lock.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = lanes.invoke("up", "demo-h2", "--no-gpu", "--lock-wait", "1s", state=state)
        assert second.returncode == 1
        import re

        assert re.search(rf"locked by pid {slow.pid} \(lanectl up t-unhealthy\) since \d\d:\d\d:\d\d", second.stderr), \
            second.stderr
    finally:
        slow.wait(timeout=120)
    assert slow.returncode == 1
    assert serving(lanes, status(lanes, state), "demo-h1")


# Every step of every kind of switch is killed in tests/test_switch_execute.py (the in-memory engine); here, on
# Docker, the two moments that matter most: after both old containers stopped (nothing serves), and after the new
# primary started (the reconcile must gate it, and start the companion the killed run had not).
KILLED_AFTER = (3, 5)


@pytest.mark.parametrize("crash_after", KILLED_AFTER)
def test_kill_9_mid_switch_is_reconciled_by_the_next_command(lanes, state, crash_after):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    killed = lanes.cli("up", "demo-h2", "--no-gpu", state=state,
                       extra_env={"LANECTL_TEST_CRASH_AFTER_STEP": str(crash_after)})
    assert killed.returncode == -signal.SIGKILL
    data = status(lanes, state)
    assert data["unfinished_switch"] is not None and data["unfinished_switch"]["to"] == "demo-h2"
    assert len(data["unfinished_switch"]["done_steps"]) == crash_after

    after = lanes.invoke("up", "demo-h2", "--no-gpu", state=state)
    assert after.returncode == 0, after.stderr
    assert "found an unfinished up (demo-h1 -> demo-h2)" in after.stderr
    data = status(lanes, state)
    assert data["unfinished_switch"] is None
    assert serving(lanes, data, "demo-h2")
    assert lanes.invoke("rollback", "--no-gpu", state=state).returncode == 0, "the way back must still be there"
    assert serving(lanes, status(lanes, state), "demo-h1")


def test_dry_run_prints_the_plan_and_changes_nothing(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    before = status(lanes, state)
    result = lanes.invoke("up", "demo-h2", "--dry-run", state=state)
    assert result.returncode == 0
    assert result.stdout.splitlines()[1:4] == [
        f"would stop {lanes.container('demo-h1', 'rtx')} (rtx of demo-h1), allowing 18 s to exit",
        f"would stop {lanes.container('demo-h1')} (primary of demo-h1), allowing 18 s to exit",
        f"would create {lanes.container('demo-h2')} (primary of demo-h2)",
    ]
    after = status(lanes, state)
    for data in (before, after):
        # Other projects' containers on a shared engine come and go meanwhile; this project's must not.
        data["unknown_containers"] = [n for n in data["unknown_containers"] if n.startswith(lanes.prefix)]
        for row in data["lanes"]:
            for c in row["containers"]:
                c.pop("uptime_seconds")
    assert before == after


def test_gpu_lane_on_a_host_without_nvidia_runtime_leaves_nothing_behind(lanes, state):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    try:
        recipe.write_text(original.replace("  t-hang:\n", "  t-gpu:\n    engine:\n      gpus: {device_ids: [\"0\"]}\n"
                                                          "  t-hang:\n"))
        lanes.invoke("build", "t-gpu", state=state, check=True)
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        result = lanes.invoke("up", "t-gpu", state=state)
        assert result.returncode == 1
        assert "no NVIDIA container runtime" in result.stdout and "--no-gpu" in result.stdout
        assert "Rolled back: demo-h1 is serving again" in result.stdout
        client = docker.from_env()
        assert not client.containers.list(all=True, filters={"name": lanes.container("t-gpu")})
        assert serving(lanes, status(lanes, state), "demo-h1")
    finally:
        recipe.write_text(original)


def test_gpu_request_is_on_the_created_container(lanes, state):
    """The request itself, checked on the container's config (this host has no GPU to start it on)."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.image.containers import plan_containers
    from lanectl.image.render import plan_image
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    lane = load_catalog(Project.locate(lanes.root / "recipes")).lane("demo-h1")
    spec = plan_containers(lane, plan_image(lane))[0]
    from dataclasses import replace

    spec = replace(spec, name=spec.name + "-gpucheck", gpus={"device_ids": ["0", "1"]})
    engine = ContainerEngine()
    engine.create(spec, with_gpus=True, environ={})
    try:
        requests = engine.container(spec.name).device_requests
        assert [(r["DeviceIDs"], r["Capabilities"]) for r in requests] == [(["0", "1"], [["gpu"]])]
    finally:
        engine.remove(spec.name)


def test_logs_down_and_doctor(lanes, state):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    logs = lanes.invoke("logs", "demo-h1", state=state, check=True)
    assert "Application startup complete" in logs.stdout
    rtx = lanes.invoke("logs", "demo-h1", "--role", "rtx", "--since", "10m", state=state, check=True)
    assert "demo-model-rtx" in rtx.stdout
    bad_role = lanes.invoke("logs", "demo-h1", "--role", "gpu9", state=state)
    assert bad_role.returncode == 2 and "has no role 'gpu9'" in bad_role.stderr
    down = lanes.invoke("down", state=state)
    assert down.returncode == 0 and "demo-h1 stopped" in down.stdout
    assert status(lanes, state)["active"] is None
    doctor = json.loads(lanes.invoke("doctor", "--json", state=state).stdout)["data"]["findings"]
    assert {f["check"] for f in doctor} >= {"docker engine", "nvidia runtime", "gpus", "state dir", "cron"}
    assert next(f for f in doctor if f["check"] == "docker engine")["severity"] == "ok"


def test_stopped_containers_of_only_the_last_few_lanes_are_kept(lanes, state):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    try:
        recipe.write_text(original.replace("keep_stopped_lanes: 3", "keep_stopped_lanes: 1"))
        for lane in ("demo-h1", "demo-h2", "t-spare"):
            lanes.invoke("up", lane, "--no-gpu", state=state, check=True)
        data = status(lanes, state)
        assert lane_row(data, "demo-h1")["containers"] == [], "older than the last lane kept"
        assert [c["status"] for c in lane_row(data, "demo-h2")["containers"]] == ["exited", "exited"]
        assert serving(lanes, data, "t-spare")
        images = {tag for image in docker.from_env().images.list(
            filters={"label": f"io.lanectl.recipe={lanes.recipe_id}"}) for tag in image.tags}
        assert lane_row(data, "demo-h1")["image"] in images, "images are never pruned"
    finally:
        recipe.write_text(original)

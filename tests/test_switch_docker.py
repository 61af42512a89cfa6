"""The switch on the real engine, where only Docker can show it: a recipe change reaches the containers (docker
inspect), --dry-run is what `up` journals, containers lanectl did not make are left alone, one lock per engine,
and Ctrl-C or SIGTERM at any step leaves a serving lane or says that none serves.

The demo recipe under a unique id (tests/lane_fixtures.py); lanes built once; containers removed after each test.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest

from tests.lane_fixtures import (
    TEST_STOP_TIMEOUT_SECONDS,
    LaneProject,
    free_port,
    make_lane_project,
    remove_container,
    remove_containers,
    remove_everything,
)

pytestmark = pytest.mark.docker

LANES = ["demo-h1", "demo-h2", "t-slow"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("switch"))
    project.invoke("build", *LANES, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    yield tmp_path / "state"
    recipe.write_text(original)
    client = docker.from_env()
    # Filtered by the engine, not listed whole: the SDK inspects every container it lists, and another group's
    # container removed in between fails the listing (404).
    for prefix in (lanes.prefix, f"hand-{lanes.prefix}"):
        for container in client.containers.list(all=True, filters={"name": f"^{prefix}"}):
            remove_container(client, container.id)
    remove_containers(lanes)


def cli(lanes: LaneProject, state: Path, *args: str, code: int | None = 0, **env: str):
    # The test hooks that kill or signal the command act on its process: those runs are the installed command's.
    own_process = any(name.startswith("LANECTL_TEST_") for name in env)
    result = (lanes.cli if own_process else lanes.invoke)(*args, state=state, extra_env=env or None, timeout=300)
    if code is not None:
        assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def status(lanes: LaneProject, state: Path) -> dict:
    return json.loads(cli(lanes, state, "status", "--json").stdout)["data"]


def row(data: dict, lane: str) -> dict:
    return next(r for r in data["lanes"] if r["lane"] == lane)


def inspect(lanes: LaneProject, lane: str, role: str = "primary") -> dict:
    return docker.from_env().api.inspect_container(lanes.container(lane, role))


def running(lanes: LaneProject) -> set[str]:
    client = docker.from_env()
    return {c.name for c in client.containers.list(filters={"label": f"io.lanectl.recipe={lanes.recipe_id}"})}


def serve_flags_as_they_run(lanes: LaneProject, lane: str) -> str:
    """The lane's serve flags with the --shutdown-timeout they run with, as a recipe value: given explicitly beside a
    changed stop timeout, they keep the image's CMD as it is (lanectl renders the flag from the stop timeout
    otherwise, and a changed CMD is a new build)."""
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    return json.dumps(load_catalog(Project.locate(lanes.root / "recipes")).lane(lane).spec.engine.args)


def journal_records(state: Path) -> list[dict]:
    """The journal's records as written so far (a line being written is not one yet)."""
    journal = state / "journal.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def journaled_steps(lanes: LaneProject, state: Path) -> list[list[str]]:
    """The steps of each switch in the journal, in order."""
    records = json.loads(cli(lanes, state, "history", "-n", "1000", "--json").stdout)["data"]["records"]
    switches: dict[str, list[str]] = {}
    for record in records:
        if record["kind"] == "intent":
            switches[record["switch"]] = []
        elif record["kind"] == "step":
            switches[record["switch"]].append(record["step"])
    return list(switches.values())


def test_every_container_field_of_a_changed_recipe_reaches_the_containers_and_status_and_dry_run_name_it(lanes, state):
    port, volume = free_port(), f"lt-cache-{uuid.uuid4().hex[:8]}"
    secret = {"LT_SECRET": "first-value"}
    cli(lanes, state, "up", "demo-h1", "--no-gpu", **secret)
    before = inspect(lanes, "demo-h1")
    flags = serve_flags_as_they_run(lanes, "demo-h1")
    lanes.edit_lane("demo-h1", f"""    engine:
      args: {flags}
      ports: [{{container: 8000, host: {port}, host_ip: 127.0.0.2}}]
      volumes: [{{volume: {volume}, target: /cache}}]
      secret_env: [LT_SECRET]
      shm_size: 96m
      ipc: private
      user: "0:0"
      stop_timeout_seconds: 40
    companions:
      rtx:
        engine:
          env: {{LT_RTX: "1"}}
""")
    try:
        drift = {c["role"]: c["drift"] for c in row(status(lanes, state), "demo-h1")["containers"]}
        assert [d.split(" ")[0] for d in drift["primary"]] == ["secret_env", "ports", "volumes", "shm_size", "ipc",
                                                                "user", "stop_timeout_seconds"], drift
        assert drift["rtx"] == ["env +LT_RTX"]
        dry = json.loads(cli(lanes, state, "up", "demo-h1", "--no-gpu", "--dry-run", "--json", **secret).stdout)
        plan_text = "\n".join(dry["data"]["steps"])
        assert f"127.0.0.2:{port}->8000/tcp" in plan_text and "shm_size none → 96m" in plan_text
        assert "first-value" not in json.dumps(dry), "a secret's value is never shown"
        up = cli(lanes, state, "up", "demo-h1", "--no-gpu", **secret)
        assert up.stdout.startswith("ok: demo-h1 is serving")
        assert journaled_steps(lanes, state)[-1] == dry["data"]["keys"], "--dry-run is what up ran"

        after = inspect(lanes, "demo-h1")
        assert after["Id"] != before["Id"], "a new container, not the same old one"
        host = after["HostConfig"]
        assert host["PortBindings"]["8000/tcp"] == [{"HostIp": "127.0.0.2", "HostPort": str(port)}]
        assert any(m["Name"] == volume and m["Destination"] == "/cache" for m in after["Mounts"])
        assert "LT_SECRET=first-value" in after["Config"]["Env"]
        assert (host["ShmSize"], host["IpcMode"], after["Config"]["User"], after["Config"]["StopTimeout"]) == (
            96 * 2**20, "private", "0:0", 40)
        assert "first-value" not in json.dumps(after["Config"]["Labels"])
        assert "LT_RTX=1" in inspect(lanes, "demo-h1", "rtx")["Config"]["Env"]
        assert all(c["drift"] == [] for c in row(status(lanes, state), "demo-h1")["containers"])
        assert not [n for n in docker.from_env().containers.list(all=True, filters={"name": lanes.prefix})
                    if ".was-" in n.name
                    and n.name.startswith(lanes.prefix)], "the containers set aside are gone once it passed"

        changed = cli(lanes, state, "up", "demo-h1", "--no-gpu", LT_SECRET="second-value")
        assert "secret_env LT_SECRET (value)" in changed.stderr and "second-value" not in changed.stderr
        assert "LT_SECRET=second-value" in inspect(lanes, "demo-h1")["Config"]["Env"]
        journal = (state / "journal.jsonl").read_text()
        assert "first-value" not in journal and "second-value" not in journal
    finally:
        remove_containers(lanes)
        docker.from_env().volumes.get(volume).remove(force=True)


def test_a_kept_stopped_lane_whose_recipe_changed_is_recreated_when_it_comes_back(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    cli(lanes, state, "up", "demo-h2", "--no-gpu")
    flags = serve_flags_as_they_run(lanes, "demo-h1")
    lanes.edit_lane("demo-h1", f"    engine:\n      args: {flags}\n      stop_timeout_seconds: 40\n")
    assert row(status(lanes, state), "demo-h1")["containers"][0]["drift"] == ["stop_timeout_seconds 18 → 40"]
    back = cli(lanes, state, "rollback", "--no-gpu")
    assert f"create {lanes.container('demo-h1')} (primary of demo-h1) (recreated: stop_timeout_seconds 18 → 40)" \
        in back.stderr
    assert inspect(lanes, "demo-h1")["Config"]["StopTimeout"] == 40


def test_a_lane_started_without_gpus_is_said_to_be_so_once_not_reported_as_drift(lanes, state):
    """The demo's `up --no-gpu` of a recipe that asks for GPUs: status says the lane runs without them, once."""
    lanes.edit_lane("demo-h1", '    engine:\n      gpus: {device_ids: ["0"]}\n'
                               '    companions:\n      rtx:\n        engine:\n          gpus: {device_ids: ["1"]}\n')
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    lane = row(status(lanes, state), "demo-h1")
    assert lane["without_gpus"] is True
    assert [c["drift"] for c in lane["containers"]] == [[], []]
    text = cli(lanes, state, "status").stdout
    assert "differs from the recipe" not in text, text
    assert text.count("runs without GPUs (started with --no-gpu)") == 1, text


def test_a_dry_run_without_an_unfinished_switch_says_reconcile_null(lanes, state):
    data = json.loads(cli(lanes, state, "up", "demo-h1", "--no-gpu", "--dry-run", "--json").stdout)["data"]
    assert "reconcile" in data and data["reconcile"] is None
    assert data["lane"] == "demo-h1" and data["keys"]


def test_a_rebuild_under_the_same_tag_reaches_the_containers(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    old_image = inspect(lanes, "demo-h1")["Image"]
    cli(lanes, state, "build", "demo-h1", "--no-cache")
    primary = row(status(lanes, state), "demo-h1")["containers"][0]
    assert not primary["current_build"] and primary["drift"][0].startswith("image ")
    assert cli(lanes, state, "up", "demo-h1", "--no-gpu").stdout.startswith("ok: demo-h1 is serving")
    assert inspect(lanes, "demo-h1")["Image"] != old_image


def test_a_recreate_of_the_serving_lane_that_fails_its_gate_puts_the_old_containers_back(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    before = inspect(lanes, "demo-h1")["Id"]
    lanes.edit_lane("demo-h1", '    engine:\n      env: {STUB_FAULT: crash_on_start}\n      user: "0:0"\n')
    # A container-level change (user) beside one that breaks the engine (env is baked into a new build).
    cli(lanes, state, "build", "demo-h1")
    failed = cli(lanes, state, "up", "demo-h1", "--no-gpu", code=1)
    assert "Rolled back: demo-h1 is serving again" in failed.stdout, failed.stdout
    assert inspect(lanes, "demo-h1")["Id"] == before, "the very container that served before"
    assert row(status(lanes, state), "demo-h1")["health"] == "ok"


def test_a_lane_serves_only_once_its_companion_does_and_a_companion_that_dies_starting_fails_the_gate(lanes, state):
    """The companion is its own engine: `up` said "ok" while it still loaded, and the next switch found it unable
    to sleep. A companion loading 6 s longer than its primary is waited for; one that dies starting rolls the switch
    back."""
    import httpx

    slow = '    companions:\n      rtx:\n        engine:\n          env: {STUB_LOAD_SECONDS: "7"}\n'
    lanes.edit_lane("demo-h1", slow)
    recipe = lanes.root / "recipes" / "lanes.yaml"
    text = recipe.read_text()
    h2 = text.index("\n  demo-h2:\n")
    block = "    companions:\n      rtx:\n        engine:\n"
    at = text.index(block, h2) + len(block)  # demo-h2 has its own companion block, for its port
    recipe.write_text(text[:at] + "          env: {STUB_FAULT: crash_on_start}\n" + text[at:])
    up = cli(lanes, state, "up", "demo-h1", "--no-gpu")
    assert up.stdout.startswith("ok: demo-h1 is serving"), up.stdout
    rtx = inspect(lanes, "demo-h1", "rtx")["HostConfig"]["PortBindings"]["8001/tcp"][0]
    assert httpx.get(f"http://127.0.0.1:{rtx['HostPort']}/health", timeout=5).status_code == 200, \
        "the companion serves as soon as up says the lane does"

    failed = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=1)
    assert "demo-h2 failed its health gate (fatal-engine-line): rtx: the engine logged a fatal line: " in \
        failed.stdout + failed.stderr, failed.stdout + failed.stderr
    assert "Rolled back: demo-h1 is serving again" in failed.stdout, failed.stdout
    assert lanes.container("demo-h2", "rtx") not in running(lanes)
    assert row(status(lanes, state), "demo-h1")["health"] == "ok"


# -- recipes that no longer load ---------------------------------------------------------------------------------

# The other ways a recipe breaks (a template, a file that no longer validates) are in tests/test_lanes_from_labels.py,
# on the engine in memory; here the real engine's listing, labels, stop timeouts and removal.
def test_a_lane_whose_recipe_file_is_deleted_after_up_is_seen_and_stopped_from_its_labels(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    (lanes.root / "recipes" / "lanes.yaml").unlink()  # the fixture writes it back
    lane = row(status(lanes, state), "demo-h1")
    assert lane["from_labels"] and lane["active"] and lane["recipe"] == lanes.recipe_id
    assert lane["health"] == "ok", "vLLM's /health on the port its primary was created with"
    assert [(c["role"], c["status"]) for c in lane["containers"]] == [("primary", "running"), ("rtx", "running")]
    planned = cli(lanes, state, "down", "--dry-run").stdout
    assert f"would stop {lanes.container('demo-h1', 'rtx')} (rtx of demo-h1), allowing {TEST_STOP_TIMEOUT_SECONDS} s" \
           in planned, planned
    down = json.loads(cli(lanes, state, "down", "--json").stdout)["data"]
    assert down["result"] == "ok" and down["steps"] == [
        f"stop:{lanes.container('demo-h1', 'rtx')}", f"stop:{lanes.container('demo-h1')}",
        f"remove:{lanes.container('demo-h1', 'rtx')}", f"remove:{lanes.container('demo-h1')}", "deactivate:demo-h1"]
    client = docker.from_env()
    assert client.containers.list(all=True, filters={"label": f"io.lanectl.recipe={lanes.recipe_id}"}) == []
    data = status(lanes, state)
    assert data["lanes"] == [] and data["active"] is None


# -- containers lanectl did not make ----------------------------------------------------------------------------

def test_a_renamed_lane_container_is_reported_and_up_is_refused_before_anything_stops(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    renamed = f"{lanes.prefix}-renamed"
    docker.from_env().containers.get(lanes.container("demo-h1")).rename(renamed)
    data = status(lanes, state)
    foreign = {f["name"]: f for f in data["foreign_containers"]}
    assert foreign[renamed]["what"] == f"renamed: lanectl created it as {lanes.container('demo-h1')}"
    refused = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=2)
    assert f"{renamed} (renamed: lanectl created it as" in refused.stderr
    assert f"docker rm -f {renamed}" in refused.stderr
    assert lanes.container("demo-h1", "rtx") in running(lanes), "nothing was stopped"
    check = cli(lanes, state, "watchdog", "check", code=None)
    assert "cannot start" in check.stdout + check.stderr and renamed in check.stdout + check.stderr
    assert {lanes.container("demo-h2"), lanes.container("demo-h2", "rtx")}.isdisjoint(running(lanes)), \
        "the watchdog started no second lane beside it"


def test_a_hand_run_container_of_a_lane_image_is_never_adopted(lanes, state):
    image = row(status(lanes, state), "demo-h1")["image"]
    docker.from_env().containers.run(image, name=lanes.container("demo-h1"), detach=True, init=True)
    data = status(lanes, state)
    assert row(data, "demo-h1")["containers"] == [] and not row(data, "demo-h1")["active"]
    assert [f["what"] for f in data["foreign_containers"]] == ["made from demo-h1's image but not created by lanectl"]
    refused = cli(lanes, state, "up", "demo-h1", "--no-gpu", code=2)
    assert f"clear it with `docker rm -f {lanes.container('demo-h1')}`" in refused.stderr
    assert "ok:" not in refused.stdout


def test_a_foreign_container_holding_a_lane_name_is_found_before_the_serving_lane_is_stopped(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    docker.from_env().containers.create("lanectl/base-python:bookworm", name=lanes.container("demo-h2"),
                                        command=["true"])
    refused = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=2)
    assert "holds the name of demo-h2's primary container" in refused.stderr
    assert row(status(lanes, state), "demo-h1")["health"] == "ok", "demo-h1 still serves"


def test_the_prune_removes_only_containers_lanectl_created(lanes, state):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    recipe.write_text(recipe.read_text().replace("keep_stopped_lanes: 3", "keep_stopped_lanes: 0"))
    image = row(status(lanes, state), "demo-h1")["image"]
    debugging = docker.from_env().containers.create(image, name=f"hand-{lanes.prefix}-debug", command=["true"])
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    cli(lanes, state, "up", "demo-h2", "--no-gpu")
    assert row(status(lanes, state), "demo-h1")["containers"] == [], "demo-h1's own containers were pruned"
    debugging.reload()
    assert debugging.status == "created", "the operator's container made from a lane image was left alone"


def test_two_ups_from_different_state_folders_exclude_each_other(lanes, state, tmp_path):
    other = tmp_path / "someone-elses-state"
    slow = subprocess.Popen([sys.executable, "-m", "lanectl", "up", "t-slow", "--no-gpu"], cwd=lanes.root,
                            env=lanes.env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not list((lanes.root / "engine-lock").glob("engine-*.lock.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = cli(lanes, other, "up", "demo-h2", "--no-gpu", "--lock-wait", "1s", code=1)
        assert re.search(rf"locked by pid {slow.pid} \(lanectl up t-slow\) since \d\d:\d\d:\d\d", second.stderr)
    finally:
        slow.wait(timeout=120)
    assert slow.returncode == 0
    assert not (other / "journal.jsonl").exists(), "the refused up changed nothing"


def test_a_second_state_folder_on_the_same_engine_is_refused_and_names_the_one_that_owns_it(lanes, state, tmp_path):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    other = tmp_path / "root-and-user-state"
    second = cli(lanes, other, "up", "demo-h2", "--no-gpu", code=2)
    assert "one engine has one state" in second.stderr and str(state.resolve()) in second.stderr, second.stderr
    down = cli(lanes, other, "down", "demo-h1", code=2)
    assert str(state.resolve()) in down.stderr
    assert running(lanes) == {lanes.container("demo-h1"), lanes.container("demo-h1", "rtx")}
    assert not (other / "journal.jsonl").exists(), "the refused commands changed nothing"


# -- interrupted switches -------------------------------------------------------------------------------------

# demo-h1 -> demo-h2: disarm, stop rtx, stop primary, create+start primary, create+start rtx, gate, activate, arm.
GATE_STEP = 8


# A signal after every step of every kind of switch is in tests/test_switch_execute.py (the in-memory engine); here a
# real signal to the real CLI before the old lane stopped, with nothing serving, and past the gate.
@pytest.mark.parametrize(("after", "signame"), [(1, "INT"), (3, "TERM"), (GATE_STEP, "INT")])
def test_a_real_signal_leaves_a_serving_lane_a_journal_that_says_which_and_an_armed_watchdog(
        lanes, state, after, signame):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    result = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=None,
                 LANECTL_TEST_SIGNAL_AFTER_STEP=f"{after}:{signame}")
    signum = getattr(signal, f"SIG{signame}")
    data = status(lanes, state)
    assert data["watchdog"]["armed"] and data["watchdog"]["lease"] is None
    assert data["unfinished_switch"] is None
    outcome = json.loads(cli(lanes, state, "history", "-n", "3", "--json").stdout)["data"]["records"][-1]
    if after < GATE_STEP:
        assert result.returncode == 128 + signum, result.stdout + result.stderr
        # After the disarm alone no container had changed, and the way back changes none: demo-h1 is gated as it is.
        back = ("No container was changed: demo-h1 serves as it did and passed its gate" if after == 1
                else "Rolled back: demo-h1 is serving again")
        assert result.stdout.startswith(f"interrupted: interrupted by SIG{signame}. {back}"), result.stdout
        assert outcome["result"] == "interrupted" and back in outcome["message"]
        assert data["active"] == "demo-h1" and row(data, "demo-h1")["health"] == "ok"
    else:
        # Past its gate the new lane serves; what is left is bookkeeping, and it runs.
        assert result.returncode == 0, result.stdout + result.stderr
        assert outcome["result"] == "ok" and data["active"] == "demo-h2" and row(data, "demo-h2")["health"] == "ok"
    assert len([name for name in running(lanes) if not name.endswith("-rtx")]) == 1, "one lane serves"


def test_ctrl_c_while_the_gate_waits_stops_waiting_and_brings_the_previous_lane_back(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    switch = subprocess.Popen([sys.executable, "-m", "lanectl", "up", "t-slow", "--no-gpu"], cwd=lanes.root,
                              env=lanes.env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Signalled once the gate runs: its step follows the companion's start in the plan, and t-slow takes 8 s to load,
    # so a second after that start is journaled the switch is waiting on the gate (a signal sent when the companion
    # merely ran could land before the gate began, on a fast machine).
    rtx_started = f"start:{lanes.container('t-slow', 'rtx')}"
    deadline = time.monotonic() + 60
    while not any(record.get("step") == rtx_started for record in journal_records(state)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    switch.send_signal(signal.SIGINT)
    stdout, stderr = switch.communicate(timeout=120)
    assert switch.returncode == 130, stdout + stderr
    assert stdout == ("interrupted: interrupted by SIGINT while t-slow was held to its gate. Rolled back: demo-h1 is "
                      "serving again\n")
    assert row(status(lanes, state), "demo-h1")["health"] == "ok"


def test_the_watchdog_after_a_killed_switch_finishes_it_and_never_starts_a_second_lane(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    killed = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=None, LANECTL_TEST_CRASH_AFTER_STEP="7")
    assert killed.returncode == -signal.SIGKILL
    assert status(lanes, state)["watchdog"]["lease"] is not None, "the killed switch's lease is left"
    check = cli(lanes, state, "watchdog", "check", code=None)
    assert "finished the interrupted switch: demo-h2 passed its gate" in check.stdout + check.stderr
    data = status(lanes, state)
    assert data["active"] == "demo-h2" and data["watchdog"]["armed"] and data["unfinished_switch"] is None
    assert running(lanes) == {lanes.container("demo-h2"), lanes.container("demo-h2", "rtx")}
    cli(lanes, state, "watchdog", "check")
    assert running(lanes) == {lanes.container("demo-h2"), lanes.container("demo-h2", "rtx")}


def test_the_watchdog_does_not_take_a_switch_in_progress_for_deaths(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    switch = subprocess.Popen([sys.executable, "-m", "lanectl", "up", "t-slow", "--no-gpu"], cwd=lanes.root,
                              env=lanes.env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while lanes.container("t-slow", "rtx") not in running(lanes) and time.monotonic() < deadline:
            time.sleep(0.1)
        check = json.loads(cli(lanes, state, "watchdog", "check", "--json").stdout)["data"]
        assert check["reason"] == (f"a switch is in progress (switch to t-slow, by pid {switch.pid} (lanectl up "
                                   "t-slow)); its lanes are not judged until it ends"), check
    finally:
        switch.communicate(timeout=120)
    records = json.loads(cli(lanes, state, "history", "-n", "200", "--json").stdout)["data"]["records"]
    assert not [r for r in records if r["kind"] == "watchdog" and r.get("event") == "observation"], \
        "demo-h1, stopped by the switch, was not called dead"

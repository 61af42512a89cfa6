"""Standbys on the real Docker engine with stub-engine images: a switch leaves the previous lane asleep, a
rollback wakes it, and every way a wake can fail falls back to the cold path (stop, start, gate).

The demo recipe with its standby block, each lane on its own loopback ports, plus lanes whose stub fails
the way upstream wakes have failed. Every test has its own state dir; containers are removed after each.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import docker
import httpx
import pytest

from tests.lane_fixtures import LaneProject, free_port, make_lane_project, remove_containers, remove_everything
from tests.streams import Streams

pytestmark = pytest.mark.docker


def _lane(name: str, env: dict[str, str], standby: str = "", engine: str = "") -> str:
    env_lines = "".join(f"        {key}: \"{value}\"\n" for key, value in env.items())
    return f"""
  {name}:
    engine:
{engine}      ports:
        - {{container: 8000, host: {free_port()}, host_ip: 127.0.0.1}}
      env:
{env_lines}    companions:
      rtx:
        engine:
          ports:
            - {{container: 8001, host: {free_port()}, host_ip: 127.0.0.1}}
{standby}"""


def fault_lanes() -> str:
    return "".join([
        _lane("t-wakefail", {"STUB_FAULT": "wake_fail"}),
        _lane("t-altered", {"STUB_FAULT": "wake_altered"}),
        # Dies 3 s after falling asleep: after the switch's own check that it sleeps (on a loaded machine that check
        # came more than 0.5 s late, and a lane dead by then is rightly stopped instead of left asleep).
        _lane("t-dies", {"STUB_FAULT": "die_asleep", "STUB_FAULT_AFTER_S": "3"}),
        # Its sleep fails (500 from the engine core's failed offload).
        _lane("t-sleepfail", {"STUB_FAULT": "sleep_fail"}),
        # Its wake takes longer than its recipe allows.
        _lane("t-slowwake", {"STUB_WAKE_SECONDS": "5"}, "    standby: {wake_timeout_seconds: 1}\n"),
        # Asks for more host memory for its weights than any test machine has.
        _lane("t-heavy", {"STUB_TOKEN_SEED": "3"}, "    standby: {weights_gib: 60000}\n"),
        # demo-h1 with the demo's 15 s drain instead of the test lanes' 3 s: room for streams long enough to be
        # in flight however slowly a loaded machine brings the switch to the sleep.
        _lane("t-drain15", {"STUB_DECODE_TOKENS_PER_S": "100"}, engine="      stop_timeout_seconds: 30\n"),
    ])


LANES = ["demo-h1", "demo-h2", "demo-broken", "t-wakefail", "t-altered", "t-slowwake", "t-dies", "t-heavy",
         "t-sleepfail", "t-drain15"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("standby"), standby=True, extra_lanes=fault_lanes())
    state = tmp_path_factory.mktemp("build-state")
    project.invoke("build", *LANES, state=state, check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    yield tmp_path / "state"
    recipe.write_text(original)
    remove_containers(lanes)


def up(lanes: LaneProject, state: Path, lane: str, *args: str, code: int = 0):
    result = lanes.invoke("up", lane, "--no-gpu", *args, state=state)
    assert result.returncode == code, f"{result.stdout}\n{result.stderr}"
    return result


def rollback(lanes: LaneProject, state: Path, code: int = 0):
    result = lanes.invoke("rollback", "--no-gpu", state=state)
    assert result.returncode == code, f"{result.stdout}\n{result.stderr}"
    return result


def status(lanes: LaneProject, state: Path) -> dict:
    return json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]


def row(data: dict, lane: str) -> dict:
    return next(r for r in data["lanes"] if r["lane"] == lane)


def started_at(lanes: LaneProject, lane: str) -> str:
    return docker.from_env().api.inspect_container(lanes.container(lane))["State"]["StartedAt"]


def port(lanes: LaneProject, lane: str) -> int:
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    return load_catalog(Project.locate(lanes.root / "recipes")).lane(lane).spec.engine.ports[0].published


def is_sleeping(lanes: LaneProject, lane: str) -> bool:
    return bool(httpx.get(f"http://127.0.0.1:{port(lanes, lane)}/is_sleeping", timeout=5).json()["is_sleeping"])


def records(lanes: LaneProject, state: Path) -> list[dict]:
    return json.loads(lanes.invoke("history", "-n", "500", "--json", state=state, check=True).stdout)["data"]["records"]


def serving(data: dict, lane: str) -> bool:
    r = row(data, lane)
    return r["active"] and r["health"] == "ok" and r["standby"] is None and \
        [c["status"] for c in r["containers"]] == ["running", "running"]


def test_a_switch_leaves_a_standby_and_a_rollback_wakes_it(lanes, state):
    up(lanes, state, "demo-h1")
    h1_started = started_at(lanes, "demo-h1")
    switched = up(lanes, state, "demo-h2")
    assert "demo-h2 is serving (was demo-h1); demo-h1 waits asleep as a standby" in switched.stdout
    assert f"put {lanes.container('demo-h1', 'rtx')} (rtx of demo-h1) to sleep" in switched.stderr
    assert "check that the GPUs have the memory demo-h2 needs beside the standby" in switched.stderr
    assert "not checked: the lanes run without GPUs (--no-gpu)" in switched.stderr

    data = status(lanes, state)
    assert serving(data, "demo-h2")
    standby = row(data, "demo-h1")["standby"]
    assert standby is not None and standby["alive"] and standby["resident_gib"] == 1.0 and standby["seconds"] >= 0
    assert [c["status"] for c in row(data, "demo-h1")["containers"]] == ["running", "running"]
    assert is_sleeping(lanes, "demo-h1")
    text = lanes.invoke("status", state=state, check=True).stdout
    assert "standby " in text and "1 GiB resident" in text

    back = rollback(lanes, state)
    assert "demo-h1 is serving (was demo-h2); woken from its standby in" in back.stdout, back.stdout
    assert "wake demo-h1 (every container at once)" in back.stderr
    assert "check demo-h1's greedy output against the fingerprint" in back.stderr
    assert f"start {lanes.container('demo-h1')}" not in back.stderr, "a wake, not a start"
    assert started_at(lanes, "demo-h1") == h1_started, "the same engine process served again"
    assert not is_sleeping(lanes, "demo-h1")
    data = status(lanes, state)
    assert serving(data, "demo-h1")
    assert [c["status"] for c in row(data, "demo-h2")["containers"]] == ["exited", "exited"], "rollback stops B"
    assert row(data, "demo-h2")["standby"] is None

    keys = [r.get("step") for r in records(lanes, state) if r["kind"] == "step"]
    assert f"sleep:{lanes.container('demo-h1')}" in keys and "wake:demo-h1" in keys
    assert "wake-check:demo-h1" in keys


def test_a_request_to_a_sleeping_lane_waits_and_is_served_once_it_is_woken(lanes, state):
    """vLLM queues a request sent to a sleeping engine (no answer, no refusal); the stub lanes do the same."""
    import threading

    up(lanes, state, "demo-h1")
    switched = up(lanes, state, "demo-h2")
    assert is_sleeping(lanes, "demo-h1"), switched.stderr
    url = f"http://127.0.0.1:{port(lanes, 'demo-h1')}"
    answers: list[httpx.Response] = []
    request = threading.Thread(target=lambda: answers.append(httpx.post(
        url + "/v1/completions", json={"prompt": "queued", "max_tokens": 3}, timeout=120)))
    request.start()
    request.join(2)
    assert request.is_alive() and not answers, "a sleeping lane answers nothing"
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    waiting = re.search(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", httpx.get(url + "/metrics").text, re.M)
    assert waiting and float(waiting.group(1)) == 1, "queued, as vLLM queues it"
    assert "requests to it wait unanswered until a wake" in lanes.invoke("status", state=state, check=True).stdout
    rollback(lanes, state)
    request.join(30)
    assert [a.status_code for a in answers] == [200]


@pytest.mark.parametrize(("lane", "cause"), [
    ("t-wakefail", "POST /wake_up answered 500: CUDA error: out of memory"),
    ("t-altered", "wake check: greedy output"),
    ("t-slowwake", "POST /wake_up: no answer within 1 s"),
])
def test_a_failed_wake_falls_back_to_the_cold_path(lanes, state, lane, cause):
    up(lanes, state, lane)
    first_start = started_at(lanes, lane)
    switched = up(lanes, state, "demo-h2")
    assert f"{lane} is stopped instead of left asleep" not in switched.stderr, switched.stderr
    assert is_sleeping(lanes, lane)
    back = rollback(lanes, state)
    assert f"{lane} is serving (was demo-h2); its wake failed (" in back.stdout and \
        "so it was started cold" in back.stdout, back.stdout
    assert cause in back.stdout
    assert f"wake of {lane} failed" in back.stderr and "cold path: stop, start, gate" in back.stderr
    assert started_at(lanes, lane) != first_start, "a fresh engine process"
    assert serving(status(lanes, state), lane)
    notes = [r["message"] for r in records(lanes, state) if r["kind"] == "note"]
    assert any(f"wake of {lane} failed" in note and cause in note for note in notes)


def test_a_standby_that_dies_asleep_is_dropped_and_the_rollback_says_it_starts_cold(lanes, state):
    up(lanes, state, "t-dies")
    switched = up(lanes, state, "demo-h2")
    assert "t-dies is stopped instead of left asleep" not in switched.stderr, \
        "it died before the switch saw it asleep: no standby to lose\n" + switched.stderr
    client = docker.from_env()
    deadline = time.monotonic() + 30
    while client.api.inspect_container(lanes.container("t-dies"))["State"]["Running"]:
        assert time.monotonic() < deadline, "the stub never died asleep"
        time.sleep(0.2)
    check = lanes.invoke("watchdog", "check", "--kernel-log", "file:/dev/null", state=state)
    assert check.returncode == 0, check.stdout + check.stderr
    assert ("the standby of t-dies is gone: its primary container exited while asleep (exit code 70: the engine "
            "exited 0 unasked, as vLLM does when its engine core dies; lanectl's exit guard made it 70)"
            ) in check.stderr
    watchdog_events = [r for r in records(lanes, state) if r["kind"] == "watchdog"]
    assert [r["event"] for r in watchdog_events if r.get("lane") == "t-dies"] == ["standby-lost"], \
        "dropped, neither restarted nor alerted on"
    assert row(status(lanes, state), "t-dies")["standby"] is None

    back = rollback(lanes, state)
    assert "t-dies has no standby to wake (dropped " in back.stderr and "starting it cold" in back.stderr
    assert serving(status(lanes, state), "t-dies")


def test_the_watchdog_leaves_a_sleeping_lane_alone(lanes, state):
    up(lanes, state, "demo-h1")
    up(lanes, state, "demo-h2")
    check = lanes.invoke("watchdog", "check", "--kernel-log", "file:/dev/null", state=state)
    assert check.returncode == 0, check.stdout + check.stderr
    assert is_sleeping(lanes, "demo-h1")
    assert not [r for r in records(lanes, state) if r["kind"] == "watchdog" and r.get("lane") == "demo-h1"]


def test_a_failed_gate_wakes_the_standby_it_left(lanes, state):
    up(lanes, state, "demo-h1")
    h1_started = started_at(lanes, "demo-h1")
    failed = up(lanes, state, "demo-broken", code=1)
    assert "Rolled back: demo-h1 is serving again (woken from its standby in " in failed.stdout
    assert "wake demo-h1 (every container at once)" in failed.stderr
    assert started_at(lanes, "demo-h1") == h1_started, "woken, not restarted"
    assert serving(status(lanes, state), "demo-h1")


def test_too_little_host_memory_stops_the_lane_instead(lanes, state):
    up(lanes, state, "t-heavy")
    switched = up(lanes, state, "demo-h2")
    assert "not left asleep: host memory: " in switched.stderr and "its weights need 60000 GiB" in switched.stderr
    assert "waits asleep" not in switched.stdout
    data = status(lanes, state)
    assert row(data, "t-heavy")["standby"] is None
    assert [c["status"] for c in row(data, "t-heavy")["containers"]] == ["exited", "exited"]


def test_a_sleep_that_fails_stops_the_lane_instead(lanes, state):
    up(lanes, state, "t-sleepfail")
    switched = up(lanes, state, "demo-h2")
    assert "t-sleepfail is stopped instead of left asleep: sleep failed: " in switched.stderr and \
        "Call to sleep method failed: CuMemAllocator" in switched.stderr, switched.stderr
    assert "waits asleep" not in switched.stdout
    data = status(lanes, state)
    assert row(data, "t-sleepfail")["standby"] is None
    assert [c["status"] for c in row(data, "t-sleepfail")["containers"]] == ["exited", "exited"]
    notes = [r for r in records(lanes, state) if r["kind"] == "note" and r.get("lane") == "t-sleepfail"]
    assert any("CuMemAllocator" in r["message"] for r in notes), notes


def test_requests_in_flight_when_a_lane_falls_asleep_finish_before_it_sleeps(lanes, state):
    up(lanes, state, "t-drain15")
    # 10 s of tokens, what is left of them inside the lane's 15 s drain. A loaded machine once took over 2 s from
    # the streams' start to the sleep, and over 6 s to a switch's stop; the claim is on those still in flight when
    # it came (at least one): all finished, none cut.
    streams = Streams(f"http://127.0.0.1:{port(lanes, 't-drain15')}", "demo-model", max_tokens=1000).start()
    streams.running()
    switched = up(lanes, state, "demo-h2")
    assert "t-drain15 waits asleep as a standby" in switched.stdout
    assert streams.ends() == ["length"] * 8, [vars(s) for s in streams.streams]
    sleeps = [r for r in records(lanes, state) if r["kind"] == "step" and r["step"] ==
              f"sleep:{lanes.container('t-drain15')}"]
    in_flight = re.search(r"(\d+) request\(s\) in flight, all finished before it slept", sleeps[-1]["detail"])
    assert in_flight and 1 <= int(in_flight.group(1)) <= 8, sleeps


def test_down_stops_the_standbys_too(lanes, state):
    up(lanes, state, "demo-h1")
    up(lanes, state, "demo-h2")
    down = lanes.invoke("down", state=state)
    assert down.returncode == 0, down.stderr
    assert "demo-h2 stopped; demo-h1 (standby) stopped" in down.stdout
    data = status(lanes, state)
    assert data["active"] is None
    for lane in ("demo-h1", "demo-h2"):
        assert row(data, lane)["standby"] is None
        assert all(c["status"] == "exited" for c in row(data, lane)["containers"])


def test_dry_run_shows_the_sleep_and_the_wake(lanes, state):
    up(lanes, state, "demo-h1")
    plan = lanes.invoke("up", "demo-h2", "--dry-run", "--no-gpu", state=state, check=True).stdout
    assert f"would put {lanes.container('demo-h1')} (primary of demo-h1) to sleep" in plan
    up(lanes, state, "demo-h2")
    plan = lanes.invoke("rollback", "--dry-run", "--no-gpu", state=state, check=True).stdout
    assert "would wake demo-h1 (every container at once)" in plan
    assert "not left asleep: the lane it rolls back to needs all of its GPU memory back" in plan


def test_a_switch_killed_after_the_sleep_is_undone_by_waking_the_standby(lanes, state):
    up(lanes, state, "demo-h1")
    h1_started = started_at(lanes, "demo-h1")
    # Steps: disarm, sleep the companion, sleep the primary: killed right after the last.
    killed = lanes.cli("up", "demo-h2", "--no-gpu", state=state, extra_env={"LANECTL_TEST_CRASH_AFTER_STEP": "3"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert is_sleeping(lanes, "demo-h1"), "killed right after demo-h1 fell asleep"
    again = up(lanes, state, "demo-h1")
    assert "undid the interrupted switch to demo-h2; demo-h1 is serving again" in again.stderr, again.stderr
    assert "wake demo-h1 (every container at once)" in again.stderr
    assert started_at(lanes, "demo-h1") == h1_started
    assert serving(status(lanes, state), "demo-h1")


def test_a_rollback_killed_after_its_first_stop_and_one_watchdog_pass_leave_one_lane_awake(lanes, state):
    """demo-h2 serves, demo-h1 waits asleep; `rollback` is killed right after `stop demo-h2-rtx` (disarm, then
    that stop); the watchdog's next pass finishes the switch, and demo-h2's primary is stopped before demo-h1 is
    woken (it woke demo-h1 beside it: two lanes awake on GPU 0, both answering /is_sleeping false)."""
    up(lanes, state, "demo-h1")
    up(lanes, state, "demo-h2")
    killed = lanes.cli("rollback", "--no-gpu", state=state, extra_env={"LANECTL_TEST_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert f"stop {lanes.container('demo-h2', 'rtx')}" in killed.stderr
    check = lanes.invoke("watchdog", "check", "--kernel-log", "file:/dev/null", state=state)
    assert "finished the interrupted switch: demo-h1 passed its gate" in check.stdout + check.stderr, \
        check.stdout + check.stderr
    client = docker.from_env()
    assert client.api.inspect_container(lanes.container("demo-h2"))["State"]["Status"] == "exited"
    assert not is_sleeping(lanes, "demo-h1")
    assert serving(status(lanes, state), "demo-h1")


def test_an_active_lane_put_to_sleep_by_anyone_is_not_healthy_and_up_brings_it_back_awake(lanes, state):
    """vLLM answers /health 200 while it sleeps; anyone on a dev-mode port can POST /sleep."""
    up(lanes, state, "demo-h1")
    httpx.post(f"http://127.0.0.1:{port(lanes, 'demo-h1')}/sleep?level=1", timeout=10).raise_for_status()
    assert is_sleeping(lanes, "demo-h1")
    health = row(status(lanes, state), "demo-h1")["health"]
    assert health.startswith(f"asleep: {lanes.container('demo-h1')} (primary) answers /health but sleeps"), health
    again = up(lanes, state, "demo-h1")
    assert "already active and healthy" not in again.stdout, again.stdout
    assert not is_sleeping(lanes, "demo-h1")
    assert serving(status(lanes, state), "demo-h1")


def test_a_ctrl_c_before_the_serving_lane_was_put_to_sleep_leaves_it_serving_as_it_was(lanes, state):
    """demo-h2 serves, demo-h1 sleeps as the older standby; `up t-drain15` gets a SIGINT right after it stopped
    demo-h1's companion (disarm, that stop): demo-h2 was never put to sleep, so the way back neither wake-checks
    nor restarts it (it failed the wake check, no standby being recorded, and restarted it cold)."""
    up(lanes, state, "demo-h1")
    up(lanes, state, "demo-h2")
    h2_started = started_at(lanes, "demo-h2")
    interrupted = lanes.cli("up", "t-drain15", "--no-gpu", state=state,
                            extra_env={"LANECTL_TEST_SIGNAL_AFTER_STEP": "2:INT"})
    assert interrupted.returncode == 130, interrupted.stdout + interrupted.stderr
    assert "demo-h2 is serving again" in interrupted.stdout + interrupted.stderr
    assert "it was never put to sleep: nothing to wake" in interrupted.stderr, interrupted.stderr
    assert started_at(lanes, "demo-h2") == h2_started, "demo-h2 was restarted"
    assert serving(status(lanes, state), "demo-h2")


def last_switch_steps(lanes: LaneProject, state: Path) -> list[str]:
    entries = records(lanes, state)
    switch = [r for r in entries if r["kind"] == "intent"][-1]["switch"]
    return [r["step"] for r in entries if r["kind"] == "step" and r["switch"] == switch]


def published(lanes: LaneProject, lane: str, role: str) -> list[str]:
    ports = docker.from_env().api.inspect_container(lanes.container(lane, role))["NetworkSettings"]["Ports"]
    return sorted(binding["HostPort"] for bindings in ports.values() if bindings for binding in bindings)


@pytest.mark.parametrize("changed", ["rtx", "primary"])
def test_a_rollback_to_a_sleeping_standby_whose_container_changed_starts_it_cold_and_it_serves(lanes, state,
                                                                                            changed):
    up(lanes, state, "demo-h1")
    h1_started = started_at(lanes, "demo-h1")
    up(lanes, state, "demo-h2")
    assert is_sleeping(lanes, "demo-h1")
    new_port = free_port()
    if changed == "rtx":
        lanes.edit_lane("demo-h1", "    companions:\n      rtx:\n        engine:\n          ports:\n"
                        f"            - {{container: 8001, host: {new_port}, host_ip: 127.0.0.1}}\n")
    else:
        lanes.edit_lane("demo-h1", "    engine:\n      shm_size: 1g\n")
    dry_run = json.loads(lanes.invoke("rollback", "--dry-run", "--no-gpu", "--json", state=state, check=True).stdout)
    planned = dry_run["data"]["keys"]

    back = rollback(lanes, state)
    assert "demo-h1 is serving (was demo-h2)" in back.stdout, back.stdout + back.stderr
    assert "CUT" not in back.stdout + back.stderr, back.stderr
    assert last_switch_steps(lanes, state) == planned, "--dry-run printed the plan that ran"
    assert not is_sleeping(lanes, "demo-h1")
    assert started_at(lanes, "demo-h1") != h1_started, "a cold start: the sleeping engine was not kept"
    data = status(lanes, state)
    assert serving(data, "demo-h1") and row(data, "demo-h1")["standby"] is None
    if changed == "rtx":
        assert published(lanes, "demo-h1", "rtx") == [str(new_port)]
        assert httpx.get(f"http://127.0.0.1:{new_port}/health", timeout=5).status_code == 200
    cut = [r for r in records(lanes, state) if r["kind"] == "step" and r.get("cut")]
    assert not cut, cut

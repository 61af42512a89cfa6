"""No request is lost to a switch (issue 31): 8 streaming completions in flight when a lane is stopped by `up`,
`rollback`, `down` or a watchdog restart all finish whole when the drain fits the stop timeout (the demo lanes
drain 15 s of their 30 s); a lane whose drain is 0 (vLLM's default) cuts them, and the journal says how many.

The demo recipe on the real engine (tests/lane_fixtures.py): every lane on the same host port, so a client keeps
one address across a switch, as it would behind the box's proxy."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.lane_fixtures import LaneProject, make_lane_project, remove_containers, remove_everything
from tests.streams import Streams

pytestmark = pytest.mark.docker

# demo-h1 as it would run without lanectl's drain: vLLM's default, abort on SIGTERM.
NO_DRAIN = """
  t-nodrain:
    description: demo-h1 with --shutdown-timeout 0 (vLLM's default)
    engine:
      args: [/model, --served-model-name, demo-model, --max-num-seqs, "32", --host, 0.0.0.0, --port, "8000",
             --enable-sleep-mode, --shutdown-timeout, "0"]
"""


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    # Primaries alone: what a stop does to a lane's streams is the claim, and the companions would double the
    # containers every switch stops and starts.
    project = make_lane_project(tmp_path_factory.mktemp("drain"), extra_lanes=NO_DRAIN, stop_timeout_seconds=30,
                                companions=False)
    project.invoke("build", "demo-h1", "demo-h2", "t-nodrain", state=tmp_path_factory.mktemp("build-state"),
                check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    yield tmp_path / "state"
    remove_containers(lanes)


def url(lanes: LaneProject) -> str:
    recipe = (lanes.root / "recipes" / "lanes.yaml").read_text()
    return f"http://127.0.0.1:{int(recipe.split('host: ', 1)[1].split(',', 1)[0])}"


def in_flight(lanes: LaneProject, max_tokens: int = 300) -> Streams:
    streams = Streams(url(lanes), "demo-model", max_tokens=max_tokens).start()
    streams.running()
    return streams


def stops(lanes: LaneProject, state: Path, lane: str) -> list[dict]:
    """The journal's stop steps of `lane`'s primary, with what each measured."""
    records = json.loads(lanes.invoke("history", "-n", "500", "--json", state=state, check=True).stdout)["data"]
    return [r for r in records["records"] if r["kind"] == "step" and r["step"] == f"stop:{lanes.container(lane)}"]


@pytest.mark.parametrize("switch", ["up", "rollback", "down"])
def test_requests_in_flight_when_a_switch_stops_their_lane_all_finish(lanes, state, switch):
    lanes.invoke("up", "demo-h2", "--no-gpu", state=state, check=True)
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    # 10 s of tokens: still running when the switch stops the lane (a loaded machine once took over 6 s from the
    # streams' start to the stop), and what is left of them inside its 15 s drain.
    streams = in_flight(lanes, max_tokens=1000)
    command = {"up": ["up", "demo-h2", "--no-gpu"], "rollback": ["rollback", "--no-gpu"], "down": ["down"]}[switch]
    result = lanes.invoke(*command, state=state)
    assert result.returncode == 0, result.stdout + result.stderr
    assert streams.ends() == ["length"] * 8, [vars(s) for s in streams.streams]
    assert all(s.tokens == 1000 and s.done for s in streams.streams)
    (stop,) = stops(lanes, state, "demo-h1")
    assert (stop["in_flight"], stop["cut"]) == (8, 0), stop
    assert "8 request(s) in flight, all finished (drained within 15 s)" in stop["detail"]


def test_requests_in_flight_when_the_watchdog_restarts_their_lane_all_finish(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    # 12 s of tokens, what is left of them inside the 15 s drain: the watchdog's check reaches the stop while they
    # run, even on a loaded machine; those still in flight then (at least one) must all finish.
    streams = in_flight(lanes, max_tokens=1200)
    httpx.post(url(lanes) + "/admin/fault", json={"fault": "fatal_log"}, timeout=5).raise_for_status()
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    check = lanes.invoke("watchdog", "check", "--json", state=state,
                      extra_env={"LANECTL_KERNEL_LOG": f"file:{kernel_log}"})
    assert json.loads(check.stdout)["data"]["action"] == "restart", check.stdout + check.stderr
    assert streams.ends() == ["length"] * 8
    (stop,) = stops(lanes, state, "demo-h1")
    assert 1 <= stop["in_flight"] <= 8 and stop["cut"] == 0, stop


def test_a_drain_that_does_not_fit_cuts_the_requests_and_the_journal_says_how_many(lanes, state):
    lanes.invoke("up", "t-nodrain", "--no-gpu", state=state, check=True)
    streams = in_flight(lanes, max_tokens=3000)  # 30 s: none finishes before the stop, however slow the switch
    result = lanes.invoke("up", "demo-h1", "--no-gpu", state=state)
    assert result.returncode == 0, result.stdout + result.stderr
    assert streams.ends() == ["abort"] * 8
    (stop,) = stops(lanes, state, "t-nodrain")
    assert (stop["in_flight"], stop["cut"]) == (8, 8), stop
    assert "8 request(s) in flight CUT: the engine aborted them" in result.stderr


def test_a_recipe_that_shortens_the_stop_timeout_does_not_cut_what_the_running_engine_drains(lanes, state):
    """demo-h1 made with 60 s (its drain 45 s); the recipe then says 20 s (drain 5 s); the `up` that recreates
    it stops the running container with its own 60 s, so 30 s streams in flight finish whole (the recipe's 20 s
    cut them all: Docker killed the engine mid-drain)."""
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    h1 = "\n  demo-h1:\n    description: The control lane (mirrors h1-REF).\n"
    assert h1 in original

    def h1_stops_after(seconds: int) -> None:
        recipe.write_text(original.replace(h1, h1 + f"    engine:\n      stop_timeout_seconds: {seconds}\n"))
        lanes.invoke("build", "demo-h1", state=state, check=True, timeout=600)

    try:
        h1_stops_after(60)
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        streams = in_flight(lanes, max_tokens=3000)
        h1_stops_after(20)
        result = lanes.invoke("up", "demo-h1", "--no-gpu", state=state)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "recreated: " in result.stderr and "stop_timeout_seconds 60 → 20" in result.stderr
        assert streams.ends() == ["length"] * 8, [vars(s) for s in streams.streams]
        (stop,) = stops(lanes, state, "demo-h1")
        assert (stop["in_flight"], stop["cut"]) == (8, 0), stop
        assert "allowing 60 s to exit" in result.stderr
    finally:
        recipe.write_text(original)

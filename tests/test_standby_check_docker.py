"""`lanectl standby check` on the real Docker engine with stub-engine lanes: a lane that sleeps and wakes well
passes and yields its standby block; each way the stub can be told to fail is reported as that failure.

The stubs share one "GPU" through a ledger folder mounted into every check lane (stubengine/gpu.py): vLLM's
start-up check (free >= --gpu-memory-utilization x total) decides whether a lane starts beside a sleeping one.
That GPU is the real-GPU record's H100 (gpu/record/standby-1b/), and c-good is told to sleep and wake as the
record's engine did (vLLM 0.26.0 with UVA offload: what it kept asleep, what a sleep took from the host, its own
sleep and wake seconds): the check through `lanectl standby check` must come to the record's verdict, block and
starts beside it (0.92 fits, 0.99 is an oom-beside).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import docker
import pytest
import yaml

from tests.gpu_record import standby_report, standby_stub_env
from tests.lane_fixtures import LaneProject, free_port, make_lane_project, remove_containers, remove_everything

pytestmark = pytest.mark.docker

RECORD = standby_report("uva")
RECORDED = standby_stub_env("uva")
ARGS = ("[/model, --served-model-name, demo-model, --host, 0.0.0.0, --port, \"8000\", --enable-sleep-mode, "
        "--gpu-memory-utilization, \"{share}\"]")


def _lane(name: str, ledger: Path, env: dict[str, str], share: float = 0.92, sleep_mode: bool = True) -> str:
    args = ARGS.format(share=share)
    if not sleep_mode:
        args = args.replace(", --enable-sleep-mode", "")
    env_lines = "".join(f"        {key}: \"{value}\"\n" for key, value in {
        "STUB_GPU_LEDGER": "/gpu-ledger", "STUB_GPU_TOTAL_GIB": RECORDED["STUB_GPU_TOTAL_GIB"],
        "STUB_SLEEP_SECONDS": "0.1", "STUB_WAKE_SECONDS": "0.1", **env}.items())
    return f"""
  {name}:
    engine:
      args: {args}
      ports:
        - {{container: 8000, host: {free_port()}, host_ip: 127.0.0.1}}
      volumes:
        - {{source: {ledger}, target: /gpu-ledger}}
      env:
{env_lines}"""


def check_lanes(ledger: Path) -> str:
    return "".join([
        _lane("c-good", ledger, RECORDED),
        # Started beside c-good asleep, as in the record: 0.92 of the GPU fits; 0.99 of it does not (c-good keeps
        # 1.02 GiB of 79.18).
        _lane("c-fits", ledger, {}, share=0.92),
        _lane("c-big", ledger, {}, share=0.99),
        # Its engine core dies at its second wake (the wake answers 500, then the process exits).
        _lane("c-wakecrash", ledger, {"STUB_FAULT": "die_on_wake", "STUB_FAULT_WAKE": "2"}),
        # Dies as soon as it is asleep.
        _lane("c-diesasleep", ledger, {"STUB_FAULT": "die_asleep", "STUB_FAULT_AFTER_S": "0"}),
        # Its third wake answers 200 and every token after it differs.
        _lane("c-drift", ledger, {"STUB_FAULT": "wake_altered", "STUB_FAULT_WAKE": "3"}),
        # Its sleep fails (the allocator could not offload), the engine runs on.
        _lane("c-sleepfail", ledger, {"STUB_FAULT": "sleep_fail"}),
        # A wake of 8 s against a cold start of a second or two.
        _lane("c-slowwake", ledger, {"STUB_WAKE_SECONDS": "8"}),
        _lane("c-nosleep", ledger, {}, sleep_mode=False),
        # Fails while loading for another reason than memory.
        _lane("c-broken", ledger, {"STUB_FAULT": "crash_on_start"}, share=0.5),
    ])


LANES = ["demo-h1", "c-good", "c-fits", "c-big", "c-wakecrash", "c-diesasleep", "c-drift", "c-sleepfail",
         "c-slowwake", "c-broken"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    ledger = tmp_path_factory.mktemp("gpu-ledger")
    ledger.chmod(0o777)
    project = make_lane_project(tmp_path_factory.mktemp("standby-check"), companions=False,
                                extra_lanes=check_lanes(ledger))
    project.invoke("build", *LANES, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    yield tmp_path / "state"
    remove_containers(lanes)


def check(lanes: LaneProject, state: Path, lane: str, *args: str, code: int) -> dict:
    result = lanes.invoke("standby", "check", lane, "--no-gpu", "--json", *args, state=state, timeout=300)
    assert result.returncode == code, f"{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)["data"]


def running(lanes: LaneProject, lane: str) -> bool:
    try:
        return docker.from_env().containers.get(lanes.container(lane)).status == "running"
    except docker.errors.NotFound:
        return False


def test_a_lane_that_sleeps_and_wakes_passes_and_gets_its_standby_block(lanes: LaneProject, state: Path):
    data = check(lanes, state, "c-good", "--cycles", "3", "--beside", "c-fits", code=0)
    assert data["passed"] and data["failure"] is None
    assert [c["same"] for c in data["cycles"]] == [True, True, True]
    # Streams were in flight at every sleep (mode=wait) and all of them finished.
    assert all(c["in_flight"] and c["streams_ok"] == 4 and c["streams_failed"] == 0 for c in data["cycles"])
    assert data["beside"]["started"] and data["beside"]["same_after"]
    # The block of the real engine's record (gpu/record/standby-1b/uva): 1.02 GiB kept asleep of 79.18 GiB, 1.09
    # GiB taken from the host; weights_gib at least that (MemAvailable's fall here adds the box's noise).
    recorded = RECORD["check"]["standby"]
    standby = yaml.safe_load(Path(data["files"][2]).read_text())["standby"]
    assert {**standby, "weights_gib": None} == {**recorded, "weights_gib": None}
    assert standby["weights_gib"] >= recorded["weights_gib"]
    for key in ("max_utilization_beside", "beside_utilization", "beside_fits_by_numbers"):
        assert data["memory"][key] == RECORD["check"]["memory"][key], key
    assert "standby check of c-good: PASSED" in Path(data["files"][1]).read_text()
    assert not running(lanes, "c-good") and not running(lanes, "c-half")
    # The lane started beside it belongs to this state folder as every container lanectl creates does: another
    # folder's `status` must not show it as a lane of its own, nor its `down` remove it.
    beside = docker.from_env().containers.get(lanes.container("c-fits"))
    assert beside.labels.get("io.lanectl.state-dir") == os.path.realpath(state), beside.labels


def test_a_serving_lane_is_stopped_only_with_yes_and_comes_back(lanes: LaneProject, state: Path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    refused = lanes.invoke("standby", "check", "c-good", "--no-gpu", "--cycles", "1", state=state)
    assert refused.returncode == 2 and "demo-h1" in refused.stderr and "--yes" in refused.stderr
    assert running(lanes, "demo-h1") and not running(lanes, "c-good")
    data = check(lanes, state, "c-good", "--cycles", "1", "--yes", code=0)
    assert data["stopped"] == ["demo-h1"] and data["after"] == "demo-h1 serves again"
    assert running(lanes, "demo-h1") and not running(lanes, "c-good")


def test_a_lane_without_sleep_mode_is_refused_before_anything_changes(lanes: LaneProject, state: Path):
    result = lanes.invoke("standby", "check", "c-nosleep", "--no-gpu", state=state)
    assert result.returncode == 2 and "--enable-sleep-mode in its args" in result.stderr
    assert not running(lanes, "c-nosleep")


@pytest.mark.parametrize(("lane", "kind", "cycle", "words"), [
    ("c-wakecrash", "crash", 2, "exited"),
    ("c-diesasleep", "crash", 1, "wake"),
    ("c-drift", "fingerprint-drift", 3, "after wake 3 the greedy output is"),
    ("c-sleepfail", "engine-error", 1, "Call to sleep method failed"),
    ("c-slowwake", "slow-wake", 1, "longer than the cold start"),
])
def test_each_failure_is_named_with_its_cycle(lanes: LaneProject, state: Path, lane: str, kind: str, cycle: int,
                                              words: str):
    data = check(lanes, state, lane, "--cycles", "4", "--streams", "2", code=1)
    assert data["failure"]["kind"] == kind and data["failure"]["cycle"] == cycle, data["failure"]
    assert words in data["failure"]["detail"]
    assert data["standby"] is None and data["standby_yaml"] is None
    assert len(data["cycles"]) == cycle


def test_a_lane_too_big_to_start_beside_it_is_an_oom_beside(lanes: LaneProject, state: Path):
    data = check(lanes, state, "c-good", "--cycles", "1", "--beside", "c-big", code=1)
    assert data["failure"]["kind"] == "oom-beside"
    # vLLM's words at 0.99 in the record, from "on startup" on (the free GiB before them differ: the real start
    # counted about 0.5 GiB its own process already held).
    assert data["failure"]["detail"].split(" on startup ")[1] == RECORD["besides"][1]["detail"].split(
        " on startup ")[1]
    assert data["beside"]["started"] is False and data["standby_yaml"] is None
    # The numbers say why: 0.98 would have fitted.
    assert data["memory"]["max_utilization_beside"] == 0.98 and data["memory"]["beside_fits_by_numbers"] is False


def test_a_lane_beside_it_that_fails_otherwise_is_not_called_out_of_memory(lanes: LaneProject, state: Path):
    data = check(lanes, state, "c-good", "--cycles", "1", "--beside", "c-broken", code=1)
    # The gate may see the engine's fatal line before its container's exit, or the exit first: either is named.
    detail = data["failure"]["detail"]
    assert data["failure"]["kind"] == "beside-failed", data["failure"]
    assert "exited with code 1" in detail or "EngineCore failed to start" in detail, detail
    assert data["memory"]["beside_fits_by_numbers"] is True



def test_an_unbuilt_lane_is_refused_before_anything_changes(lanes: LaneProject, state: Path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.invoke("standby", "check", "c-good", "--no-gpu", "--beside", "c-nosleep", "--yes", state=state)
    assert result.returncode == 2 and "lanectl build c-nosleep" in result.stderr
    assert running(lanes, "demo-h1") and not running(lanes, "c-good")


def test_an_interrupted_check_leaves_no_lane_asleep(lanes: LaneProject, state: Path):
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    port = load_catalog(Project.locate(lanes.root / "recipes")).lane("c-slowwake").spec.engine.ports[0].published
    check = subprocess.Popen([sys.executable, "-m", "lanectl", "standby", "check", "c-slowwake", "--no-gpu",
                              "--cycles", "3"], cwd=lanes.root, env=lanes.env(state), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    asleep = False
    while not asleep and time.monotonic() < deadline:
        try:
            asleep = httpx.get(f"http://127.0.0.1:{port}/is_sleeping", timeout=2).json()["is_sleeping"]
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.1)
    assert asleep, "the check never put the lane to sleep"
    check.send_signal(signal.SIGINT)  # inside its 8 s wake
    check.communicate(timeout=120)
    assert check.returncode != 0 and not running(lanes, "c-slowwake")

"""The standby check's record on a real vLLM (gpu/record/standby-check/, made on the GPU machine by
gpu/vllm_serve/standby_check.py), read and replayed against the stub.

What the record must show (issue 55): the checked engine really offloaded (its startup line `Total CPU offloaded
parameters`, absent from the control), at least 10 sleeps and wakes with streams in flight, each wake's output
compared with the first, the memory figures the standby block is made of, and the starts beside it asleep. Then
the same protocol runs here against the stub told the record's memory (what vLLM said it kept asleep, backed up
and the GPU's size): the verdicts, the block's GPU figures and the starts beside it must come out as on the GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

RECORD = REPO / "gpu" / "record" / "standby-check"
DRIVER = REPO / "gpu" / "vllm_serve" / "standby_check.py"


def report(run: str) -> dict[str, Any]:
    with tarfile.open(RECORD / f"{run}.tgz") as archive:
        member = archive.extractfile(f"{run}/report.json")
        assert member is not None
        return json.loads(member.read())


@pytest.fixture(scope="module")
def uva() -> dict[str, Any]:
    return report("uva")


@pytest.fixture(scope="module")
def control() -> dict[str, Any]:
    return report("control")


def offloaded(run: dict[str, Any]) -> list[str]:
    return [line for line in run["proof_lines"] if "Total CPU offloaded parameters" in line]


def test_the_checked_engine_really_offloaded_and_the_control_did_not(uva: dict, control: dict):
    assert offloaded(uva) and not offloaded(control)
    assert "VLLM_USE_V2_MODEL_RUNNER" in uva["env"] and "--cpu-offload-gb" in uva["argv"]
    assert "--cpu-offload-gb" not in control["argv"]


@pytest.mark.parametrize("run", ["uva", "control"])
def test_ten_or_more_cycles_with_streams_in_flight_each_compared(run: str, uva: dict, control: dict):
    check = {"uva": uva, "control": control}[run]["check"]
    cycles = check["cycles"]
    assert len(cycles) >= 10 or check["failure"] is not None
    assert all(c["in_flight"] for c in cycles), "streams were in flight at every sleep"
    assert all(c["same"] is not None for c in cycles if c["wake_seconds"] is not None)
    # A random-weight model's text, not a dummy model's repetition: the fingerprint says something.
    assert len(set(check["fingerprint"].split())) >= 5


def test_the_standby_block_is_what_the_engine_reported(uva: dict):
    check = uva["check"]
    if check["failure"] is not None:
        pytest.skip(f"the record failed: {check['failure']}")
    block, memory = check["standby"], check["memory"]
    assert block["gpu_memory_gib"] == memory["gpu_memory_gib"]
    assert block["resident_gib"] >= memory["resident_gib_logged"]
    assert block["weights_gib"] >= memory["backed_up_gib_logged"]


def two_free_ports() -> int:
    """A port whose next one is free too: the driver starts the engine beside on port + 1."""
    import socket

    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)
    raise AssertionError("no two free ports in a row")


def replay_env(check: dict[str, Any], ledger: Path) -> list[str]:
    memory = check["memory"]
    env = {"STUB_RESIDENT_GIB": memory["resident_gib_logged"], "STUB_WEIGHTS_GIB": memory["backed_up_gib_logged"],
           "STUB_GPU_TOTAL_GIB": memory["gpu_memory_gib"], "STUB_GPU_LEDGER": ledger}
    return [f"{key}={value}" for key, value in env.items()]


def test_the_stub_told_the_records_memory_gives_the_records_verdicts(uva: dict, tmp_path: Path):
    """The record's run again, on the stub: the same cycles count, the same starts beside it (which started, which
    found too little memory), the same GPU figures of the block."""
    check = uva["check"]
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    utilizations = ",".join(str(b["utilization"]) for b in uva["besides"])
    args = [sys.executable, str(DRIVER), "--engine", "stub", "--out", str(tmp_path / "out"),
            "--cycles", str(len(check["cycles"])), "--streams", "4", "--stream-tokens", "16",
            "--port", str(two_free_ports()), "--beside", utilizations]
    for pair in replay_env(check, ledger):
        args += ["--env", pair, "--beside-env", pair]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    replayed = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "error" not in replayed, f"{replayed.get('error')}\n{done.stdout[-2000:]}"
    again = replayed["check"]
    assert again["failure"] == check["failure"] or (again["failure"] or {}).get("kind") == (
        check["failure"] or {}).get("kind")
    assert [c["same"] for c in again["cycles"]] == [c["same"] for c in check["cycles"]]
    assert [(b["started"], b["out_of_memory"]) for b in replayed["besides"]] == [
        (b["started"], b["out_of_memory"]) for b in uva["besides"]]
    assert again["memory"]["gpu_memory_gib"] == check["memory"]["gpu_memory_gib"]
    assert again["memory"]["resident_gib_logged"] == check["memory"]["resident_gib_logged"]

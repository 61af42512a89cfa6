"""The GPU machine's standby check (gpu/vllm_serve/standby_check.py), replayed here against the stub.

On the GPU machine the driver ran `vllm serve` with UVA offload and lanectl's protocol around it
(gpu/vllm_serve/standby-on-device.sh; the record is gpu/record/standby-1b/uva/). Here the same driver runs the stub
engine with the same flags, told the record's figures (the GPU's size, what it kept asleep, what a sleep took from
the host, vLLM's own sleep and wake seconds), and its report must say what the record's said: the offload line
among the startup proof, each cycle the same output with every stream finished, one start beside that fits (0.92)
and one that finds too little free memory (0.99) on a GPU the two stubs share, the verdict and the standby block.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.gpu_record import standby_report, standby_stub_env

DRIVER = REPO / "gpu" / "vllm_serve" / "standby_check.py"


def two_free_ports() -> int:
    """A port whose next one is free too: the driver starts the engine beside on port + 1."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two free ports in a row")


def test_the_gpu_driver_against_the_stub_told_the_records_figures_reports_what_the_record_did(tmp_path: Path):
    real = standby_report("uva")
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    shared = [f"STUB_GPU_LEDGER={ledger}", *(f"{key}={value}" for key, value in standby_stub_env("uva").items())]
    # The record's flags, besides and 8 streams in flight, shorter (the stub decodes 100 tok/s a stream); 4 of its
    # 12 cycles: every one of the 12 is read in tests/test_standby_record.py, and each costs 1.6 s here.
    args = [sys.executable, str(DRIVER), "--engine", "stub", "--out", str(tmp_path / "uva"),
            "--cycles", "4", "--streams", "8", "--stream-tokens", "24",
            "--port", str(two_free_ports()), "--beside", "0.92,0.99",
            "--env", "VLLM_USE_V2_MODEL_RUNNER=0", "--vllm-arg=--offload-backend", "--vllm-arg=uva",
            "--vllm-arg=--cpu-offload-gb", "--vllm-arg=1", "--vllm-arg=--cpu-offload-params",
            "--vllm-arg=gate_up_proj", "--vllm-arg=down_proj"]
    for pair in shared:
        args += ["--env", pair, "--beside-env", pair]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads((tmp_path / "uva" / "report.json").read_text())
    assert "error" not in report, f"{report.get('error')}\n{done.stdout[-2000:]}"
    assert any("Total CPU offloaded parameters: 1.0" in line for line in report["proof_lines"])
    check, recorded = report["check"], real["check"]
    assert (check["passed"], check["failure"]) == (recorded["passed"], recorded["failure"]) == (True, None)
    assert len(check["cycles"]) == 4
    assert all(c["same"] and c["in_flight"] and c["streams_ok"] == 8 for c in check["cycles"])
    assert report["logprobs_equal"] is real["logprobs_equal"] is True
    outcome = [(b["utilization"], b["started"], b["out_of_memory"]) for b in report["besides"]]
    assert outcome == [(b["utilization"], b["started"], b["out_of_memory"]) for b in real["besides"]]
    # vLLM's words from "on startup" on; the free GiB before them differ (the real start counted, besides the
    # sleeping lane's 1.02 GiB, about 0.5 GiB its own process already held).
    assert report["besides"][1]["detail"].split(" on startup ")[1] == real["besides"][1]["detail"].split(
        " on startup ")[1]
    for key in ("max_utilization_beside", "beside_utilization", "beside_fits_by_numbers"):
        assert check["memory"][key] == recorded["memory"][key], key
    # The block the record holds; weights_gib at least its figure (MemAvailable's fall here adds the box's noise).
    assert {**check["standby"], "weights_gib": None} == {**recorded["standby"], "weights_gib": None}
    assert check["standby"]["weights_gib"] >= recorded["standby"]["weights_gib"]

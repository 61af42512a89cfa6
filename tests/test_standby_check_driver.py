"""The GPU machine's standby check (gpu/vllm_serve/standby_check.py), run here against the stub as a dry run.

On the GPU machine the driver runs `vllm serve` with UVA offload and lanectl's protocol around it
(gpu/vllm_serve/standby-on-device.sh); here the same driver runs the stub engine with the same flags, so what the
record would hold is known to come out: the offload line among the startup proof, the cycles with streams in
flight, the memory figures and the block, one start beside that fits (0.92) and one that finds too little free
memory (0.99) on a GPU the two stubs share.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

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


def test_the_gpu_driver_runs_the_check_with_offload_and_two_starts_beside(tmp_path: Path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    shared = [f"STUB_GPU_LEDGER={ledger}", "STUB_GPU_TOTAL_GIB=79.19", "STUB_RESIDENT_GIB=0.98",
              "STUB_WEIGHTS_GIB=1.02"]
    args = [sys.executable, str(DRIVER), "--engine", "stub", "--out", str(tmp_path / "uva"), "--cycles", "10",
            "--streams", "4", "--stream-tokens", "24", "--port", str(two_free_ports()), "--beside", "0.92,0.99",
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
    check = report["check"]
    assert check["passed"] and len(check["cycles"]) == 10
    assert all(c["same"] and c["in_flight"] and c["streams_ok"] == 4 for c in check["cycles"])
    assert report["logprobs_equal"] is True
    assert [(b["started"], b["out_of_memory"]) for b in report["besides"]] == [(True, False), (False, True)]
    assert "less than desired GPU memory utilization (0.99" in report["besides"][1]["detail"]
    # The block from what the engine said: 0.98 GiB kept on a 79.19 GiB GPU leaves room for 0.98 of it beside.
    assert check["standby"]["resident_gib"] == 0.98 and check["standby"]["gpu_memory_gib"] == 79.19
    assert check["memory"]["max_utilization_beside"] == 0.98 and check["memory"]["beside_fits_by_numbers"] is True
    assert check["standby"]["weights_gib"] >= 1.1  # 1.02 backed up, rounded up to a tenth

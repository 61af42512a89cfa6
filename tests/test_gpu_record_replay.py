"""The stub held to the real vLLM's record (gpu/record/, made on the H200 by gpu/vllm_serve/run.py).

The same scenarios that ran against `vllm serve` there run here against the stub engine (a process, no
Docker, no GPU), and what lanectl depends on must come out the same: statuses, fields, the order of events
(health while asleep, the queued request, the death sequence and its exit code), the lines lanectl's rules
read. The record is 0.26.0 (the newest vLLM the H200 machine's torch runs); the stub speaks 0.31.0 unless
STUB_VLLM_VERSION says otherwise, and VERSION_DIFFERENCES names every fact where the two versions differ.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lanectl.health.engine_exit import EXIT_UNASKED
from tests.conftest import REPO
from tests.gpu_record import RECORD, drain_facts, facts, kill_window, load

RUN = REPO / "gpu" / "vllm_serve" / "run.py"
KV_LINES = "startup: lines that carry the KV cache size and the maximum concurrency"
# fact -> (0.26.0, 0.31.0): what the two versions print or answer differently, from 0.31.0's own code
# (the contract suite) and the record.
VERSION_DIFFERENCES: dict[str, tuple[Any, Any]] = {
    KV_LINES: (2, 1),  # 0.31.0's kv_cache_utils.py prints size and concurrency on one line
    # 0.26.0 prefixed every line a process wrote to stdout; 0.31.0's log format prefixes vLLM's own records
    # only, so uvicorn's lines (the access log too) have no "(APIServer pid=N)".
    "startup: uvicorn's startup line is printed by": ("APIServer", ""),
}
# The tiny model's run skipped the standby scenarios (the 8B run has them).
TINY_SCENARIOS = ("startup", "probe", "teacher forcing", "loadgen", "kill")


def stub_run(out: Path, version: str | None) -> dict[str, Any]:
    argv = [sys.executable, str(RUN), "--engine", "stub", "--out", str(out), "--asleep-wait", "2",
            "--budget-minutes", "1", "--port", str(_free_port())]
    if version:
        argv += ["--stub-version", version]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "VLLM_", "LANECTL_SRC"))}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert (out / "figures.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return facts(*load(out))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stub_at_026(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return stub_run(tmp_path_factory.mktemp("stub-0.26.0"), "0.26.0")


@pytest.fixture(scope="module")
def stub_default(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return stub_run(tmp_path_factory.mktemp("stub-default"), None)


def differences(real: dict[str, Any], stub: dict[str, Any], keys: list[str]) -> list[str]:
    return [f"{key}:\n    real vLLM: {real[key]!r}\n    stub:      {stub.get(key)!r}"
            for key in keys if real[key] != stub.get(key)]


def test_the_record_shows_what_lanectl_is_built_on() -> None:
    """The facts lanectl's code now assumes, as the real vLLM showed them. A new record that says otherwise
    fails here first, naming the fact, before any stub comparison."""
    real = facts(*load(RECORD / "llama-8b-dummy"))
    assert real["asleep: a completion sent while asleep is answered before the wake"] is False  # queued
    assert real["asleep: that completion's status once woken"] == 200
    assert real["sleep: /health while asleep"] == [200]
    assert real["sleep: POST /reset_prefix_cache answers"] == [(200, '{"success": true}')]
    assert real["sleep: GET /sleep"] == [405]
    assert real["kill: exit code"] == 0  # a dead vLLM exits 0: a restart policy must not wait for a failure
    assert real["kill: /health answered nothing but 200 until the port refused"] is True
    assert real["kill: then the port refuses"] is True
    for run in ("llama-8b-dummy", "llama-tiny"):
        # The record's own polls: /health still answered 200 after the engine core died, before the port closed.
        last_answer, first_refusal = kill_window(load(RECORD / run)[1])
        assert last_answer is not None and first_refusal is not None and last_answer < first_refusal, run
    assert real["kill: 'engine core exited unexpectedly' is a record of"] == ("APIServer", "WARNING", "core_client.py")
    assert real["teacher forcing: prompts unscored by ids"] == 0
    assert real[KV_LINES] == 2


@pytest.mark.parametrize("run", ["llama-8b-dummy", "llama-tiny"])
def test_the_stub_at_the_records_version_answers_as_the_real_vllm_did(run: str, stub_at_026: dict[str, Any]) -> None:
    real = facts(*load(RECORD / run))
    keys = [k for k in real if run == "llama-8b-dummy" or k.startswith(TINY_SCENARIOS)]
    assert not differences(real, stub_at_026, keys), "the stub drifted from the record:\n" + "\n".join(
        differences(real, stub_at_026, keys))


def test_the_stub_speaks_0_31_0_by_default_and_differs_from_the_0_26_0_record_only_where_vllm_changed(
        stub_default: dict[str, Any], stub_at_026: dict[str, Any]) -> None:
    changed = {key: (stub_at_026[key], stub_default[key]) for key in stub_at_026
               if stub_at_026[key] != stub_default[key]}
    assert changed == VERSION_DIFFERENCES


# -- the exit guard: the same engine, run as a lane image runs it -------------------------------------------------

GUARD_RECORD = RECORD / "exit-guard"


def guarded_real_exits() -> dict[str, Any]:
    """What the real vLLM (0.26.0, the tiny model) did under lanectl's exit guard on the H200. The call's return
    left out exit-guard-stop/figures.json (over the files one call brings back); the run printed its figures, and
    exit-guard-stop.log is that print."""
    killed = json.loads((GUARD_RECORD / "exit-guard-engine_kill" / "figures.json").read_text())["engine_kill"]
    printed = (GUARD_RECORD / "exit-guard-stop.log").read_text()
    stopped = re.search(r"^  stop\.exit_code = (\S+)$", printed, re.M)
    assert stopped, "exit-guard-stop.log holds no stop.exit_code"
    kill_log = (GUARD_RECORD / "exit-guard-engine_kill" / "engine.log").read_text()
    return {"stop: exit code": json.loads(stopped.group(1)), "kill: exit code": killed["exit_code"],
            "kill: the guard says why": "exit_guard: the engine exited 0 although nothing asked it to stop" in kill_log}


def test_under_the_exit_guard_the_stub_exits_as_the_real_vllm_did(tmp_path: Path) -> None:
    """A stop that was asked for stays 0 and an engine-core death becomes 70, with the guard's line: on the
    real vLLM (gpu/record/exit-guard) and on the stub, each run by run.py under the same guard."""
    real = guarded_real_exits()
    assert real == {"stop: exit code": 0, "kill: exit code": EXIT_UNASKED, "kill: the guard says why": True}
    stub: dict[str, Any] = {}
    for scenario in ("stop", "engine_kill"):
        out = tmp_path / scenario
        argv = [sys.executable, str(RUN), "--engine", "stub", "--exit-guard", "--out", str(out),
                "--only", f"startup,{scenario}", "--budget-minutes", "1", "--port", str(_free_port())]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "VLLM_", "LANECTL_SRC"))}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert (out / "figures.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
        figures = json.loads((out / "figures.json").read_text())
        stub[f"{'kill' if scenario == 'engine_kill' else scenario}: exit code"] = figures[scenario]["exit_code"]
        if scenario == "engine_kill":
            stub["kill: the guard says why"] = any("exit_guard: the engine exited 0 although nothing asked it to stop"
                                                   in line for line in figures[scenario]["log_after_kill"])
    assert stub == real


# -- stops and sleeps with requests in flight (issue 31): gpu/record/drain/ ------------------------------------------

DRAIN_RECORD = RECORD / "drain"
# The record's three launches (gpu/vllm_serve/on-device.sh RUN_MODELS=drain): a drain that fits (with the sleep modes
# before it), vLLM's default abort, and a drain whose deadline passes.
DRAIN_TIMEOUTS = (30, 0, 5)
DRAIN_ABSENT = ("gpu/record/drain/ is absent: the real `vllm serve` drain run (RUN_MODELS=drain bash "
                "gpu/vllm_serve/on-device.sh run, on the H200) has not been recorded yet. Until it is, the stub's "
                "stop and sleep modes are held to vLLM 0.31.0's code only (tests/contract/test_shutdown.py)")
# Whether a new request came before the port closed is a race (0.26.0's uvicorn closed it within 0.1 s).
DRAIN_RACES = ("what a new request got, when answered",)


def drain_run(timeout: int, unpacked: Path) -> Path | None:
    """The record's run at `timeout`: gpu/record/drain/drain-N/, or drain-N/ inside the archive the device call
    brings back (drain-record.tgz), unpacked under `unpacked`."""
    if (DRAIN_RECORD / f"drain-{timeout}" / "figures.json").is_file():
        return DRAIN_RECORD / f"drain-{timeout}"
    archive = DRAIN_RECORD / "drain-record.tgz"
    if not archive.is_file():
        return None
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    run = unpacked / f"drain-{timeout}"
    return run if (run / "figures.json").is_file() else None


@pytest.fixture(scope="module")
def drain_record(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    unpacked = tmp_path_factory.mktemp("drain-record")
    runs = {t: drain_run(t, unpacked) for t in DRAIN_TIMEOUTS}
    if not all(runs.values()):
        pytest.skip(DRAIN_ABSENT)
    return {t: drain_facts(*load(run), t) for t, run in runs.items() if run is not None}


def test_the_drain_record_shows_what_lanectls_stops_are_built_on(drain_record: dict[int, dict[str, Any]]) -> None:
    """On a real vllm serve: requests in flight at SIGTERM finish when the drain fits, new ones are refused while
    it drains, 0 finishes none, and a drain past its deadline kills the engine core under its requests."""
    fits, abort, short = (drain_record[t] for t in DRAIN_TIMEOUTS)
    assert fits["drain 30: the streams in flight ended"] == [("finished", 8)]
    for timeout, facts_at in drain_record.items():
        assert facts_at[f"drain {timeout}: a new request was served a token while it stopped"] is False
        assert facts_at[f"drain {timeout}: no new request was left waiting for an answer"] is True
    # The one new request the record's 0.26.0 answered came through the renderer AsyncLLM.shutdown had shut first:
    # what the stub answers a text prompt while it drains (tests/contract/test_shutdown.py holds 0.31.0's code to it).
    assert fits["drain 30: what a new request got, when answered"] == [
        (500, "cannot schedule new futures after shutdown")]
    assert fits["drain 30: the engine core is killed"] is False
    assert not any(ending == "finished" for ending, _ in abort["drain 0: the streams in flight ended"])
    assert short["drain 5: the engine core is killed"] is True
    assert not any(ending == "finished" for ending, _ in short["drain 5: the streams in flight ended"])
    assert fits["sleep mode=wait: the streams in flight ended"] == [("finished", 8)]


@pytest.mark.parametrize("timeout", DRAIN_TIMEOUTS)
def test_the_stub_stops_and_sleeps_with_requests_in_flight_as_the_real_vllm_did(
        timeout: int, drain_record: dict[int, dict[str, Any]], tmp_path: Path) -> None:
    real = drain_record[timeout]
    only = "startup,sleep_modes,drain_stop" if any(k.startswith("sleep") for k in real) else "startup,drain_stop"
    # The stub decodes 100 tok/s a stream: 800 tokens leave ~7 s of work at the signal, inside a 30 s drain and past a
    # 5 s one, as the record's requests were for the real engine. At 0 the abort races the kill: replay the record's.
    # 500 tokens a stream for the sleeps leave ~4 s of work when the sleep is asked (1 s after the streams are in
    # flight): with 200 a stream finished before a `mode=abort` sleep that a loaded machine answered late.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "VLLM_", "LANECTL_SRC"))}
    if any(ending.startswith("stalled") for ending, _ in real[f"drain {timeout}: the streams in flight ended"]):
        env["STUB_ABORT_LOST"] = "1"
    out = tmp_path / f"drain-{timeout}"
    argv = [sys.executable, str(RUN), "--engine", "stub", "--exit-guard", "--stub-version", "0.26.0", "--out", str(out),
            "--only", only, "--drain-tokens", "800", "--sleep-tokens", "500", "--budget-minutes", "1",
            "--port", str(_free_port()), "--vllm-arg=--shutdown-timeout", f"--vllm-arg={timeout}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert (out / "figures.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    stub = drain_facts(*load(out), timeout)
    keys = [k for k in real if not k.endswith(DRAIN_RACES)]
    assert not differences(real, stub, keys), "the stub drifted from the record:\n" + "\n".join(
        differences(real, stub, keys))

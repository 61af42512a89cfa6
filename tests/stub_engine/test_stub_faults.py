"""Injected faults, the admin endpoint and signal handling."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest

from .stubproc import free_port, metric, stream_events, stream_into, wait_until

FATAL_CRASH = r"^ERROR \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] EngineCore encountered a fatal error\.$"
FATAL_START = r"^ERROR \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] EngineCore failed to start\.$"
FATAL_CUDA = r"^ERROR .*\] CUDA error: an illegal memory access was encountered$"
CORE_EXITED = (r"^WARNING \d\d-\d\d \d\d:\d\d:\d\d \[core_client\.py:\d+\] \[shutdown\] MPClient: engine core exited "
               r"unexpectedly; starting cleanup$")
CORE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def _wait_running(url: str, n: int, timeout: float = 10.0) -> None:
    """Until the engine reports `n` requests running: a stream is in flight, however busy the machine."""
    deadline = time.monotonic() + timeout
    while metric(httpx.get(url + "/metrics").text, "vllm:num_requests_running") != n:
        assert time.monotonic() < deadline, f"never {n} requests running"
        time.sleep(0.02)


def _complete(url: str, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": "probe", "max_tokens": 3}, timeout=timeout)


def test_crash_follows_vllms_engine_core_death_and_exits_0(spawn) -> None:
    """The order a real vLLM showed when its engine core died (BRIEF §8): /health still 200 while
    completions answer 500 with vLLM's error, the lines, then the port closes and the process exits 0. The record's
    state between the death and the exit lasts 1 s; here 5 s, so a busy machine cannot make the test miss it."""
    p = spawn(env={"STUB_FAULT": "crash", "STUB_FAULT_AFTER_S": "0.3", "STUB_CORE_DEATH_SECONDS": "5"})
    assert httpx.get(p.url + "/health").status_code == 200  # alive until the fault fires
    p.wait_line(FATAL_CRASH, 3)
    p.wait_line(CORE_EXITED, 1)
    assert httpx.get(p.url + "/health").status_code == 200  # the API server has not noticed yet
    resp = _complete(p.url)
    assert resp.status_code == 500
    assert resp.json() == {"error": {"message": CORE_DEAD, "type": "InternalServerError", "param": None,
                                     "code": 500}}
    assert p.wait_exit(15) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(p.url + "/health")
    # A traceback is part of its record: every line repeats the record's whole header (vLLM's NewLineFormatter),
    # as the GPU record shows.
    p.wait_line(r"^ERROR .*\] Traceback \(most recent call last\):$", 1)
    p.wait_line(r"^\(APIServer pid=\d+\) ERROR .*\[async_llm\.py:\d+\] vllm\.v1\.engine\.exceptions\.EngineDeadError: "
                + re.escape(CORE_DEAD) + "$", 1, prefixed=True)
    p.wait_line(r"^\(EngineCore pid=\d+\) ERROR .*\] EngineCore encountered a fatal error\.$", 1, prefixed=True)
    order = [n for n, line in enumerate(p.lines) if "EngineCore encountered a fatal error." in line
             or "engine core exited unexpectedly" in line or "Finished server process" in line]
    assert len(order) == 3 and order == sorted(order)


def test_crash_on_start_never_listens(spawn) -> None:
    port = free_port()
    p = spawn(env={"STUB_FAULT": "crash_on_start"}, port=port, ready=False)
    assert p.wait_exit(5) == 1
    p.wait_line(FATAL_START, 1)
    assert "Starting to load model" in p.output
    assert "Uvicorn running" not in p.output and "GPU KV cache size" not in p.output
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_hang_keeps_health_but_generates_nothing(spawn) -> None:
    p = spawn(env={"STUB_FAULT": "hang"})
    time.sleep(0.1)  # the fault fires right after ready
    assert httpx.get(p.url + "/health").status_code == 200
    assert httpx.get(p.url + "/v1/models").status_code == 200
    got: list[str] = []
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST",
            p.url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 3, "stream": True},
            timeout=httpx.Timeout(5.0, read=2.0),
        ) as resp,
    ):
        for line in resp.iter_lines():
            got.append(line)
    assert got == []
    assert httpx.get(p.url + "/health").status_code == 200
    assert p.proc.poll() is None


def test_unhealthy_answers_503(spawn) -> None:
    p = spawn(env={"STUB_FAULT": "unhealthy"})
    p.wait_line(r"^WARNING .*Stub engine marked unhealthy")
    assert httpx.get(p.url + "/health").status_code == 503
    resp = _complete(p.url)
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "EngineDeadError"
    assert p.proc.poll() is None
    assert "EngineCore encountered a fatal error." not in p.output  # health alone must catch it


def test_fatal_log_keeps_serving(spawn) -> None:
    p = spawn(env={"STUB_FAULT": "fatal_log", "STUB_FAULT_AFTER_S": "0.1"})
    p.wait_line(FATAL_CUDA, 3)
    assert _complete(p.url).status_code == 200
    assert httpx.get(p.url + "/health").status_code == 200


def test_slow_start_uses_slow_start_seconds(spawn) -> None:
    p = spawn(env={"STUB_FAULT": "slow_start", "STUB_SLOW_START_SECONDS": "1.2"}, ready=False)
    time.sleep(0.6)
    assert "Application startup complete." not in p.output  # STUB_LOAD_SECONDS (0.2) would be done by now
    p.wait_ready(5)
    assert time.monotonic() - p.started >= 1.2


def test_autotune_stall_never_becomes_ready(spawn) -> None:
    p = spawn(env={"STUB_AUTOTUNE_STALL": "1"}, ready=False)
    p.wait_line(r"flashinfer\.jit: \[Autotuner\]: Autotuning process starts \.\.\.$", 3)
    time.sleep(1.0)
    assert p.proc.poll() is None
    out = p.output
    assert "Application startup complete." not in out
    assert "Autotuning process ends" not in out
    # The cache is loaded first, as vLLM 0.31.0's flashinfer_autotune() does; then the tuning starts, and stalls.
    assert "[Autotuner]: Loaded 210 configs from " in out
    assert out.rstrip().endswith("Autotuning process starts ...")
    p.signal(signal.SIGTERM)  # a stalled load still stops at once
    assert p.wait_exit(2) == 0


def test_admin_endpoint_drives_faults(spawn) -> None:
    p = spawn(env={"STUB_ADMIN": "1"})
    admin = p.url + "/admin/fault"
    assert httpx.post(admin, json={"fault": "bogus"}).status_code == 400

    assert httpx.post(admin, json={"fault": "hang"}).json()["mode"] == "hang"
    result: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: result.append(_complete(p.url)))
    waiter.start()
    waiter.join(0.7)
    assert waiter.is_alive() and httpx.get(p.url + "/health").status_code == 200
    assert httpx.post(admin, json={"fault": "clear"}).json()["mode"] == "ok"
    waiter.join(5)
    assert result and result[0].status_code == 200

    httpx.post(admin, json={"fault": "unhealthy"})
    assert httpx.get(p.url + "/health").status_code == 503
    httpx.post(admin, json={"fault": "clear"})
    assert httpx.get(p.url + "/health").status_code == 200 and _complete(p.url).status_code == 200

    httpx.post(admin, json={"fault": "fatal_log"})
    p.wait_line(FATAL_CUDA, 2)

    assert httpx.post(admin, json={"fault": "crash"}).status_code == 200
    assert p.wait_exit(5) == 0  # vLLM's API server exits 0 after its engine core died
    p.wait_line(FATAL_CRASH, 1)
    p.wait_line(CORE_EXITED, 1)


def test_unhealthy_fails_requests_in_flight(spawn) -> None:
    p = spawn(env={"STUB_ADMIN": "1", "STUB_DECODE_TOKENS_PER_S": "50"})
    events: list = []

    def run() -> None:
        events.extend(e for _, e in stream_events(p.url, "/v1/completions", {"prompt": "x", "max_tokens": 500}))

    t = threading.Thread(target=run)
    t.start()
    _wait_running(p.url, 1)
    httpx.post(p.url + "/admin/fault", json={"fault": "unhealthy"})
    t.join(30)
    assert not t.is_alive()
    assert events[-2]["error"]["type"] == "EngineDeadError" and events[-1] == "[DONE]"
    # It was cut short by the fault: a request left to run delivers all 500 tokens (10 s at 50 tok/s).
    assert len(events) < 500
    assert not any(isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason") for e in events)


@pytest.mark.parametrize("phase", ["ready", "loading", "streaming"])
def test_sigterm_exits_0_and_cuts_nothing_short_but_what_was_in_flight(spawn, phase: str) -> None:
    """A stop at vLLM's default --shutdown-timeout 0, asserted by what it did, not how long it took: the load never
    finishes, an idle server shuts down, a stream in flight ends aborted (test_stub_shutdown.py has the drains)."""
    if phase == "loading":
        p = spawn(env={"STUB_LOAD_SECONDS": "30"}, ready=False)
        p.wait_line("Starting to load model")
    else:
        p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "20"})
    events: list = []
    reader = threading.Thread(target=lambda: stream_into(lambda _, e: events.append(e), p.url, "/v1/completions",
                                                         {"prompt": "x", "max_tokens": 500,
                                                          "stream_options": {"include_usage": True}}, timeout=120))
    if phase == "streaming":
        reader.start()
        wait_until(lambda: any(isinstance(e, dict) and e["choices"] for e in events), what="a token")
    p.signal(signal.SIGTERM)
    assert p.wait_exit(120) == 0
    p.wait_line(r"^INFO:     Shutting down$", 1)
    if phase == "loading":
        assert "Application startup complete." not in p.output, "the load went on after the stop"
    if phase == "streaming":
        reader.join(120)
        finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e["choices"]]
        assert finishes[-1] == "abort" and events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] < 500, "the stop cut the stream short"

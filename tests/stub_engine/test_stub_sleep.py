"""vLLM's sleep mode in the stub: the development routes, their timing, their log lines and their faults."""

from __future__ import annotations

import contextlib
import re
import threading
import time

import httpx
import pytest

from .stubproc import stream_events

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SLEEP_MODE = ["--enable-sleep-mode"]
FATAL_CRASH = r"^ERROR .*\] EngineCore encountered a fatal error\.$"


def _text(url: str, prompt: str = "fingerprint") -> str:
    reply = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}, timeout=10)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def _is_sleeping(url: str) -> bool:
    reply = httpx.get(url + "/is_sleeping", timeout=5)
    assert reply.status_code == 200, reply.text
    return bool(reply.json()["is_sleeping"])


def _post(url: str, path: str, timeout: float = 10) -> httpx.Response:
    return httpx.post(url + path, timeout=timeout)


@pytest.mark.parametrize("env,args", [({}, SLEEP_MODE), ({"VLLM_SERVER_DEV_MODE": "0"}, SLEEP_MODE), ({}, [])])
def test_dev_routes_are_not_mounted_without_dev_mode(spawn, env, args) -> None:
    p = spawn(env=env, args=args)
    assert httpx.get(p.url + "/is_sleeping").status_code == 404
    for path in ("/sleep", "/wake_up", "/reset_prefix_cache"):
        assert _post(p.url, path).status_code == 404, path
    assert "SECURITY WARNING" not in p.output
    assert _text(p.url)  # nothing was put to sleep


def test_dev_mode_without_sleep_mode_refuses_to_sleep(spawn) -> None:
    p = spawn(env=DEV)
    p.wait_line(r"^WARNING .*SECURITY WARNING: Development endpoints are enabled!")
    refused = _post(p.url, "/sleep?level=1")
    assert refused.status_code == 400 and "--enable-sleep-mode" in refused.json()["error"]["message"]
    assert _is_sleeping(p.url) is False
    assert _text(p.url)


def test_sleep_and_wake_keep_the_process_port_and_tokens(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0.05", "STUB_WAKE_SECONDS": "0.05"}, args=SLEEP_MODE)
    assert "--enable-sleep-mode" not in p.output, "a flag the stub models is not listed as ignored"
    before = _text(p.url)
    assert _is_sleeping(p.url) is False

    slept = _post(p.url, "/reset_prefix_cache"), _post(p.url, "/sleep?level=1")
    assert [(r.status_code, r.content) for r in slept] == [(200, b""), (200, b"")]
    assert _is_sleeping(p.url) is True
    p.wait_line(r"^INFO .*\] Sleep mode freed \d+\.\d\d GiB memory, 1\.00 GiB memory is still in use\.$")
    p.wait_line(r"^INFO .*\] It took \d+\.\d{6} seconds to fall asleep\.$")
    asleep = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=5)
    assert asleep.status_code == 503 and asleep.json()["error"]["type"] == "EngineSleepingError"
    assert httpx.get(p.url + "/health").status_code == 200  # vLLM's /health does not report sleep
    assert httpx.get(p.url + "/v1/models").status_code == 200
    assert _post(p.url, "/sleep?level=1").status_code == 200  # asleep already: a warning, not an error
    p.wait_line(r"^WARNING .*Executor is already sleeping\.$")

    woken = _post(p.url, "/wake_up")
    assert (woken.status_code, woken.content) == (200, b"")
    p.wait_line(r"^INFO .*\] It took \d+\.\d{6} seconds to wake up tags \['weights', 'kv_cache'\]\.$")
    assert _is_sleeping(p.url) is False
    assert _text(p.url) == before, "a level-1 wake restores the same weights"
    assert _post(p.url, "/wake_up").status_code == 200
    p.wait_line(r"^WARNING .*Executor is not sleeping\.$")


def test_sleep_and_wake_take_the_configured_times(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0.4", "STUB_WAKE_SECONDS": "0.8"}, args=SLEEP_MODE)
    started = time.monotonic()
    assert _post(p.url, "/sleep").status_code == 200
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    assert _post(p.url, "/wake_up").status_code == 200
    assert time.monotonic() - started >= 0.8
    took = re.search(r"It took (\d+\.\d+) seconds to wake up", p.output)
    assert took and float(took.group(1)) >= 0.8


def test_sleep_aborts_requests_in_flight(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_DECODE_TOKENS_PER_S": "20"}, args=SLEEP_MODE)
    events: list = []

    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):
            events.extend(e for _, e in stream_events(p.url, "/v1/completions", {"prompt": "x", "max_tokens": 400}))

    stream = threading.Thread(target=run)
    stream.start()
    p.wait_line(r'"POST /v1/completions HTTP/1\.1" 200')
    assert _post(p.url, "/sleep").status_code == 200
    stream.join(15)
    assert not stream.is_alive()
    assert events[-2]["error"]["type"] == "EngineSleepingError" and events[-1] == "[DONE]"


@pytest.mark.parametrize("query", ["level=3", "level=x"])
def test_sleep_refuses_a_bad_level(spawn, query) -> None:
    p = spawn(env=DEV, args=SLEEP_MODE)
    assert _post(p.url, f"/sleep?{query}").status_code == 400
    assert _is_sleeping(p.url) is False


def test_level_2_wakes_to_different_tokens(spawn) -> None:
    """Level 2 drops the weights; waking without reloading them serves garbage (vllm#29341)."""
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"}, args=SLEEP_MODE)
    before = _text(p.url)
    assert _post(p.url, "/sleep?level=2").status_code == 200
    assert _post(p.url, "/wake_up").status_code == 200
    assert _text(p.url) != before


def test_fault_wake_fail_stays_asleep(spawn) -> None:
    p = spawn(env={**DEV, "STUB_FAULT": "wake_fail", "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"},
              args=SLEEP_MODE)
    assert _text(p.url)  # the fault leaves an awake engine alone
    assert _post(p.url, "/sleep").status_code == 200
    failed = _post(p.url, "/wake_up")
    assert failed.status_code == 500 and "out of memory" in failed.json()["error"]["message"]
    p.wait_line(r"^ERROR .*Failed to wake up: CUDA error: out of memory")
    assert _is_sleeping(p.url) is True
    assert p.proc.poll() is None


def test_fault_wake_altered_answers_healthy_with_other_tokens(spawn) -> None:
    p = spawn(env={**DEV, "STUB_FAULT": "wake_altered", "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"},
              args=SLEEP_MODE)
    before = _text(p.url)
    assert _post(p.url, "/sleep").status_code == 200
    assert _post(p.url, "/wake_up").status_code == 200
    assert _is_sleeping(p.url) is False and httpx.get(p.url + "/health").status_code == 200
    assert _text(p.url) != before


def test_fault_die_asleep_exits_after_falling_asleep(spawn) -> None:
    p = spawn(env={**DEV, "STUB_FAULT": "die_asleep", "STUB_FAULT_AFTER_S": "0.2", "STUB_SLEEP_SECONDS": "0"},
              args=SLEEP_MODE)
    time.sleep(0.4)
    assert p.proc.poll() is None, "it dies only once asleep"
    assert _text(p.url)
    assert _post(p.url, "/sleep").status_code == 200
    assert p.wait_exit(5) == 0  # as any engine-core death: vLLM's API server exits 0
    p.wait_line(FATAL_CRASH, 1)
    assert "died while asleep" in p.output
    assert "engine core exited unexpectedly" in p.output


def test_enable_sleep_mode_takes_no_value(spawn) -> None:
    p = spawn(args=["--enable-sleep-mode", "yes"], ready=False)
    assert p.wait_exit(5) == 2
    assert "--enable-sleep-mode takes no value" in p.output

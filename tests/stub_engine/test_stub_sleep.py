"""vLLM's sleep mode in the stub: the development routes, their timing, their log lines and their faults."""

from __future__ import annotations

import contextlib
import re
import threading
import time

import httpx
import pytest

from .stubproc import stream_into, wait_until

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

    reset, slept = _post(p.url, "/reset_prefix_cache"), _post(p.url, "/sleep?level=1")
    assert (reset.status_code, reset.json()) == (200, {"success": True})
    assert (slept.status_code, slept.content) == (200, b"")
    assert _is_sleeping(p.url) is True
    p.wait_line(r"^INFO .*\] Sleep mode freed \d+\.\d\d GiB memory, 1\.00 GiB memory is still in use\.$")
    p.wait_line(r"^INFO .*\] It took \d+\.\d{6} seconds to fall asleep\.$")
    assert httpx.get(p.url + "/health").status_code == 200  # vLLM's /health does not report sleep
    assert httpx.get(p.url + "/v1/models").status_code == 200
    assert _post(p.url, "/sleep?level=1").status_code == 200  # asleep already: a warning, not an error
    p.wait_line(r"^WARNING .*Executor is already sleeping\.$")

    woken = _post(p.url, "/wake_up")
    assert (woken.status_code, woken.content) == (200, b"")
    p.wait_line(r"^INFO .*\] It took \d+\.\d{6} seconds to wake up tags \{'weights', 'kv_cache'\}\.$")
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
    # The stub logs this before it answers, but the test reads its output on another thread: wait for the
    # line rather than read what has arrived so far (under load it may not have yet).
    took = p.wait_line(r"It took (\d+\.\d+) seconds to wake up")
    assert float(took.group(1)) >= 0.8


def _stream_in_background(url: str, max_tokens: int, out: list) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):
            stream_into(lambda _, event: out.append(event), url, "/v1/completions", {
                "prompt": "x", "max_tokens": max_tokens, "stream_options": {"include_usage": True}})

    stream = threading.Thread(target=run)
    stream.start()
    return stream


def test_sleep_aborts_requests_in_flight(spawn) -> None:
    """The default mode (abort) ends each request in flight as vLLM does: finish_reason "abort", no error."""
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_DECODE_TOKENS_PER_S": "20"}, args=SLEEP_MODE)
    events: list = []
    stream = _stream_in_background(p.url, 400, events)
    # In flight: a token came (a request aborted before its first token ends without a finish_reason, as vLLM's
    # stream skips an empty last chunk).
    wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events))
    assert _post(p.url, "/sleep").status_code == 200
    stream.join(15)
    assert not stream.is_alive()
    last, usage, done = events[-3:]
    assert last["choices"][0]["finish_reason"] == "abort" and last["choices"][0]["text"] == ""
    assert usage["usage"]["completion_tokens"] < 400 and done == "[DONE]"
    assert not any("error" in e for e in events if isinstance(e, dict))


def _complete_in_background(url: str, out: list, timeout: float = 30) -> threading.Thread:
    def run() -> None:
        reply = httpx.post(url + "/v1/completions", json={"prompt": "queued", "max_tokens": 3}, timeout=timeout)
        out.append((time.monotonic(), reply))

    request = threading.Thread(target=run)
    request.start()
    return request


def test_a_request_sent_while_asleep_waits_and_is_served_once_woken(spawn) -> None:
    """vLLM's pause_scheduler: "All pause modes queue new adds". The GPU record saw no answer in 6 s."""
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"}, args=SLEEP_MODE)
    awake_text = _text(p.url, "queued")
    assert _post(p.url, "/sleep?level=1").status_code == 200
    answers: list = []
    request = _complete_in_background(p.url, answers)
    request.join(1.5)
    assert request.is_alive() and not answers, "a sleeping engine answers nothing: the request waits"
    assert httpx.get(p.url + "/health").status_code == 200
    assert httpx.get(p.url + "/v1/models").status_code == 200
    waiting = httpx.get(p.url + "/metrics").text
    assert re.search(r"^vllm:num_requests_waiting\{[^}]*\} 1\.0$", waiting, re.M), waiting
    woken_at = time.monotonic()
    assert _post(p.url, "/wake_up").status_code == 200
    request.join(10)
    answered_at, reply = answers[0]
    assert reply.status_code == 200 and answered_at >= woken_at
    assert awake_text.startswith(reply.json()["choices"][0]["text"])


def test_sleep_refuses_setting_answers_503_at_once(spawn) -> None:
    """STUB_SLEEP_REFUSES=1: the stub's former shape, kept for a test of a client that must give up."""
    p = spawn(env={**DEV, "STUB_SLEEP_REFUSES": "1", "STUB_SLEEP_SECONDS": "0"}, args=SLEEP_MODE)
    assert _post(p.url, "/sleep").status_code == 200
    refused = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=5)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "EngineSleepingError"


def test_level_0_pauses_without_moving_memory(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"})  # no --enable-sleep-mode needed
    assert _post(p.url, "/sleep?level=0").status_code == 200
    assert _is_sleeping(p.url) is True
    assert "Sleep mode freed" not in p.output
    assert _sleep_state(p.url) == {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    answers: list = []
    request = _complete_in_background(p.url, answers)
    request.join(1)
    assert request.is_alive()
    assert _post(p.url, "/wake_up?tags=scheduling").status_code == 200
    request.join(10)
    assert answers[0][1].status_code == 200
    assert _is_sleeping(p.url) is False
    assert _sleep_state(p.url) == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}


def _sleep_state(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    found = re.findall(r'^vllm:engine_sleep_state\{[^}]*sleep_state="(\w+)"\} (\S+)$', text, re.M)
    return {state: float(value) for state, value in found}


def test_partial_wake_stays_asleep_until_every_tag_is_up(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"}, args=SLEEP_MODE)
    assert _sleep_state(p.url) == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    assert _post(p.url, "/sleep?level=1").status_code == 200
    assert _sleep_state(p.url) == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    assert _post(p.url, "/wake_up?tags=weights").status_code == 200
    p.wait_line(r"^INFO .*\] It took \d+\.\d{6} seconds to wake up tags \['weights'\]\.$")
    assert _is_sleeping(p.url) is True, "the KV cache still sleeps"
    assert _sleep_state(p.url)["awake"] == 0.0
    answers: list = []
    request = _complete_in_background(p.url, answers)
    request.join(1)
    assert request.is_alive(), "requests stay queued after a partial wake"
    assert _post(p.url, "/wake_up?tags=weights").status_code == 200  # woken already: a warning
    p.wait_line(r"^WARNING .*Tag weights is not in sleeping tags \{'kv_cache'\}$")
    assert _post(p.url, "/wake_up?tags=kv_cache").status_code == 200
    request.join(10)
    assert answers[0][1].status_code == 200
    assert _is_sleeping(p.url) is False
    assert _sleep_state(p.url) == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}


def test_level_2_sleep_state(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0"}, args=SLEEP_MODE)
    assert _post(p.url, "/sleep?level=2").status_code == 200
    assert _sleep_state(p.url) == {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}


def test_mode_wait_lets_requests_in_flight_finish(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_DECODE_TOKENS_PER_S": "50"}, args=SLEEP_MODE)
    events: list = []
    stream = _stream_in_background(p.url, 40, events)
    wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events))  # running: a token came
    assert _post(p.url, "/sleep?level=1&mode=wait", timeout=30).status_code == 200
    assert not stream.is_alive() or stream.join(5) is None
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e["choices"]]
    assert finishes[-1] == "length" and "abort" not in finishes
    p.wait_line(r"Waiting for in-flight requests to complete before sleeping\.\.\.$")
    assert _is_sleeping(p.url) is True


def test_mode_keep_holds_requests_in_flight_and_continues_them(spawn) -> None:
    p = spawn(env={**DEV, "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0", "STUB_DECODE_TOKENS_PER_S": "50"},
              args=SLEEP_MODE)
    events: list = []
    stream = _stream_in_background(p.url, 40, events)
    wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events))  # running: a token came
    assert _post(p.url, "/sleep?level=1&mode=keep").status_code == 200
    stream.join(1)
    assert stream.is_alive(), "kept, not finished"
    assert _post(p.url, "/wake_up").status_code == 200
    stream.join(15)
    assert events[-2]["usage"]["completion_tokens"] == 40
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e["choices"]]
    assert finishes[-1] == "length"


def test_mode_other_than_abort_wait_keep_is_refused(spawn) -> None:
    """As vLLM 0.31.0 fails it: the engine core's utility call fails, and the API server answers 500 with the
    failure (the contract suite holds this to vLLM's own error handler)."""
    p = spawn(env=DEV, args=SLEEP_MODE)
    refused = _post(p.url, "/sleep?level=1&mode=drain")
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        500, "Call to sleep method failed: Invalid pause mode: drain")
    p.wait_line(r"^ERROR .*\[core\.py:\d+\] Invocation of sleep method failed$")
    assert _is_sleeping(p.url) is False


def test_get_on_a_post_route_is_405(spawn) -> None:
    p = spawn(env=DEV, args=SLEEP_MODE)
    for path in ("/sleep", "/wake_up", "/reset_prefix_cache"):
        reply = httpx.get(p.url + path)
        assert (reply.status_code, reply.json(), reply.headers["allow"]) == (405, {"detail": "Method Not Allowed"},
                                                                              "POST"), path
    assert httpx.post(p.url + "/is_sleeping").status_code == 405


def test_reset_prefix_cache_fails_while_blocks_are_held(spawn) -> None:
    """vLLM answers 200 {"success": false} while running requests hold blocks, and under the fault."""
    p = spawn(env={**DEV, "STUB_DECODE_TOKENS_PER_S": "20"}, args=SLEEP_MODE)
    events: list = []
    stream = _stream_in_background(p.url, 400, events)
    # Running, so holding blocks: a token came. The access line is written once the response starts, which can be
    # before the engine scheduled the request (a waiting request holds no block, and the reset then succeeds).
    wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events))
    held = _post(p.url, "/reset_prefix_cache")
    assert (held.status_code, held.json()) == (200, {"success": False})
    preempted = _post(p.url, "/reset_prefix_cache?reset_running_requests=true")
    assert preempted.json() == {"success": True}
    p.wait_line(r"^INFO .*\] Resetting prefix cache\.\.\.$")
    q = spawn(env={**DEV, "STUB_FAULT": "prefix_cache_held"}, args=SLEEP_MODE)
    assert _post(q.url, "/reset_prefix_cache").json() == {"success": False}
    p.kill()
    stream.join(5)


@pytest.mark.parametrize("query", ["level=3", "level=x", "level=-1"])
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

"""Decode timing of the batched step loop, asserted in what holds on a busy shared CI machine: the
engine steps and tokens the stub counted, the step time its configuration sets, and rates in a band
that only a wrong step loop leaves (the loop never runs ahead of its schedule by more than its 100 ms
catch-up; load only slows it). How close the rates come to the configured ones is a figure printed by
benchmarks/bench_client.py (`make bench`)."""

from __future__ import annotations

import threading

import httpx
import pytest

from .stubproc import metric, stream_events

RATE = 200.0
TOKENS = 80


def _rate(url: str, prompt: str, out: list[float] | None = None) -> float:
    events = stream_events(url, "/v1/completions", {"prompt": prompt, "max_tokens": TOKENS})
    times = [t for t, e in events if e != "[DONE]"]
    assert len(times) == TOKENS
    # From token 10 on: the first tokens of a connection carry one-off client and server latency.
    rate = (len(times) - 11) / (times[-1] - times[10])
    if out is not None:
        out.append(rate)
    return rate


def _counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    return metric(text, "vllm:generation_tokens_total"), metric(text, "stub:engine_steps_total")


def _in_band(rate: float, configured: float) -> bool:
    return configured / 5 < rate < configured * 1.5


def test_single_stream_decode_rate(spawn) -> None:
    from stubengine import config

    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    rate = _rate(p.url, "warm up")
    # One stream: one token per engine step, and steps paced at the configured rate.
    assert _counters(p.url) == (TOKENS, TOKENS)
    assert _in_band(rate, RATE), rate
    # STUB_STEP_MS overrides the rate: 4 ms per step is 250 tok/s.
    env = {"STUB_DECODE_TOKENS_PER_S": str(RATE), "STUB_STEP_MS": "4"}
    assert config.load(["serve", "/model"], env).step_seconds == pytest.approx(0.004)
    assert config.load(["serve", "/model"], {"STUB_DECODE_TOKENS_PER_S": str(RATE)}).step_seconds == 1 / RATE
    q = spawn(env=env)
    rate = _rate(q.url, "x")
    assert _counters(q.url) == (TOKENS, TOKENS)
    assert _in_band(rate, 250.0), rate


def test_concurrent_streams_share_steps(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    single = _rate(p.url, "single")
    tokens0, steps0 = _counters(p.url)
    rates: list[float] = []
    threads = [threading.Thread(target=_rate, args=(p.url, f"stream {i}", rates)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(rates) == 4
    tokens, steps = _counters(p.url)
    # The four streams share engine steps: 320 tokens in 80 steps if all four arrived in the same step;
    # 160 would take arrivals 400 ms apart. A loop that stepped each stream alone would take 320.
    assert tokens - tokens0 == 4 * TOKENS
    assert TOKENS <= steps - steps0 < 2 * TOKENS
    # So every stream keeps the single-stream rate, and the aggregate grows with the streams.
    assert _in_band(single, RATE) and all(_in_band(r, RATE) for r in rates), (single, rates)

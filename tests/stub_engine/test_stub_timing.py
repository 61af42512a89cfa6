"""Decode timing of the batched step loop. Bounds are loose (15%): CI machines are shared and noisy;
exact figures belong to the benchmarks, these only catch a step loop that is wrong."""

from __future__ import annotations

import threading

import pytest

from .stubproc import stream_events

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


def test_single_stream_decode_rate(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    assert _rate(p.url, "warm up") == pytest.approx(RATE, rel=0.15)
    # STUB_STEP_MS overrides the rate: 4 ms per step is 250 tok/s.
    q = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE), "STUB_STEP_MS": "4"})
    assert _rate(q.url, "x") == pytest.approx(250.0, rel=0.15)


def test_concurrent_streams_share_steps(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    single = _rate(p.url, "single")
    rates: list[float] = []
    threads = [threading.Thread(target=_rate, args=(p.url, f"stream {i}", rates)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(rates) == 4
    # Every stream keeps the single-stream rate, so the aggregate is four times it.
    assert sum(rates) == pytest.approx(4 * single, rel=0.15)
    assert min(rates) == pytest.approx(single, rel=0.15)

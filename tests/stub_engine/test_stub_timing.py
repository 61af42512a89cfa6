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


def _rate(url: str, prompt: str, out: list[tuple[float, int]] | None = None) -> tuple[float, int]:
    """A stream's decode rate in tokens/s, and how many chunks (engine steps) brought its tokens."""
    events = stream_events(url, "/v1/completions", {"prompt": prompt, "max_tokens": TOKENS, "logprobs": 0})
    chunks = [(t, len(e["choices"][0]["logprobs"]["tokens"])) for t, e in events if e != "[DONE]"]
    assert sum(n for _, n in chunks) == TOKENS
    # From chunk 3 on: the first chunks of a connection carry one-off client and server latency.
    rate = sum(n for _, n in chunks[4:]) / (chunks[-1][0] - chunks[3][0])
    if out is not None:
        out.append((rate, len(chunks)))
    return rate, len(chunks)


def _counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    return metric(text, "vllm:generation_tokens_total"), metric(text, "stub:engine_steps_total")


def _in_band(rate: float, configured: float) -> bool:
    return configured / 5 < rate < configured * 1.5


def test_single_stream_decode_rate(spawn) -> None:
    from stubengine import config

    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    rate, chunks = _rate(p.url, "warm up")
    # One stream: one chunk per engine step, each with its accepted tokens, at the configured token rate.
    assert _counters(p.url) == (TOKENS, chunks) and chunks < TOKENS / 2
    assert _in_band(rate, RATE), rate
    # The rate is tokens/s: a step lasts its mean tokens (2.9 at k=5) at that rate; 1/rate without drafts.
    assert config.load(["serve", "/model"], {"STUB_DECODE_TOKENS_PER_S": str(RATE)}).step_seconds == \
        pytest.approx(2.9 / RATE)
    plain = {"STUB_DECODE_TOKENS_PER_S": str(RATE), "STUB_NUM_SPECULATIVE_TOKENS": "0"}
    assert config.load(["serve", "/model"], plain).step_seconds == 1 / RATE
    # STUB_STEP_MS overrides the rate: 4 ms per step of one token is 250 tok/s.
    env = {**plain, "STUB_STEP_MS": "4"}
    assert config.load(["serve", "/model"], env).step_seconds == pytest.approx(0.004)
    q = spawn(env=env)
    rate, chunks = _rate(q.url, "x")
    assert _counters(q.url) == (TOKENS, TOKENS) and chunks == TOKENS
    assert _in_band(rate, 250.0), rate


def test_concurrent_streams_share_steps(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": str(RATE)})
    single, _ = _rate(p.url, "single")
    tokens0, steps0 = _counters(p.url)
    streams: list[tuple[float, int]] = []
    threads = [threading.Thread(target=_rate, args=(p.url, f"stream {i}", streams)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(streams) == 4
    tokens, steps = _counters(p.url)
    # The four streams share engine steps: as few steps as the longest stream has chunks if all four
    # arrived in the same step; a loop that stepped each stream alone would take all their chunks.
    chunks = [n for _, n in streams]
    assert tokens - tokens0 == 4 * TOKENS
    assert max(chunks) <= steps - steps0 < sum(chunks)
    # So no stream is held back to a fraction of the rate. Only the lower edge of the band: four reader threads
    # in one busy test process get their chunks late and then in a burst, which reads as a rate above the
    # engine's (288 and 479 tok/s at 200 in one CI run), however exactly the engine kept its schedule.
    rates = [r for r, _ in streams]
    assert _in_band(single, RATE) and all(r > RATE / 5 for r in rates), (single, rates)

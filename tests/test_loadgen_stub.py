"""The load generator against real stub-engine processes on 127.0.0.1.

CI shares a 2-core machine with other work, so these tests assert what holds at any load: the tokens
and engine steps the stub counted, and figures recomputed from the chunk timestamps the client
received. How close the measured rates come to the stub's configured rate is a figure, printed by
benchmarks/bench_client.py (`make bench`); these tests catch a client that measures the wrong thing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from lanectl.bench.loadgen import ArmResult, run_arm
from tests.stub_engine.stubproc import MODEL_NAME, StubProcess, free_port, metric, stub_spawner

Spawn = Callable[..., StubProcess]
PROMPTS = [f"Explain step {i} of a rolling restart." for i in range(8)]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    with stub_spawner({"STUB_STATS_INTERVAL_S": "0"}) as spawn_stub:
        yield spawn_stub


def _counters(url: str) -> tuple[float, float]:
    """The stub's own count of generated tokens and of engine steps: exact at any load."""
    text = httpx.get(url + "/metrics").text
    return metric(text, "vllm:generation_tokens_total"), metric(text, "stub:engine_steps_total")


def _assert_figures_come_from_its_chunks(arm: ArmResult, tokens: int) -> None:
    """Every token arrived in a timed chunk (several to a chunk: a speculative step's accepted tokens), the
    usage chunk gave the count, and each figure is the arithmetic on those times."""
    for r in arm.results:
        assert r.output_tokens == tokens and len(r.chunk_times_s) < tokens
        assert r.started_s <= r.chunk_times_s[0]
        assert list(r.chunk_times_s) == sorted(r.chunk_times_s) and r.chunk_times_s[-1] <= r.finished_s
        assert r.finished_s <= arm.wall_time_s + 1e-6  # the window closed at the last finish
    decode_time = sum(r.chunk_times_s[-1] - r.chunk_times_s[0] for r in arm.results)
    steps = sum(len(r.chunk_times_s) - 1 for r in arm.results)
    # Streams still running when the window closed are cut; their chunks inside the window count too.
    assert arm.output_tokens == tokens * len(arm.results) + arm.cut_output_tokens
    assert arm.output_tok_per_s == pytest.approx(arm.output_tokens / arm.wall_time_s, rel=1e-9)
    assert arm.decode_tok_per_s == pytest.approx((tokens - 1) * len(arm.results) / decode_time, rel=1e-9)
    assert arm.ms_per_step == pytest.approx(decode_time / steps * 1000, rel=1e-9)
    assert arm.ttft_p50_ms is not None and arm.ttft_p50_ms > 0


def test_one_and_eight_streams_measure_the_configured_rate(spawn: Spawn) -> None:
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "100"})
    tokens0, steps0 = _counters(stub.url)
    one = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=1, requests=2, max_tokens=100, warmup=1)
    tokens1, steps1 = _counters(stub.url)
    assert (one.failed, one.requests, one.cut) == (0, 2, 0)
    assert [r.output_tokens for r in one.results] == [100, 100]
    _assert_figures_come_from_its_chunks(one, 100)
    # One stream: every engine step made one chunk of one or more tokens, warm-up (1 request) included.
    assert tokens1 - tokens0 == 300
    assert sum(len(r.chunk_times_s) for r in one.results) < steps1 - steps0 < 300
    # The stub never runs a step in under its 10 ms and load only slows it down, so a per-stream rate far
    # above 100 tok/s, or far below it, is a client that times or counts the wrong thing (a unit, a clock,
    # tokens of all streams over one stream's time), not a busy machine.
    assert one.decode_tok_per_s is not None and 100 / 5 < one.decode_tok_per_s < 100 * 1.5

    eight = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=8, requests=8, max_tokens=100, warmup=8)
    tokens2, steps2 = _counters(stub.url)
    assert (eight.failed, eight.requests) == (0, 8)
    assert {r.prompt_index for r in eight.results} == set(range(8))
    _assert_figures_come_from_its_chunks(eight, 100)
    # Concurrent streams share engine steps: 16 requests of 100 tokens (plus the streams cut at each
    # phase's close) took as many steps as a few streams have chunks, not as all 16 have. Each phase's
    # eight requests start together, so it is one stream's chunks if they all arrive in the same step.
    assert tokens2 - tokens1 >= 1600
    chunks = [len(r.chunk_times_s) for r in eight.results]
    assert 2 * min(chunks) <= steps2 - steps1 < sum(chunks)
    # So every stream keeps the single-stream step, and all eight together deliver several times one stream.
    assert eight.decode_tok_per_s is not None and 100 / 5 < eight.decode_tok_per_s < 100 * 1.5
    assert eight.output_tok_per_s > 2 * one.output_tok_per_s


def test_multi_token_chunks_are_counted_as_their_tokens(spawn: Spawn) -> None:
    """A speculative engine sends a step's accepted tokens in one chunk: decode tok/s and the token counts
    come from the tokens (usage, logprobs entries), ms/step from the chunks. Counting chunks as tokens would
    report a third of the rate."""
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "100"})
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=1, requests=2, max_tokens=100, warmup=0, logprobs=0)
    assert arm.failed == 0
    for r in arm.results:
        assert r.output_tokens == sum(r.chunk_tokens) == 100 and r.chunk_tokens[0] == r.first_chunk_tokens == 1
        assert max(r.chunk_tokens) > 1 and len(r.chunk_times_s) < 50
    decoded = sum(r.output_tokens - r.chunk_tokens[0] for r in arm.results)
    decode_time = sum(r.decode_time_s for r in arm.results)
    steps = sum(len(r.chunk_times_s) - 1 for r in arm.results)
    assert arm.decode_tok_per_s == pytest.approx(decoded / decode_time, rel=1e-9)
    assert arm.ms_per_step == pytest.approx(decode_time / steps * 1000, rel=1e-9)
    # The stub's own acceptance: tokens per decode step is about 1 + accepted / drafts (~2.9 at k=5).
    m = httpx.get(stub.url + "/metrics").text
    acceptance = 1 + metric(m, "vllm:spec_decode_num_accepted_tokens_total") / metric(
        m, "vllm:spec_decode_num_drafts_total")
    assert decoded / steps == pytest.approx(acceptance, rel=0.05)
    assert arm.decode_tok_per_s / (1000 / arm.ms_per_step) == pytest.approx(decoded / steps, rel=1e-9)
    # And the per-stream token rate is the configured 100 tok/s, in the band a busy machine leaves.
    assert 100 / 5 < arm.decode_tok_per_s < 100 * 1.5


def test_the_window_closes_at_the_last_request_and_cuts_the_rest(spawn: Spawn) -> None:
    # 20 tokens at 100 tok/s: a request takes 200 ms, far longer than a busy machine stalls a thread.
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "100"})
    seen: list[tuple[int, int]] = []
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=4, requests=6, max_tokens=20, warmup=0,
                  on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(n, 6) for n in range(1, 7)]
    assert arm.requests == 6 and arm.failed == 0
    # Every stream starts its next request the moment one finishes, so when the 6th finishes the
    # other three streams are mid-request: they are cut, and their tokens so far still count. The 5th
    # and 6th finish in the same engine step, so the 5th's stream may not have sent its next request
    # yet when the 6th closes the window: then it has nothing to cut. The two streams still on their
    # second request are cut whatever the timing.
    assert arm.cut in (2, 3)
    assert 0 <= arm.cut_output_tokens <= arm.cut * 20
    assert arm.output_tokens == 6 * 20 + arm.cut_output_tokens
    assert all(r.finished_s <= arm.wall_time_s + 1e-6 for r in arm.results)


def test_a_closed_port_fails_every_request_without_crashing() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    arm = run_arm(url, MODEL_NAME, PROMPTS, concurrency=2, requests=5, max_tokens=10, warmup=1, timeout=5)
    assert (arm.requests, arm.failed, arm.output_tokens) == (5, 5, 0)
    assert arm.output_tok_per_s == 0.0
    assert arm.decode_tok_per_s is None and arm.ttft_p50_ms is None
    assert all(r.error is not None and r.error.startswith("cannot connect") for r in arm.results)


class _KillWhenStreamsHaveTokens(httpx.HTTPTransport):
    """A real transport that kills the server once `streams` responses have each delivered a token.

    The kill happens inside the read that brought the last of those tokens, before the client sees
    it, so the test knows exactly which requests were mid-stream: no timer races the engine's pace.
    """

    def __init__(self, streams: int, kill: Callable[[], None], connections: int) -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        super().__init__(limits=limits)
        self._needed = streams
        self._kill = kill
        self._with_token = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        inner = response.stream
        assert isinstance(inner, httpx.SyncByteStream)

        def watched() -> Iterator[bytes]:
            seen = b""
            counted = False
            for chunk in inner:
                seen += chunk
                # A complete SSE event that carries a choice: the client will record a token from it.
                if not counted and re.search(rb'data: \{[^\n]*"choices": ?\[\{[^\n]*\n\n', seen):
                    counted = True
                    with self._lock:
                        self._with_token += 1
                        if self._with_token == self._needed:
                            self._kill()
                yield chunk

        response.stream = _Stream(watched(), inner.close)
        return response


class _Stream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes], close: Callable[[], None]) -> None:
        self._chunks = chunks
        self._close = close

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._close()


def test_a_server_killed_mid_arm_counts_failures(spawn: Spawn) -> None:
    # 100 tokens at 20 tok/s: each stream runs ~5 s, so the two first requests are surely mid-stream.
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "20"})
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=2, requests=6, max_tokens=100, warmup=0, timeout=30,
                  client_factory=lambda n: httpx.Client(transport=_KillWhenStreamsHaveTokens(2, stub.kill, n)))
    assert stub.proc.poll() is not None
    assert arm.requests == 6
    assert arm.failed == 6
    errors = [r.error or "" for r in arm.results]
    lost = [r for r in arm.results if (r.error or "").startswith(("connection failed mid-request",
                                                                  "stream ended without [DONE]"))]
    refused = [e for e in errors if e.startswith("cannot connect")]
    assert len(lost) + len(refused) == 6, errors
    # The two streams in flight when the server died lose their connection (so may a request that raced
    # the dying listener); the requests after them find nobody listening. Refusals are instant, so the
    # window (6 finishes) may close before the second stream has noticed: then it is cut, not finished.
    streamed = [r for r in arm.results if r.chunk_times_s]
    assert all(r in lost for r in streamed), errors
    assert len(streamed) == 2 or (len(streamed) == 1 and arm.cut >= 1), (errors, arm.cut)


def test_a_hung_engine_times_out(spawn: Spawn) -> None:
    stub = spawn({"STUB_FAULT": "hang"})
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=2, requests=2, max_tokens=10, warmup=0, timeout=1)
    assert arm.failed == 2
    assert all("1 s" in (r.error or "") for r in arm.results), [r.error for r in arm.results]
    # Each request waited out its own 1 s timeout, then gave up: not the default 120 s, not forever.
    assert all(r.finished_s - r.started_s >= 1 for r in arm.results)
    assert arm.wall_time_s < 10


def test_http_errors_are_failed_requests(spawn: Spawn) -> None:
    stub = spawn()
    arm = run_arm(stub.url, "no-such-model", PROMPTS, concurrency=1, requests=2, max_tokens=4, warmup=0)
    assert arm.failed == 2
    assert arm.results[0].error == "HTTP 404: The model `no-such-model` does not exist."


def test_logprobs_arrive_per_position(spawn: Spawn) -> None:
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "1000"})
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS[:2], concurrency=2, requests=2, max_tokens=8, warmup=0, logprobs=3)
    assert arm.failed == 0
    for r in arm.results:
        assert len(r.choices) == r.output_tokens == sum(r.chunk_tokens) == 8
        assert len(r.chunk_tokens) == len(r.texts) == len(r.chunk_times_s)
        assert "".join(c.token for c in r.choices) == r.text
        for c in r.choices:
            assert len(c.top) == 3
            assert c.top[c.token] == c.logprob == max(c.top.values())
    # Keyed by the prompt each finished request sent. Which two finish first is a race on a busy machine:
    # the stream that finishes first sends prompt 0 again, and on a loaded machine that one can finish
    # before prompt 1's request.
    assert set(arm.choices_by_prompt()) == {r.prompt_index for r in arm.results} <= {0, 1}

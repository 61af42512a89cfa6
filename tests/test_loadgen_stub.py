"""The load generator against real stub-engine processes on 127.0.0.1.

Rate bounds are loose (10-15%): these machines are shared and noisy. Exact figures belong to
benchmarks/bench_client.py; these tests catch a client that measures the wrong thing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest

from lanectl.bench_stats import CONFIDENT_P, fidelity
from lanectl.loadgen import run_arm
from lanectl.workload import load_workload
from tests.stub_engine.stubproc import MODEL_NAME, STUB_DIR, StubProcess, free_port
from tests.test_workload import WORKLOADS

Spawn = Callable[..., StubProcess]
PROMPTS = [f"Explain step {i} of a rolling restart." for i in range(8)]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    procs: list[StubProcess] = []

    def _spawn(env: Mapping[str, str] | None = None) -> StubProcess:
        p = StubProcess({"STUB_STATS_INTERVAL_S": "0", **(env or {})}, [], STUB_DIR, 0)
        procs.append(p)
        p.wait_ready()
        return p

    yield _spawn
    for p in procs:
        p.kill()


def test_one_and_eight_streams_measure_the_configured_rate(spawn: Spawn) -> None:
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "100"})
    one = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=1, requests=2, max_tokens=100, warmup=1)
    assert (one.failed, one.requests, one.cut) == (0, 2, 0)
    assert [r.output_tokens for r in one.results] == [100, 100]
    assert one.output_tok_per_s == pytest.approx(100, rel=0.10)
    assert one.decode_tok_per_s == pytest.approx(100, rel=0.10)
    assert one.ms_per_step == pytest.approx(10.0, rel=0.10)
    assert one.ttft_p50_ms is not None and one.ttft_p50_ms < 100

    eight = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=8, requests=8, max_tokens=100, warmup=8)
    assert (eight.failed, eight.requests) == (0, 8)
    assert eight.output_tok_per_s == pytest.approx(800, rel=0.12)
    # Every stream keeps the single-stream step: concurrent streams share engine steps.
    assert eight.decode_tok_per_s == pytest.approx(100, rel=0.10)
    assert eight.ms_per_step == pytest.approx(10.0, rel=0.10)
    assert {r.prompt_index for r in eight.results} == set(range(8))


def test_the_window_closes_at_the_last_request_and_cuts_the_rest(spawn: Spawn) -> None:
    stub = spawn({"STUB_DECODE_TOKENS_PER_S": "500"})
    seen: list[tuple[int, int]] = []
    arm = run_arm(stub.url, MODEL_NAME, PROMPTS, concurrency=4, requests=6, max_tokens=20, warmup=0,
                  on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(n, 6) for n in range(1, 7)]
    assert arm.requests == 6 and arm.failed == 0
    # Every stream starts its next request the moment one finishes, so when the 6th finishes the
    # other three streams are mid-request: they are cut, and their tokens so far still count.
    assert arm.cut == 3
    assert 0 <= arm.cut_output_tokens <= 3 * 20
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
    assert arm.wall_time_s < 3


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
        assert len(r.choices) == r.output_tokens == 8
        assert [c.token for c in r.choices] == list(r.texts)
        for c in r.choices:
            assert len(c.top) == 3
            assert c.top[c.token] == c.logprob == max(c.top.values())
    assert set(arm.choices_by_prompt()) == {0, 1}


def fidelity_run(url: str, prompts: list[str]) -> dict[int, tuple]:
    arm = run_arm(url, MODEL_NAME, prompts, concurrency=3, requests=len(prompts), max_tokens=16, warmup=0,
                  logprobs=5)
    assert arm.failed == 0
    return arm.choices_by_prompt()


def test_fidelity_between_stubs(spawn: Spawn) -> None:
    prompts = load_workload(WORKLOADS / "coding.yaml").prompts("tool_json")
    rate = {"STUB_DECODE_TOKENS_PER_S": "1000"}
    control = fidelity_run(spawn({**rate, "STUB_TOKEN_SEED": "0"}).url, prompts)
    same = fidelity_run(spawn({**rate, "STUB_TOKEN_SEED": "0"}).url, prompts)
    other_seed = fidelity_run(spawn({**rate, "STUB_TOKEN_SEED": "7"}).url, prompts)
    flipping = fidelity_run(spawn({**rate, "STUB_FLIP_EVERY": "4"}).url, prompts)

    unchanged = fidelity(control, same)
    assert (unchanged.prompts, unchanged.positions, unchanged.confident_flips) == (len(prompts), 16 * len(prompts), 0)
    assert unchanged.divergences == ()

    changed = fidelity(control, other_seed)
    assert changed.prompts == len(prompts)
    assert changed.confident_flips > 0
    assert len(changed.divergences) == len(prompts)  # a new seed changes nearly every token

    # STUB_FLIP_EVERY=4 emits the control's runner-up at every 4th position where it is confident.
    flips = fidelity(control, flipping)
    assert flips.confident_flips == len(flips.divergences) > 0
    for d in flips.divergences:
        assert d.position % 4 == 3
        assert d.control_p >= CONFIDENT_P
        assert d.candidate_token in control[d.prompt][d.position].top

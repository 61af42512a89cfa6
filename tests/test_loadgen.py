"""The load generator's arithmetic on fixed numbers, and its SSE handling with HTTP faked at the transport."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace

import httpx
import pytest

from lanectl.bench.loadgen import WARMUP_PREFIX, RequestResult, run_arm, summarize


def request(index: int, times: tuple[float, ...], tokens: int, *, started: float = 0.0, ok: bool = True,
            error: str | None = None) -> RequestResult:
    return RequestResult(prompt_class="code", prompt_index=index, ok=ok, error=error, started_s=started,
                         finished_s=times[-1] if times else started, chunk_times_s=times, output_tokens=tokens,
                         texts=tuple(" t" for _ in times))


def test_summary_of_fixed_requests() -> None:
    results = [
        # sent at 0, first chunk at 0.1, then a chunk every 0.01 s: 11 chunks, 11 tokens
        request(0, tuple(0.1 + 0.01 * i for i in range(11)), 11),
        # a speculative engine: 3 chunks carrying 7 tokens (usage said so), steps of 0.02 s
        request(1, (0.05, 0.07, 0.09), 7, started=0.0),
        request(2, (), 0, ok=False, error="cannot connect: refused"),
    ]
    arm = summarize(results, wall_time_s=0.5, concurrency=2)
    assert (arm.requests, arm.failed, arm.cut, arm.cut_output_tokens) == (3, 1, 0, 0)
    assert arm.output_tokens == 18
    assert arm.output_tok_per_s == pytest.approx(36.0)
    # per stream: (10 + 6) tokens after the first, over 0.1 + 0.04 s of decode
    assert arm.decode_tok_per_s == pytest.approx(16 / 0.14)
    # 10 gaps of 10 ms and 2 of 20 ms: 0.14 s over 12 gaps
    assert arm.ms_per_step == pytest.approx(140 / 12)
    assert arm.ttft_p50_ms == pytest.approx(75.0)
    assert arm.ttft_p99_ms == pytest.approx(99.5)
    assert arm.itl_p50_ms == pytest.approx(10.0)
    assert arm.itl_p99_ms == pytest.approx(20.0)


def test_cut_streams_count_their_chunks_inside_the_window() -> None:
    finished = [request(0, (0.1, 0.2, 0.3), 6)]  # 2 tokens per chunk
    cut = [request(1, (0.25, 0.35, 0.45, 0.55), 0, started=0.2), request(2, (), 0, started=0.29)]
    arm = summarize(finished, wall_time_s=0.5, concurrency=3, cut_streams=cut)
    assert arm.cut == 2
    assert arm.cut_output_tokens == 6  # 3 chunks before 0.5 s, at 2 tokens per chunk
    assert arm.output_tokens == 12
    assert arm.output_tok_per_s == pytest.approx(24.0)
    assert arm.results == tuple(finished)


def test_cut_streams_whose_logprobs_told_count_their_own_tokens() -> None:
    """A chunk's logprobs say how many tokens it carried: a cut stream's in-window chunks are then summed,
    not scaled by the finished requests' average (2 per chunk here)."""
    finished = [request(0, (0.1, 0.2, 0.3), 6)]
    cut = [replace(request(1, (0.25, 0.35, 0.45, 0.55), 0, started=0.2), chunk_tokens=(1, 6, 4, 3))]
    arm = summarize(finished, wall_time_s=0.5, concurrency=2, cut_streams=cut)
    assert arm.cut_output_tokens == 11  # 1 + 6 + 4 before 0.5 s; the 3 at 0.55 s fall outside
    assert arm.output_tokens == 17


def test_decode_tokens_leave_out_what_the_first_chunk_carried() -> None:
    """decode tok/s counts the tokens after the prefill's chunk: one unless the chunk's logprobs say more."""
    plain = request(0, (0.1, 0.2, 0.3), 9)
    told = replace(plain, chunk_tokens=(3, 3, 3))
    assert summarize([plain], wall_time_s=1, concurrency=1).decode_tok_per_s == pytest.approx(8 / 0.2)
    assert summarize([told], wall_time_s=1, concurrency=1).decode_tok_per_s == pytest.approx(6 / 0.2)


def test_summary_without_any_success() -> None:
    arm = summarize([request(0, (), 0, ok=False, error="x")], wall_time_s=0.2, concurrency=1)
    assert (arm.output_tokens, arm.output_tok_per_s, arm.failed) == (0, 0.0, 1)
    assert arm.decode_tok_per_s is arm.ms_per_step is arm.ttft_p50_ms is arm.itl_p99_ms is None


def test_request_result_timings() -> None:
    r = request(0, (0.3, 0.35, 0.45), 3, started=0.1)
    assert r.ttft_s == pytest.approx(0.2)
    assert r.itl_s == pytest.approx((0.05, 0.1))
    assert r.decode_time_s == pytest.approx(0.15)
    assert r.text == " t t t"


# -- the wire, faked at the transport --------------------------------------------------------------


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def chunk(text: str, **extra: object) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, **extra}]}


def usage(n: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}}


def client_for(handler: Callable[[httpx.Request], httpx.Response]) -> Callable[[int], httpx.Client]:
    return lambda connections: httpx.Client(transport=httpx.MockTransport(handler))


def streaming(body: bytes, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    def handler(req: httpx.Request) -> httpx.Response:
        def pieces() -> Iterator[bytes]:  # one network read per event, as a streaming server sends them
            for event in body.split(b"\n\n")[:-1]:
                yield event + b"\n\n"

        return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=pieces())

    return handler


def one_request(handler: Callable[[httpx.Request], httpx.Response], **kwargs: object) -> RequestResult:
    arm = run_arm("http://engine:8000/", "m", ["p"], concurrency=1, requests=1, max_tokens=4, warmup=0,
                  client_factory=client_for(handler), **kwargs)  # type: ignore[arg-type]
    (result,) = arm.results
    return result


def test_usage_gives_the_token_count_when_chunks_carry_several() -> None:
    r = one_request(streaming(sse(chunk(" a"), chunk(" b c d"), usage(4), b"[DONE]")))
    assert (r.ok, r.error, r.output_tokens, r.texts) == (True, None, 4, (" a", " b c d"))
    assert len(r.chunk_times_s) == 2


def test_without_usage_chunks_are_counted() -> None:
    r = one_request(streaming(sse(chunk(" a"), chunk(" b"), chunk(" c"), b"[DONE]")))
    assert (r.ok, r.output_tokens) == (True, 3)


def test_logprobs_become_token_choices() -> None:
    lp = {"tokens": [" a", " b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{" a": -0.1, " x": -2.5},
                                                                                {" b": -0.2, " y": -1.9}]}
    r = one_request(streaming(sse(chunk(" a b", logprobs=lp), usage(2), b"[DONE]")), logprobs=2)
    assert r.chunk_tokens == (2,)  # one chunk of a speculative step: two tokens, by its logprobs
    assert [(c.token, c.logprob, dict(c.top)) for c in r.choices] == [
        (" a", -0.1, {" a": -0.1, " x": -2.5}),
        (" b", -0.2, {" b": -0.2, " y": -1.9}),
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (sse(chunk(" a"), chunk(" b")), "stream ended without [DONE]"),
        (sse(chunk(" a"), {"error": {"message": "EngineCore encountered an issue.", "type": "EngineDeadError"}}),
         "error event: EngineCore encountered an issue."),
        (sse(chunk(" a"), b"{not json"), "malformed event: '{not json'"),
        (sse({"choices": [{"text": " a", "logprobs": {"tokens": [" a"]}}]}, b"[DONE]"),
         "unexpected event shape (KeyError: 'token_logprobs'): "),
    ],
)
def test_broken_streams_are_failed_requests(body: bytes, error: str) -> None:
    r = one_request(streaming(body))
    assert not r.ok
    assert r.error is not None and r.error.startswith(error), r.error


def test_http_error_bodies_are_reported() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "max_tokens must be an integer", "type": "BadRequest"}})

    assert one_request(handler).error == "HTTP 400: max_tokens must be an integer"
    assert one_request(lambda req: httpx.Response(502, text="bad gateway")).error == "HTTP 502: bad gateway"


def test_request_body_and_warm_up_prefix() -> None:
    bodies: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url == "http://engine:8000/v1/completions"
        bodies.append(json.loads(req.content))
        return streaming(sse(chunk(" a"), usage(1), b"[DONE]"))(req)

    arm = run_arm("http://engine:8000/", "m", ["first", "second"], concurrency=1, requests=3, max_tokens=4,
                  warmup=1, logprobs=5, temperature=0.5, prompt_class="prose", client_factory=client_for(handler))
    assert bodies[0] == {"model": "m", "max_tokens": 4, "temperature": 0.5, "stream": True,
                         "stream_options": {"include_usage": True}, "ignore_eos": True, "logprobs": 5,
                         "prompt": WARMUP_PREFIX + "first"}
    assert [b["prompt"] for b in bodies[1:]] == ["first", "second", "first"]
    assert [(r.prompt_class, r.prompt_index) for r in arm.results] == [("prose", 0), ("prose", 1), ("prose", 0)]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no prompts"):
        run_arm("http://x", "m", [], concurrency=1, requests=1, max_tokens=1, warmup=0)
    with pytest.raises(ValueError, match="concurrency"):
        run_arm("http://x", "m", ["p"], concurrency=0, requests=1, max_tokens=1, warmup=0)


def test_a_connection_lost_after_done_is_no_failure() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        def pieces() -> Iterator[bytes]:
            yield sse(chunk(" a"), usage(1), b"[DONE]")
            raise httpx.ReadError("connection reset while reading the body's end")

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=pieces())

    r = one_request(handler)
    assert (r.ok, r.error, r.output_tokens) == (True, None, 1)

"""The load generator: one arm of a benchmark, streamed from an OpenAI-compatible server.

Closed loop: exactly `concurrency` streams are in flight from the start of the measured window
until `requests` requests have finished; every finish starts the next request at once. The window
ends at the `requests`-th finish and the streams still running then are cut (cancelled): letting them
drain would measure a tail at falling concurrency, which is not the concurrency asked for.

One thread per stream, sharing one httpx.Client. Measured against the stub at 32 streams of 100
tok/s on 2 cores, httpx.AsyncClient put first tokens at 310-430 ms (p50) where the server's own
answer was ~40 ms (its async pool is known to lag under concurrency: encode/httpx#3215), while
threads blocked in recv() stayed within a few ms of a bare-socket asyncio client.

Times are time.perf_counter() seconds. TTFT runs from sending the request to the first chunk that
carries a choice. Inter-token latency is the gap between consecutive such chunks: a speculative
engine emits several tokens per step in one chunk (vLLM sends every token a step accepted, 1 to k + 1),
so these gaps are step times (ms/step), and decode tok/s (tokens / decode time) shows how many tokens
each step carried. Tokens are therefore never counted as chunks: a request's total comes from the
usage chunk (`stream_options.include_usage`, which run_arm always asks for), and a chunk's own count
from its logprobs entries (one per token) when logprobs were asked for.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

import httpx

from lanectl.bench.stats import TokenChoice, percentile
from lanectl.health.engine_http import error_message
from lanectl.records import frozen

COMPLETIONS_PATH = "/v1/completions"
# Warm-up prompts carry their own prefix so they do not pre-fill the prefix cache for the measured
# prompts of the same arm (see lanectl.bench.workload.prefixed).
WARMUP_PREFIX = "[warm-up] "

ProgressCallback = Callable[[int, int], None]  # (requests finished, requests in the window)
ClientFactory = Callable[[int], httpx.Client]  # (connections) -> client


@frozen
class RequestResult:
    prompt_class: str
    prompt_index: int  # index into the arm's prompt list
    ok: bool
    error: str | None
    started_s: float  # request sent, in seconds since the window opened
    finished_s: float
    chunk_times_s: tuple[float, ...]  # arrival of each chunk that carries a choice, same clock
    output_tokens: int  # from the final usage chunk when sent, else positions (or chunks) counted
    texts: tuple[str, ...]  # the text of each such chunk, in order
    choices: tuple[TokenChoice, ...] = ()  # one per position, only when logprobs were requested
    prompt_tokens: int | None = None  # from the final usage chunk, when sent
    # Tokens in each chunk (its logprobs entries), when every chunk carried logprobs; else empty.
    chunk_tokens: tuple[int, ...] = ()

    @property
    def first_chunk_tokens(self) -> int:
        """Tokens of the first chunk: the one prefill produced (1 in vLLM, speculative or not), unless the
        chunk's logprobs say otherwise."""
        return self.chunk_tokens[0] if self.chunk_tokens else 1

    @property
    def tok_per_s(self) -> float:
        """This request's output tokens over its whole time, sent to last byte: the gate's per-request rate."""
        elapsed = self.finished_s - self.started_s
        return self.output_tokens / elapsed if elapsed > 0 else 0.0

    @property
    def prompt_tok_per_s(self) -> float | None:
        """Prompt tokens over the time to the first token: how fast prefill went for this request."""
        ttft = self.ttft_s
        return self.prompt_tokens / ttft if self.prompt_tokens and ttft else None

    @property
    def ttft_s(self) -> float | None:
        """Request sent -> first chunk with a choice."""
        return self.chunk_times_s[0] - self.started_s if self.chunk_times_s else None

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Gaps between consecutive chunks: one engine step each."""
        times = self.chunk_times_s
        return tuple(later - earlier for earlier, later in zip(times, times[1:], strict=False))

    @property
    def decode_time_s(self) -> float:
        """First chunk -> last chunk."""
        return self.chunk_times_s[-1] - self.chunk_times_s[0] if self.chunk_times_s else 0.0

    @property
    def text(self) -> str:
        return "".join(self.texts)


@frozen
class ArmResult:
    concurrency: int
    requests: int  # finished in the window, failures included
    wall_time_s: float  # the window: opened with every stream starting, closed at the requests-th finish
    output_tokens: int  # delivered inside the window: successful requests' plus cut_output_tokens
    output_tok_per_s: float  # output_tokens / wall_time_s: all streams together
    decode_tok_per_s: float | None  # per stream: sum(output_tokens - 1) / sum(decode_time_s), successful requests
    ms_per_step: float | None  # per stream: mean gap between chunks, in ms
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    failed: int
    cut: int  # streams still running when the window closed; cancelled, not in `results`
    cut_output_tokens: int  # their tokens that arrived before the window closed
    results: tuple[RequestResult, ...] = field(repr=False)

    def choices_by_prompt(self) -> dict[int, tuple[TokenChoice, ...]]:
        """Per prompt index, the token choices of its first successful request (for bench_stats.fidelity)."""
        out: dict[int, tuple[TokenChoice, ...]] = {}
        for r in sorted(self.results, key=lambda r: r.started_s):
            if r.ok and r.choices and r.prompt_index not in out:
                out[r.prompt_index] = r.choices
        return out


def summarize(
    results: Sequence[RequestResult],
    *,
    wall_time_s: float,
    concurrency: int,
    cut_streams: Sequence[RequestResult] = (),
) -> ArmResult:
    """The arm's figures from its requests. Pure, so the aggregation rules are tested on fixed numbers.

    output tok/s counts every token delivered inside the window, all streams together. The streams cut
    at its close count too, for the chunks that arrived before it closed: leaving them out would
    undercount the window by up to one request per stream. A chunk may carry several tokens (a
    speculative step): a cut stream's chunks count their own tokens when their logprobs told, else they
    are scaled by the tokens per chunk of the finished requests.

    decode tok/s is BRIEF §5's "output tokens / decode time", per stream: the first chunk comes from
    prefill, so a request contributes its tokens after the first chunk over its decode time (first to
    last chunk); summing before dividing weights long requests by their length.
    """
    good = [r for r in results if r.ok]
    chunks = sum(len(r.chunk_times_s) for r in good)
    tokens_per_chunk = sum(r.output_tokens for r in good) / chunks if chunks else 1.0
    cut_tokens = 0
    for r in cut_streams:
        inside = sum(1 for t in r.chunk_times_s if t <= wall_time_s)
        cut_tokens += sum(r.chunk_tokens[:inside]) if r.chunk_tokens else round(inside * tokens_per_chunk)
    output_tokens = sum(r.output_tokens for r in good) + cut_tokens
    decoded = [r for r in good if len(r.chunk_times_s) > 1]
    decode_time = math.fsum(r.decode_time_s for r in decoded)
    gaps = [gap for r in decoded for gap in r.itl_s]
    ttfts = [t for t in (r.ttft_s for r in good) if t is not None]

    def pct_ms(values: list[float], p: float) -> float | None:
        return percentile(values, p) * 1000 if values else None

    return ArmResult(
        concurrency=concurrency,
        requests=len(results),
        wall_time_s=wall_time_s,
        output_tokens=output_tokens,
        output_tok_per_s=output_tokens / wall_time_s if wall_time_s > 0 else 0.0,
        decode_tok_per_s=(sum(r.output_tokens - r.first_chunk_tokens for r in decoded) / decode_time
                          if decode_time > 0 else None),
        ms_per_step=decode_time / len(gaps) * 1000 if gaps else None,
        ttft_p50_ms=pct_ms(ttfts, 50),
        ttft_p99_ms=pct_ms(ttfts, 99),
        itl_p50_ms=pct_ms(gaps, 50),
        itl_p99_ms=pct_ms(gaps, 99),
        failed=len(results) - len(good),
        cut=len(cut_streams),
        cut_output_tokens=cut_tokens,
        results=tuple(results),
    )


def make_client(connections: int) -> httpx.Client:
    # Per-request timeouts are passed with each request; the pool only needs room for every stream.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.Client(limits=limits, timeout=None)


def run_arm(
    base_url: str,
    model: str,
    prompts: Sequence[str],
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    warmup: int,
    logprobs: int | None = None,
    temperature: float = 0.0,
    prompt_class: str = "",
    timeout: float = 120,
    on_progress: ProgressCallback | None = None,
    client_factory: ClientFactory = make_client,
) -> ArmResult:
    """Measure one arm: `warmup` requests (discarded), then a window of `requests` at `concurrency`.

    Request n of a phase sends prompts[n % len(prompts)] to `base_url`/v1/completions, streaming,
    with usage in the last chunk and `logprobs` top logprobs per position when set. A request that
    fails (HTTP error, refused or dropped connection, no complete answer within `timeout` seconds, a
    stream that ends without [DONE]) is recorded as failed and counts toward `requests`; it never
    stops the arm. `on_progress(finished, requests)` is called from the streams' threads, one call
    at a time, after each finish inside the window.
    """
    if concurrency < 1 or requests < 1 or warmup < 0 or max_tokens < 1 or timeout <= 0:
        raise ValueError("concurrency, requests and max_tokens must be >= 1, warmup >= 0 and timeout > 0")
    if not prompts:
        raise ValueError("no prompts to send")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM's extension: every request generates exactly max_tokens, so arms compare equal work
        # (at temperature 0 an early end-of-sequence would otherwise vary the lengths between lanes).
        "ignore_eos": True,
    }
    if logprobs is not None:
        body["logprobs"] = logprobs
    sender = _Sender(base_url.rstrip("/") + COMPLETIONS_PATH, body, list(prompts), prompt_class, timeout)
    with client_factory(concurrency) as client:
        if warmup:
            _Window(sender, client, warmup, WARMUP_PREFIX, None).run(concurrency)
        window = _Window(sender, client, requests, "", on_progress)
        window.run(concurrency)
    return summarize(window.finished, wall_time_s=window.end - window.start, concurrency=concurrency,
                     cut_streams=window.cut_streams)


class _Window:
    """One phase: `concurrency` threads each send a request, then the next, until `requests` finished."""

    def __init__(self, sender: _Sender, client: httpx.Client, requests: int, prefix: str,
                 on_progress: ProgressCallback | None) -> None:
        self.sender = sender
        self.client = client
        self.requests = requests
        self.prefix = prefix
        self.on_progress = on_progress
        self.finished: list[RequestResult] = []
        self.cut_streams: list[RequestResult] = []
        self.closed = threading.Event()
        self.start = self.end = 0.0
        self._launched = 0
        self._lock = threading.Lock()
        self._crash: BaseException | None = None

    def run(self, concurrency: int) -> None:
        threads = [threading.Thread(target=self._stream_loop, name=f"loadgen-{i}", daemon=True)
                   for i in range(concurrency)]
        self.start = time.perf_counter()
        try:
            for thread in threads:
                thread.start()
            self.closed.wait()
        finally:
            self.closed.set()
            # A cut stream notices at its next event (one engine step) or at its timeout.
            for thread in threads:
                thread.join()
        if self._crash is not None:
            raise self._crash

    def _next_prompt(self) -> int | None:
        with self._lock:
            if self.closed.is_set():
                return None
            n = self._launched
            self._launched += 1
            return n % len(self.sender.prompts)

    def _finish(self, result: RequestResult) -> None:
        with self._lock:
            if self.closed.is_set():
                self.cut_streams.append(result)
                return
            self.finished.append(result)
            if self.on_progress is not None:
                self.on_progress(len(self.finished), self.requests)
            if len(self.finished) == self.requests:
                self.end = time.perf_counter()
                self.closed.set()

    def _stream_loop(self) -> None:
        try:
            while (index := self._next_prompt()) is not None:
                self._finish(self.sender.send(self.client, index, self.prefix, self.start, self.closed))
        except BaseException as exc:  # a bug here must end the arm, not leave it waiting forever
            self._crash = exc
            self.closed.set()


class _Sender:
    def __init__(self, url: str, body: dict[str, Any], prompts: list[str], prompt_class: str, timeout: float):
        self.url = url
        self.body = body
        self.prompts = prompts
        self.prompt_class = prompt_class
        self.timeout = timeout

    def send(self, client: httpx.Client, index: int, prefix: str, t0: float,
             cancel: threading.Event) -> RequestResult:
        stream = _Stream()
        body = {**self.body, "prompt": prefix + self.prompts[index]}
        sent = time.perf_counter()
        # httpx's timeout bounds each read; a server that trickles tokens forever is caught by the deadline.
        deadline = sent + self.timeout
        try:
            with client.stream("POST", self.url, json=body, timeout=self.timeout) as response:
                if response.status_code != 200:
                    stream.error = f"HTTP {response.status_code}: {error_message(response.read()) or '(empty body)'}"
                else:
                    for line in response.iter_lines():
                        now = time.perf_counter()
                        if stream.done:
                            # The body ends right after [DONE]; reading that end returns the connection to the
                            # pool, where leaving it unread closes it and the next request pays a new connect.
                            if now > deadline:
                                break
                            continue
                        ended = stream.feed(line, now)
                        if (ended and not stream.done) or cancel.is_set():
                            break
                        if now > deadline:
                            stream.error = f"no complete answer within {self.timeout:g} s"
                            break
                    if stream.error is None and not stream.done and not cancel.is_set():
                        stream.error = "stream ended without [DONE]"
        except httpx.TimeoutException as exc:
            stream.fail(f"timed out ({type(exc).__name__}) after {self.timeout:g} s")
        except httpx.ConnectError as exc:
            stream.fail(f"cannot connect: {exc}")
        except (httpx.HTTPError, OSError) as exc:
            stream.fail(f"connection failed mid-request: {type(exc).__name__}: {exc}")
        return stream.result(self.prompt_class, index, sent=sent, t0=t0)


class _Stream:
    """The SSE events of one streamed completion, timed as they arrive."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.texts: list[str] = []
        self.choices: list[TokenChoice] = []
        self.chunk_tokens: list[int] = []  # per chunk that carried logprobs
        self.usage_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    def fail(self, error: str) -> None:
        # After [DONE] the answer is complete; losing the connection while draining its end is no failure.
        if not self.done:
            self.error = error

    def feed(self, line: str, now: float) -> bool:
        """Take one SSE line; True when the stream is over ([DONE] or an error event)."""
        if not line.startswith("data:"):
            return False  # blank separators, comments, event:/id: fields
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return True
        try:
            event = json.loads(payload)
        except ValueError:
            self.error = f"malformed event: {payload[:200]!r}"
            return True
        try:
            return self._take(event, payload, now)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            self.error = f"unexpected event shape ({type(exc).__name__}: {exc}): {payload[:200]!r}"
            return True

    def _take(self, event: Any, payload: str, now: float) -> bool:
        if "error" in event:
            self.error = f"error event: {error_message(payload.encode()) or '(empty body)'}"
            return True
        usage = event.get("usage")
        if usage and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt_tokens = usage["prompt_tokens"]
        choices = event.get("choices") or []
        if choices:
            choice = choices[0]
            self.arrivals.append(now)
            self.texts.append(choice.get("text") or "")
            logprobs = choice.get("logprobs")
            if logprobs:
                self.chunk_tokens.append(len(logprobs["tokens"]))
                tops = logprobs.get("top_logprobs") or []
                for i, (token, lp) in enumerate(zip(logprobs["tokens"], logprobs["token_logprobs"], strict=True)):
                    top = tops[i] if i < len(tops) and tops[i] else {}
                    self.choices.append(TokenChoice(token=token, logprob=lp, top=dict(top)))
        return False

    def result(self, prompt_class: str, index: int, *, sent: float, t0: float) -> RequestResult:
        if self.usage_tokens is not None:
            tokens = self.usage_tokens
        else:
            # No usage chunk: positions when logprobs came; else chunks, which undercounts a speculative
            # engine's multi-token chunks (run_arm always asks for usage, so this is a server that ignored it).
            tokens = len(self.choices) if self.choices else len(self.arrivals)
        return RequestResult(
            prompt_class=prompt_class,
            prompt_index=index,
            ok=self.error is None,
            error=self.error,
            started_s=sent - t0,
            finished_s=time.perf_counter() - t0,
            chunk_times_s=tuple(t - t0 for t in self.arrivals),
            output_tokens=tokens,
            texts=tuple(self.texts),
            choices=tuple(self.choices),
            prompt_tokens=self.usage_prompt_tokens,
            # Only when every chunk told its count: a chunk without logprobs leaves the split unknown.
            chunk_tokens=tuple(self.chunk_tokens) if len(self.chunk_tokens) == len(self.arrivals) else (),
        )

"""A stop signal with requests in flight, as vLLM 0.31.0 handles it (--shutdown-timeout; stubengine/shutdown.py).

Real processes, real HTTP, real signals. What a client sees is asserted, never how long anything took: a drain that
fits lets every request in flight finish, a new request meanwhile ends at once as aborted, 0 aborts the requests in
flight, and a drain whose deadline passes leaves its streams without an end and the process waiting for their
clients before it exits 0.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from typing import Any

import httpx
import pytest

from .stubproc import stream_into, wait_until

EXIT_WAIT = 120  # a hang detector, not a figure: the stub exits long before on any machine
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class Stream:
    """One streaming completion read on its own thread, every event kept as it arrives."""

    def __init__(self, url: str, max_tokens: int, path: str = COMPLETIONS) -> None:
        self.events: list[object] = []
        self.error: str | None = None
        body = {"max_tokens": max_tokens, "stream_options": {"include_usage": True}, "model": "stub-test"}
        body |= {"messages": [{"role": "user", "content": "x"}]} if path == CHAT else {"prompt": "x"}
        self.thread = threading.Thread(target=self._run, args=(url, path, body), daemon=True)
        self.thread.start()

    def _run(self, url: str, path: str, body: dict) -> None:
        try:
            stream_into(lambda _, event: self.events.append(event), url, path, body, timeout=EXIT_WAIT)
        except httpx.HTTPError as exc:
            self.error = type(exc).__name__

    @property
    def tokens_seen(self) -> bool:
        return any(isinstance(e, dict) and e.get("choices") and _text(e) for e in self.events)

    @property
    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for e in self.events if isinstance(e, dict) for c in e.get("choices") or []
                if c.get("finish_reason")]

    @property
    def completion_tokens(self) -> int | None:
        usage = [e["usage"] for e in self.events if isinstance(e, dict) and e.get("usage")]
        return usage[-1]["completion_tokens"] if usage else None

    def ended(self) -> bool:
        self.thread.join(EXIT_WAIT)
        return not self.thread.is_alive()


def _text(event: dict) -> str:
    choice = event["choices"][0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def _in_flight(url: str, count: int, max_tokens: int) -> list[Stream]:
    streams = [Stream(url, max_tokens) for _ in range(count)]
    wait_until(lambda: all(s.tokens_seen for s in streams), what="a token on every stream")
    return streams


def _shutdown_lines(lines: list[str]) -> list[str]:
    return [line.split("] ", 1)[1] for line in lines if "] [shutdown] " in line]


def test_a_drain_that_fits_finishes_every_request_in_flight_and_exits_0(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "100"}, args=["--shutdown-timeout", "30"])
    streams = _in_flight(p.url, 4, 100)
    p.signal(signal.SIGTERM)
    assert all(s.ended() for s in streams)
    for stream in streams:
        assert (stream.finish_reasons, stream.completion_tokens, stream.events[-1], stream.error) == (
            ["length"], 100, "[DONE]", None)
    assert p.wait_exit(EXIT_WAIT) == 0
    assert _shutdown_lines(p.lines) == [
        "[shutdown] API server: shutdown triggered",
        "[shutdown] API server: stopping engine client mode=drain timeout=30s",
        "[shutdown] MPClient: start timeout=30s",
        "[shutdown] MPClient: stopping engine manager",
        "[shutdown] Process manager: send sigterm to process EngineCore",
        "[shutdown] EngineCore: trigger received signal=SIGTERM",
        "[shutdown] EngineCore: start mode=drain timeout=30s",
        "[shutdown] EngineCore: draining in-flight requests count=4 timeout=30s",
        "[shutdown] EngineCore: request processing complete; starting resource teardown",
        "[shutdown] EngineCore: exiting busy loop",
        "[shutdown] MPClient: engine manager stopped",
        "[shutdown] MPClient: cleaning up background resources",
        "[shutdown] MPClient: complete",
        "[shutdown] API server: engine client stopped",
        "[shutdown] API server: signalling HTTP server shutdown",
        "[shutdown] API server: shutting down FastAPI HTTP server",
    ]
    assert p.lines[-3:] == ["INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
                            "INFO:     Application shutdown complete."]
    with pytest.raises(httpx.ConnectError):
        httpx.get(p.url + "/health")


def test_while_it_drains_the_engine_serves_http_and_fails_or_aborts_each_new_request_at_once(spawn) -> None:
    """vLLM 0.31.0 keeps its port open while it drains (launcher.NoSignalServer), but AsyncLLM.shutdown shut its
    renderer first: a text prompt or chat fails to tokenize (500); a prompt of token ids reaches the engine core,
    which ends it at once as aborted (_reject_add_in_shutdown), without a token -- a stream of it has no chunk with a
    finish_reason at all (vLLM skips the empty last chunk), only usage and [DONE]."""
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "50"}, args=["--shutdown-timeout", "600"])
    (long,) = _in_flight(p.url, 1, 30_000)
    p.signal(signal.SIGTERM)
    p.wait_line(r"\[shutdown\] EngineCore: draining in-flight requests count=1 timeout=600s$")
    assert httpx.get(p.url + "/health").status_code == 200
    for path, body in ((COMPLETIONS, {"prompt": "new", "max_tokens": 5}),
                       (CHAT, {"messages": [{"role": "user", "content": "new"}], "max_tokens": 5}),
                       (COMPLETIONS, {"prompt": "new", "max_tokens": 5, "stream": True})):
        failed = httpx.post(p.url + path, json=body, timeout=EXIT_WAIT)
        assert (failed.status_code, failed.json()) == (500, {"error": {
            "message": "cannot schedule new futures after shutdown", "type": "InternalServerError", "param": None,
            "code": 500}}), path
    p.wait_line(r"^RuntimeError: cannot schedule new futures after shutdown$")
    ids = httpx.post(p.url + COMPLETIONS, json={"prompt": [1, 2, 3], "max_tokens": 5}, timeout=EXIT_WAIT).json()
    assert (ids["choices"][0]["text"], ids["choices"][0]["finish_reason"], ids["usage"]["completion_tokens"]) == (
        "", "abort", 0)
    refused: list[Any] = []
    stream_into(lambda _, e: refused.append(e), p.url, COMPLETIONS,
                {"prompt": [1, 2, 3], "max_tokens": 5, "stream_options": {"include_usage": True}}, timeout=EXIT_WAIT)
    assert [e["choices"] for e in refused[:-1]] == [[]] and refused[0]["usage"]["completion_tokens"] == 0
    assert refused[-1] == "[DONE]"
    assert long.thread.is_alive() and not long.finish_reasons, "the request in flight still runs"
    assert p.proc.poll() is None


def test_vllm_0_26_0_stops_listening_at_the_signal_and_still_drains(spawn) -> None:
    """The GPU record's vLLM let uvicorn take the signal too: new requests were refused from the first moment, while
    the streams in flight finished."""
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "100", "STUB_VLLM_VERSION": "0.26.0"}, args=["--shutdown-timeout", "30"])
    streams = _in_flight(p.url, 2, 150)
    p.signal(signal.SIGTERM)
    p.wait_line(r"draining in-flight requests count=2")
    with pytest.raises(httpx.ConnectError):
        httpx.get(p.url + "/health")
    assert all(s.ended() and s.finish_reasons == ["length"] for s in streams)
    assert p.wait_exit(EXIT_WAIT) == 0


def test_a_second_stop_signal_changes_nothing(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "100"}, args=["--shutdown-timeout", "30"])
    streams = _in_flight(p.url, 2, 150)
    p.signal(signal.SIGTERM)
    p.wait_line(r"draining in-flight requests count=2")
    p.signal(signal.SIGINT)
    p.signal(signal.SIGTERM)
    assert all(s.ended() and s.finish_reasons == ["length"] for s in streams)
    assert p.wait_exit(EXIT_WAIT) == 0
    assert sum("shutdown triggered" in line for line in p.lines) == 1


def test_timeout_0_aborts_every_request_in_flight_and_exits_0(spawn) -> None:
    """vLLM's default: the streams end as vLLM ends an aborted request, a last chunk with finish_reason "abort"
    and no text, then usage and [DONE]: no error, a truncated answer."""
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "50"})
    streams = _in_flight(p.url, 3, 30_000)
    p.signal(signal.SIGTERM)
    assert all(s.ended() for s in streams)
    for stream in streams:
        last = stream.events[-3]
        assert isinstance(last, dict) and last["choices"][0]["finish_reason"] == "abort" and _text(last) == ""
        assert stream.finish_reasons == ["abort"] and stream.events[-1] == "[DONE]" and stream.error is None
        assert 0 < (stream.completion_tokens or 0) < 30_000
    assert p.wait_exit(EXIT_WAIT) == 0
    lines = _shutdown_lines(p.lines)
    assert "[shutdown] API server: stopping engine client mode=abort timeout=0s" in lines
    assert "[shutdown] EngineCore: aborting in-flight requests count=3" in lines
    # The process manager's deadline is the SIGTERM itself: it kills the engine core at once.
    assert "[shutdown] Process manager: force killing remaining processes count=1" in lines


@pytest.mark.parametrize("case", ["drain past its deadline", "abort lost to the kill"])
def test_requests_the_engine_core_is_killed_under_never_end_and_the_server_waits_for_their_clients(
        spawn, case: str) -> None:
    """A drain whose deadline passes, or (STUB_ABORT_LOST=1) the race vLLM's abort at 0 can lose: the engine core
    is SIGKILLed with requests unfinished. Their streams get no other byte -- no finish_reason, no [DONE], no
    error -- and uvicorn waits for their connections to close: the process exits 0 only once the clients go."""
    if case == "drain past its deadline":
        p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "20"}, args=["--shutdown-timeout", "1"])
    else:
        p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "20", "STUB_ABORT_LOST": "1"})
    sockets = [_raw_stream(p.port) for _ in range(2)]
    wait_until(lambda: all(b'"text"' in s.recv(65536, socket.MSG_PEEK) for s in sockets), what="tokens")
    p.signal(signal.SIGTERM)
    p.wait_line(r"\[shutdown\] Process manager: force killing remaining process EngineCore pid \d+$",
                timeout=EXIT_WAIT)
    p.wait_line(r"^INFO:     Waiting for connections to close\. \(CTRL\+C to force quit\)$", timeout=EXIT_WAIT)
    received = [_drain(s) for s in sockets]
    assert p.proc.poll() is None, "the server waits for the connections it left unanswered"
    for data in received:
        assert b'"finish_reason": "abort"' not in data and b"[DONE]" not in data and b"\"error\":" not in data
        assert not data.endswith(b"0\r\n\r\n"), "the chunked body was never ended"
    for s in sockets:
        s.close()
    assert p.wait_exit(EXIT_WAIT) == 0
    assert p.lines[-1] == "INFO:     Application shutdown complete."


def _raw_stream(port: int) -> socket.socket:
    body = json.dumps({"prompt": "x", "max_tokens": 30_000, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def _drain(s: socket.socket) -> bytes:
    """Everything the server sent on a connection so far (the server now sends nothing more)."""
    data = b""
    s.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while chunk := s.recv(65536):
            data += chunk
    s.setblocking(True)
    return data


@pytest.mark.parametrize("value", ["-1", "abc", "1.5"])
def test_a_shutdown_timeout_vllm_would_refuse_stops_the_start(spawn, value: str) -> None:
    p = spawn(args=["--shutdown-timeout", value], ready=False)
    assert p.wait_exit(EXIT_WAIT) == 2
    assert "--shutdown-timeout" in p.output

"""`SleepEndpoints` reads what vLLM 0.31.0 says, not only its status codes: against real stub-engine processes,
and against a small loopback server for the answers a stub in good order never gives (two reports that
disagree), each on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lanectl.lanes.standby import SleepEndpoints, StandbyError
from tests.streams import Streams
from tests.stub_engine.stubproc import MODEL_NAME, StubProcess, stub_spawner

Spawn = Callable[..., StubProcess]
DEV = {"VLLM_SERVER_DEV_MODE": "1", "STUB_SLEEP_SECONDS": "0", "STUB_WAKE_SECONDS": "0", "STUB_STATS_INTERVAL_S": "0"}


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    with stub_spawner(DEV, ["--enable-sleep-mode"]) as spawn_stub:
        yield spawn_stub


def test_sleep_and_wake_of_a_stub_in_good_order(spawn) -> None:
    p = spawn()
    endpoints = SleepEndpoints(p.url, 10)
    assert endpoints.sleep_state() == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    endpoints.sleep(1)
    assert endpoints.is_sleeping()
    assert endpoints.sleep_state() == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    endpoints.wake_up()
    assert endpoints.sleep_state()["awake"] == 1.0


def test_a_sleep_lets_the_requests_in_flight_finish_first(spawn) -> None:
    p = spawn()
    endpoints = SleepEndpoints(p.url, 10)
    streams = Streams(p.url, MODEL_NAME, count=4, max_tokens=500).start()  # 5 s: in flight when the sleep comes
    streams.running()
    assert endpoints.sleep(1, drain_seconds=30) == "4 request(s) in flight, all finished before it slept"
    assert streams.ends() == ["length"] * 4 and endpoints.is_sleeping()


def test_requests_still_running_when_the_drain_is_up_are_aborted_and_the_sleep_says_so(spawn) -> None:
    p = spawn()
    endpoints = SleepEndpoints(p.url, 10)
    streams = Streams(p.url, MODEL_NAME, count=3, max_tokens=5000).start()
    streams.running()
    said = endpoints.sleep(1, drain_seconds=0.5)
    assert said.startswith("3 request(s) still in flight after the drain's 0.5 s were CUT"), said
    assert streams.ends() == ["abort"] * 3 and endpoints.is_sleeping()


class _Engine(BaseHTTPRequestHandler):
    """Answers every path from the server's table: path -> (status, body)."""

    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, body = self.server.answers.get(self.path, (404, b'{"detail": "Not Found"}'))
        self.server.seen.append(f"{self.command} {self.path}")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


class _Server(ThreadingHTTPServer):
    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Engine)


@pytest.fixture
def engine() -> Iterator[Callable[[dict[str, tuple[int, bytes]]], _Server]]:
    servers: list[_Server] = []

    def start(answers: dict[str, tuple[int, bytes]]) -> _Server:
        server = _Server(answers)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _metrics(awake: int, offloaded: int, discard: int) -> bytes:
    return "".join(f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="{state}"}} {float(value)}\n'
                   for state, value in (("awake", awake), ("weights_offloaded", offloaded),
                                        ("discard_all", discard))).encode()


def _answers(metrics: bytes) -> dict[str, tuple[int, bytes]]:
    return {"/sleep?level=1&mode=wait": (200, b""),
            "/is_sleeping": (200, json.dumps({"is_sleeping": True}).encode()), "/metrics": (200, metrics)}


def url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_is_sleeping_and_the_sleep_state_gauge_must_agree(engine) -> None:
    server = engine(_answers(_metrics(1, 0, 0)))
    with pytest.raises(StandbyError) as failed:
        SleepEndpoints(url(server), 5).sleep(1)
    assert str(failed.value) == ("/is_sleeping says asleep after POST /sleep?level=1, but vllm:engine_sleep_state says "
                                 "awake=1, discard_all=0, weights_offloaded=0 (a level-1 sleep reads awake=0, "
                                 "discard_all=0, weights_offloaded=1)")
    # The requests in flight first (this engine's /metrics has none to count), then the sleep and its checks.
    assert server.seen == ["GET /metrics", "POST /sleep?level=1&mode=wait", "GET /is_sleeping", "GET /metrics"]


def test_a_level_1_sleep_that_the_gauge_reports_as_level_2_is_not_trusted(engine) -> None:
    with pytest.raises(StandbyError, match=r"says awake=0, discard_all=1, weights_offloaded=0 \(a level-1"):
        SleepEndpoints(url(engine(_answers(_metrics(0, 0, 1)))), 5).sleep(1)


def test_an_engine_without_the_gauge_is_not_trusted(engine) -> None:
    with pytest.raises(StandbyError, match=r"^GET /metrics has no vllm:engine_sleep_state gauge"):
        SleepEndpoints(url(engine(_answers(b"vllm:kv_cache_usage_perc 0.0\n"))), 5).sleep(1)


def test_the_gauge_and_is_sleeping_agreeing_passes(engine) -> None:
    assert SleepEndpoints(url(engine(_answers(_metrics(0, 1, 0)))), 5).sleep(1) == "no request in flight"

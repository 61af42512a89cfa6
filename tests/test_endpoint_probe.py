"""EndpointProbe's answers and requests, against a real HTTP server on loopback that answers as each test says."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from lanectl.health.engine_http import MAX_BODY_BYTES, EngineHttp, EngineUnanswered, engine_url
from lanectl.health.probe import EndpointProbe
from lanectl.recipe.model import GenerationProbe, Health

# Timeouts long enough for any answer on a loaded machine (a 0.5 s generation timeout failed a plain 200 under
# load); the tests of a timeout use SHORT against a server that never answers, and last as long as it.
SETTINGS = Health(
    startup_budget_minutes=20,
    request_timeout_seconds=10,
    served_model_name="demo-model",
    generation_probe=GenerationProbe(prompt="Say OK.", max_tokens=2, timeout_seconds=10),
)
SHORT = replace(SETTINGS, request_timeout_seconds=1.5,
                generation_probe=GenerationProbe(prompt="Say OK.", max_tokens=2, timeout_seconds=2.5))
NEVER = 600.0  # a handler's delay that outlasts every test: the request is never answered


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# (request) -> (status, body); a body that is not bytes is sent as JSON; a float is a delay before answering
Answer = tuple[int, object] | float
Handler = Callable[[Seen], Answer]


class Engine:
    """An HTTP/1.1 server on 127.0.0.1 that records each request and answers with `handler`."""

    def __init__(self, handler: Handler):
        self.seen: list[Seen] = []
        engine = self

        class Handle(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None: ...

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Seen(self.command, self.path, dict(self.headers), self.rfile.read(length) if length else b"")
                engine.seen.append(request)
                answer = handler(request)
                if isinstance(answer, float):
                    time.sleep(answer)
                    return
                status, body = answer
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a client that gave up breaks a late write
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], EndpointProbe]]:
    engines: list[Engine] = []

    def start(handler: Handler, settings: Health = SETTINGS) -> EndpointProbe:
        engines.append(Engine(handler))
        return EndpointProbe(engines[-1].url + "/", settings)

    yield start
    for engine in engines:
        engine.close()


def models(*names: str) -> tuple[int, object]:
    return 200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_health_200_is_ok(serve) -> None:
    result = serve(lambda r: (200, b"")).health_ok()
    assert result.ok and result.detail == "/health answered 200"


def test_health_503_is_a_result(serve) -> None:
    result = serve(lambda r: (503, b"")).health_ok()
    assert not result.ok and result.detail == "/health answered 503"


def test_connection_refused_is_a_result() -> None:
    result = EndpointProbe(f"http://127.0.0.1:{closed_port()}", SETTINGS).health_ok()
    assert not result.ok and result.detail == "/health: connection refused"


def test_no_answer_names_the_request_timeout(serve) -> None:
    endpoints = serve(lambda r: NEVER, SHORT)
    result = endpoints.models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models: no answer within 1.5 s"


def test_an_engine_that_closes_without_answering_is_a_result(serve) -> None:
    result = serve(lambda r: 0.0).health_ok()  # the handler returns without a response
    assert not result.ok and result.detail.startswith("/health: RemoteDisconnected: "), result.detail


def test_the_model_list_must_hold_the_served_model(serve) -> None:
    assert serve(lambda r: models("other", "demo-model")).models_lists_served_model().ok
    result = serve(lambda r: models("other")).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models does not list 'demo-model' (it lists: other)"
    result = serve(lambda r: models()).models_lists_served_model()
    assert result.detail == "/v1/models does not list 'demo-model' (it lists: nothing)"


def test_a_model_list_that_is_not_one_is_a_result(serve) -> None:
    result = serve(lambda r: (200, b"<html>proxy</html>")).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models answered 200 but not with an OpenAI model list"


def test_the_generation_request_is_the_recipes_prompt_at_temperature_0() -> None:
    server = Engine(lambda r: (200, {"choices": [{"text": " OK"}], "usage": {"completion_tokens": 2}}))
    try:
        result = EndpointProbe(server.url, SETTINGS).generate()
    finally:
        server.close()
    assert result.ok and result.detail.startswith("/v1/completions generated 2 tokens in ")
    [request] = server.seen
    assert (request.method, request.path, request.headers["Content-Type"]) == (
        "POST", "/v1/completions", "application/json")
    assert json.loads(request.body) == {
        "model": "demo-model",
        "prompt": "Say OK.",
        "max_tokens": 2,
        "temperature": 0,
        "stream": False,
    }


@pytest.mark.parametrize(
    ("body", "ok", "detail"),
    [
        ({"choices": [{"text": ""}], "usage": {"completion_tokens": 0}}, False, "answered 200 with no generated token"),
        ({"choices": [{"text": " OK"}]}, True, "generated ' OK' in "),
        ({"choices": [{"text": ""}]}, False, "answered 200 with no generated token"),
        ({"choices": []}, False, "answered 200 with no generated token"),
        ({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}, True, "generated 1 token in "),
    ],
)
def test_generation_counts_tokens_from_usage_else_text(serve, body: dict, ok: bool, detail: str) -> None:
    result = serve(lambda r: (200, body)).generate()
    assert result.ok is ok and detail in result.detail


def test_a_dead_engine_answering_503_shows_its_message(serve) -> None:
    error = {"error": {"message": "EngineCore encountered an issue.", "type": "EngineDeadError", "code": 503}}
    result = serve(lambda r: (503, error)).generate()
    assert not result.ok and result.detail == "/v1/completions answered 503: EngineCore encountered an issue."


@pytest.mark.parametrize(("health_status", "diagnosis"), [(200, "health 200: engine stuck?"),
                                                           (503, "/health answered 503")])
def test_a_generation_timeout_says_what_health_answers(serve, health_status: int, diagnosis: str) -> None:
    result = serve(lambda r: (health_status, b"") if r.path == "/health" else NEVER, SHORT).generate()
    assert not result.ok and result.detail == f"generation probe timed out after 2.5 s ({diagnosis})"


def test_a_body_beyond_the_cap_is_cut_and_fails_to_parse(serve) -> None:
    huge = b'{"data": [' + b" " * (2 * MAX_BODY_BYTES) + b"]}"
    result = serve(lambda r: (200, huge)).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models answered 200 but not with an OpenAI model list"


def test_a_proxy_in_the_environment_is_not_used(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy meant for downloads must not carry a probe of a port on this host.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port()}")
    assert serve(lambda r: (200, b"")).health_ok().ok


def test_probes_speak_plain_http_only() -> None:
    with pytest.raises(ValueError, match="plain HTTP"):
        EndpointProbe("https://127.0.0.1:9", SETTINGS)
    with pytest.raises(ValueError, match="http://host:port"):
        EngineHttp("http://127.0.0.1:9/v1")


def test_an_unreachable_address_says_it_cannot_connect() -> None:
    with pytest.raises(EngineUnanswered) as caught:
        EngineHttp("http://no-such-host.invalid:80").request("GET", "/health", timeout=2)
    assert caught.value.failure == "connect" and str(caught.value).startswith("cannot connect (")


@pytest.mark.parametrize(("host_ip", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("", "http://127.0.0.1:8000"),
    ("10.0.0.7", "http://10.0.0.7:8000"),
    ("::", "http://[::1]:8000"),  # every IPv6 address: asked on IPv6 loopback
    ("::1", "http://[::1]:8000"),
    ("fd00::7", "http://[fd00::7]:8000"),
])
def test_a_published_port_is_asked_where_it_listens(host_ip: str, url: str) -> None:
    assert engine_url(host_ip, 8000) == url
    EngineHttp(url)  # and the probe accepts it


def test_a_port_published_on_ipv6_loopback_is_probed_there() -> None:
    class V6Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    class Health(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None: ...

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    try:
        server = V6Server(("::1", 0), Health)
    except OSError as exc:
        pytest.skip(f"this machine has no IPv6 loopback: {exc}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = EndpointProbe(engine_url("::1", server.server_address[1]), SETTINGS).health_ok()
    finally:
        server.shutdown()
        server.server_close()
    assert result.ok and result.detail == "/health answered 200"

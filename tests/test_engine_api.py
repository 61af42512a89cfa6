"""lanectl's own Engine API client against a recording engine, and against the Docker SDK.

The recording engine is a real HTTP server on a unix socket that writes down every request and
answers as the engine does. For each request lanectl makes, the SDK (which lanectl used before, and
which the docker CLI's API matches) is asked for the same thing; both requests must say the same to
the engine. The real engine is exercised by every docker test (test_lanes_docker.py and others).
"""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import docker
import docker.types
import docker.utils
import pytest

from lanectl.dockerapi.containers import ContainerEngine, ContainerSpec
from lanectl.dockerapi.engine_api import (
    EngineAPI,
    EngineUnreachable,
    NotFound,
    demultiplex,
    encode_query,
)
from lanectl.dockerapi.sizes import size_in_bytes
from lanectl.dockerapi.swarm import ServiceState, SwarmEngine
from lanectl.errors import OperationFailed

API_VERSION = "1.45"


class Recorded:
    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes):
        parts = urlsplit(target)
        self.method, self.path, self.headers, self.body = method, parts.path, headers, body
        self.query = {key: values[0] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}

    def json(self) -> Any:
        return json.loads(self.body) if self.body and "json" in self.headers.get("Content-Type", "") else None

    def said(self) -> tuple[str, str, dict[str, Any], Any]:
        """What the engine reads: booleans as it parses them, JSON query values parsed, the body as JSON."""
        query = {key: _engine_value(value) for key, value in self.query.items()}
        return self.method, self.path, query, self.json()


def _engine_value(value: str) -> Any:
    if value.lower() in ("1", "true"):
        return True
    if value.lower() in ("0", "false"):
        return False
    if value.startswith(("{", "[")):
        return json.loads(value)
    return value


Answer = tuple[int, dict[str, str], bytes]


class RecordingEngine:
    """An engine on a unix socket: `/_ping` answers its API version; `answer(request)` answers the rest."""

    def __init__(self, socket_path: Path, answer: Callable[[Recorded], Answer | Iterator[bytes]]):
        self.requests: list[Recorded] = []
        self.connections = 0
        self.errors: list[BaseException | None] = []
        self.socket_path = socket_path
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                engine.connections += 1

            def log_message(self, *args: Any) -> None: ...

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.path.endswith("/_ping"):
                    self.send_response(200)
                    self.send_header("Api-Version", API_VERSION)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"OK")
                    return
                request = Recorded(self.command, self.path, dict(self.headers), body)
                engine.requests.append(request)
                answer = engine.answer(request)
                if isinstance(answer, tuple):
                    status, headers, data = answer
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_DELETE = _handle

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # type: ignore[no-untyped-def]
                # A client that gives up (the timeout and stale-connection tests) breaks the handler's write:
                # kept for a test to read, not printed into the run's output.
                engine.errors.append(sys.exc_info()[1])

            def get_request(self):  # type: ignore[no-untyped-def]
                request, _ = super().get_request()
                return request, ("local", 0)  # BaseHTTPRequestHandler wants a (host, port) address

        self.answer = answer
        self.server = Server(str(socket_path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ok_json(payload: Any = None) -> Answer:
    return 200, {}, json.dumps(payload if payload is not None else {}).encode()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A unix socket path must stay short (108 bytes): pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="eng-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture
def recording(socket_dir: Path) -> Iterator[Callable[..., RecordingEngine]]:
    engines: list[RecordingEngine] = []

    def start(answer: Callable[[Recorded], Answer | Iterator[bytes]] = lambda r: ok_json({"Id": "c0ffee"}),
              name: str = "engine.sock") -> RecordingEngine:
        engine = RecordingEngine(socket_dir / name, answer)
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.close()


def sdk(engine: RecordingEngine) -> docker.APIClient:
    return docker.APIClient(base_url=engine.url, version=API_VERSION)


SPEC = ContainerSpec(
    name="lt-demo-h2", role="primary", image="lanectl/demo:demo-h2-abc", command=["--port", "8000"],
    entrypoint=["python3", "-m", "stubengine"], env={"STUB_TOKENS": "3", "A": "b=c"}, secret_env=["HF_TOKEN"],
    ports=[{"container": 8000, "protocol": "tcp", "host": 8001, "host_ip": "127.0.0.1"}],
    volumes=[{"source": "/models", "target": "/models", "read_only": True},
             {"volume": "cache", "target": "/root/.cache", "read_only": False}],
    gpus={"count": "all"}, shm_size="16g", ipc="host", init=True, user="1000:1000", stop_timeout_seconds=45,
    labels={"io.lanectl.lane": "demo-h2", "io.lanectl.role": "primary"},
)


def sdk_create(api: docker.APIClient, spec: ContainerSpec, env: dict[str, str], gpus: Any) -> None:
    """The SDK call lanectl made before its own client (lanectl 0.1, dockerapi/containers.py)."""
    requests = []
    if gpus is not None:
        requests = [docker.types.DeviceRequest(capabilities=[["gpu"]], **gpus)]
    host_config = api.create_host_config(
        port_bindings={f"{p['container']}/{p['protocol']}": (p["host_ip"], p["host"]) for p in spec.ports},
        binds={(v.get("source") or v["volume"]): {"bind": v["target"], "mode": "ro" if v.get("read_only") else "rw"}
               for v in spec.volumes},
        device_requests=requests or None, shm_size=spec.shm_size, ipc_mode=spec.ipc, init=spec.init)
    api.create_container(spec.image, command=spec.command, entrypoint=spec.entrypoint, name=spec.name,
                         environment=env, ports=[(p["container"], p["protocol"]) for p in spec.ports],
                         labels=spec.labels, user=spec.user, stop_timeout=spec.stop_timeout_seconds,
                         host_config=host_config, detach=True)


@pytest.mark.parametrize("gpus, sdk_gpus", [({"count": "all"}, {"count": -1}), ({"count": 2}, {"count": 2}),
                                            ({"device_ids": ["0", "3"]}, {"device_ids": ["0", "3"]})])
def test_create_says_what_the_sdk_says(recording, gpus, sdk_gpus):
    engine = recording()
    spec = ContainerSpec(**{**SPEC.as_dict(), "gpus": gpus})
    ContainerEngine(EngineAPI(engine.url)).create(spec, with_gpus=True, environ={"HF_TOKEN": "hf_secret"})
    sdk_create(sdk(engine), spec, {**spec.env, "HF_TOKEN": "hf_secret"}, sdk_gpus)
    ours, theirs = engine.requests
    assert ours.said() == theirs.said()
    assert ours.path == f"/v{API_VERSION}/containers/create" and ours.query == {"name": "lt-demo-h2"}


def test_create_of_a_bare_spec_without_gpus_says_what_the_sdk_says(recording):
    engine = recording()
    spec = ContainerSpec(**{**SPEC.as_dict(), "command": None, "entrypoint": None, "user": None, "shm_size": None,
                            "ipc": None, "init": False, "ports": [], "volumes": [], "secret_env": []})
    ContainerEngine(EngineAPI(engine.url)).create(spec, with_gpus=False, environ={})
    sdk_create(sdk(engine), spec, spec.env, None)
    ours, theirs = engine.requests
    assert ours.said() == theirs.said()


def test_lifecycle_requests_say_what_the_sdk_says(recording):
    engine = recording(lambda r: (204, {}, b"") if r.method != "GET" else ok_json([]))
    ours = ContainerEngine(EngineAPI(engine.url))
    theirs = sdk(engine)
    steps: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
        (lambda: ours.start("lt-a"), lambda: theirs.start("lt-a")),
        (lambda: ours.stop("lt-a", 30), lambda: theirs.stop("lt-a", timeout=30)),
        (lambda: ours.remove("lt-a"), lambda: theirs.remove_container("lt-a", force=True)),
        (lambda: ours.tag("lanectl/x:h2-abc", "127.0.0.1:5000/lanectl/x:h2"),
         lambda: theirs.tag("lanectl/x:h2-abc", "127.0.0.1:5000/lanectl/x", "h2")),
        (lambda: ours.lane_containers("demo"),
         lambda: theirs.containers(all=True, filters={"label": "io.lanectl.recipe=demo"})),
    ]
    for mine, sdks in steps:
        engine.requests.clear()
        mine()
        sdks()
        assert len(engine.requests) == 2
        a, b = (r.said() for r in engine.requests)
        for name, value in SDK_DEFAULTS.items():
            if b[2].get(name) == value:
                del b[2][name]
        assert a == b


# What the SDK spells out that the engine assumes anyway, and lanectl leaves to it: remove's `v` and `link`,
# tag's `force` (ignored since API 1.24), the container list's `size`, `trunc_cmd` and `limit`.
SDK_DEFAULTS = {"v": False, "link": False, "force": False, "size": False, "trunc_cmd": False, "limit": "-1"}


def test_swarm_requests_say_what_the_sdk_says(recording):
    spec = {"Name": "lt-h2", "Labels": {"io.lanectl.fleet": "1"}, "TaskTemplate": {"ContainerSpec": {"Env": []}}}

    def answer(request: Recorded) -> Answer:
        if request.path.endswith("/info"):
            return ok_json({"Swarm": {"LocalNodeState": "active", "ControlAvailable": True, "NodeID": "n1"}})
        if request.path.endswith("/nodes/n1"):
            return ok_json({"ID": "n1", "Version": {"Index": 7}, "Spec": {"Labels": {"a": "b"}, "Role": "manager"},
                            "Description": {"Hostname": "box1"}})
        if request.path.endswith("/services/create"):
            return ok_json({"ID": "s1"})
        if request.path.endswith(("/services", "/tasks", "/nodes")):
            return ok_json([])
        return 200, {}, b""

    engine = recording(answer)
    ours = SwarmEngine(EngineAPI(engine.url))
    theirs = sdk(engine)
    current = ServiceState(id="s1", name="lt-h2", version=12, spec=spec, previous_spec=None, update_state=None,
                           update_started=None, update_message="")
    steps: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
        (ours.lane_services, lambda: theirs.services(filters={"label": "io.lanectl.fleet"})),
        (lambda: ours.tasks("s1"), lambda: theirs.tasks(filters={"service": "s1"})),
        (ours.nodes, theirs.nodes),
        (lambda: ours.create_service(spec, {}), lambda: theirs._post_json(theirs._url("/services/create"), data=spec)),
        (lambda: ours.rollback_service(current),
         lambda: theirs._post_json(theirs._url("/services/{0}/update", "s1"), data=spec,
                                   params={"version": 12, "rollback": "previous"})),
        (lambda: ours._update_node_labels(ours._inspect_node("n1"), {"x": "y"}),
         lambda: theirs.update_node("n1", 7, {"Labels": {"x": "y"}, "Role": "manager"})),
    ]
    for mine, sdks in steps:
        engine.requests.clear()
        mine()
        sdks()
        if len(engine.requests) == 3:  # ours read the node first
            engine.requests.pop(0)
        a, b = (r.said() for r in engine.requests)
        assert a == b


def test_logs_come_back_as_the_sdk_joins_them(recording):
    frames = b"".join(bytes([stream, 0, 0, 0]) + len(text).to_bytes(4, "big") + text
                      for stream, text in [(1, b"INFO starting\n"), (2, b"WARN \xc3\xa9 slow\n"), (1, b"ready\n")])
    engine = recording(lambda r: (200, {"Content-Type": "application/vnd.docker.multiplexed-stream"}, frames)
                       if r.path.endswith("/logs") else ok_json({"Config": {"Tty": False}}))
    ours = ContainerEngine(EngineAPI(engine.url)).logs("lt-a", since=1764580000.25, tail=60)
    theirs = sdk(engine).logs("lt-a", since=1764580000.25, tail=60).decode()
    assert ours == theirs == "INFO starting\nWARN é slow\nready\n"
    ours_asked, sdk_asked = (r.said() for r in engine.requests if r.path.endswith("/logs"))
    assert sdk_asked[2].pop("follow") is False
    assert ours_asked == sdk_asked


def test_a_tty_log_is_taken_as_it_is(recording):
    engine = recording(lambda r: (200, {"Content-Type": "application/vnd.docker.raw-stream"}, b"\x01plain\n"))
    assert ContainerEngine(EngineAPI(engine.url)).logs("lt-a") == "\x01plain\n"


def test_followed_logs_arrive_frame_by_frame(recording):
    def answer(request: Recorded) -> Iterator[bytes]:
        for text in (b"one\n", b"two\n"):
            frame = b"\x01\0\0\0" + len(text).to_bytes(4, "big") + text
            yield frame[:5]  # a frame split across chunks
            yield frame[5:]

    engine = recording(answer)
    chunks = list(ContainerEngine(EngineAPI(engine.url)).follow_logs("lt-a", since=5.0))
    assert chunks == [b"one\n", b"two\n"]
    assert engine.requests[0].said()[2] == {"stdout": True, "stderr": True, "follow": True, "since": "5.0",
                                            "tail": "all"}


def test_a_build_stream_is_read_whatever_its_chunks(recording):
    text = "\r\n".join(json.dumps(item) for item in [
        {"stream": "Step 1/2 : FROM lanectl/base\n"}, {"stream": " ---> Using cache\n"},
        {"stream": "Step 2/2 : RUN echo é\n"}, {"stream": "é\n"}, {"aux": {"ID": "sha256:abc"}}]).encode()

    def answer(request: Recorded) -> Iterator[bytes]:
        for at in range(0, len(text), 7):  # splits objects, and the two bytes of each é
            yield text[at:at + 7]

    engine = recording(answer)
    log = ContainerEngine(EngineAPI(engine.url)).build(b"tar-bytes", "lanectl/x:h2", no_cache=False)
    assert (log.steps_total, log.steps_cached, log.image_id, log.error) == (2, 1, "sha256:abc", None)
    assert log.lines[-1] == "é"
    request = engine.requests[0]
    assert request.body == b"tar-bytes" and request.headers["Content-Type"] == "application/x-tar"
    assert request.said()[2] == {"t": "lanectl/x:h2", "rm": True, "forcerm": True, "nocache": False, "pull": False}


def test_events_stream_until_closed(recording):
    release = threading.Event()

    def answer(request: Recorded) -> Iterator[bytes]:
        yield b'{"status": "die", "Actor": {"Attributes": {"name": "lt-a"}}}\n{"status": "st'
        yield b'art"}\n'
        release.wait(10)

    engine = recording(answer)
    events = ContainerEngine(EngineAPI(engine.url)).container_events("io.lanectl.lane")
    seen = []
    for event in events.json_objects():
        seen.append(event["status"])
        if len(seen) == 2:
            events.close()
            break
    release.set()
    assert seen == ["die", "start"]
    assert engine.requests[0].said()[2] == {"filters": {"type": ["container"], "label": ["io.lanectl.lane"]}}


def test_not_found_is_none_and_an_error_carries_the_engines_words(recording):
    def answer(request: Recorded) -> Answer:
        if request.path.endswith("/json"):
            return 404, {}, b'{"message": "No such container: lt-a"}'
        if request.method == "DELETE":
            return 204, {}, b""
        return 500, {}, b'{"message": "could not select device driver \\"\\" with capabilities: [[gpu]]"}'

    engine = recording(answer)
    containers = ContainerEngine(EngineAPI(engine.url))
    assert containers.container("lt-a") is None
    with pytest.raises(NotFound, match="No such container: lt-a"):
        containers.api.get("/containers/lt-a/json")
    with pytest.raises(Exception, match="no NVIDIA container runtime"):
        containers.start("lt-a")
    assert engine.requests[-1].method == "DELETE"  # the half-made container is removed


def test_a_kept_alive_connection_the_engine_closed_is_retried_once_on_a_new_one(recording):
    served = []

    def answer(request: Recorded) -> Answer:
        served.append(request.path)
        return ok_json([])

    engine = recording(answer)
    api = EngineAPI(engine.url)
    api.get("/containers/json")
    assert engine.connections == 1
    for connection in api._idle:  # as an engine restart or its idle timeout leaves them
        assert connection.sock is not None
        connection.sock.shutdown(socket.SHUT_RDWR)
    api.get("/containers/json")
    assert engine.connections == 2 and len(served) == 2
    api.get("/containers/json")
    assert engine.connections == 2, "the new connection is kept alive"


def test_one_client_serves_threads_at_once(recording):
    engine = recording(lambda r: ok_json({"Id": r.path}))
    api = EngineAPI(engine.url)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: results.append(api.get(f"/containers/c{i}/json")["Id"]))
               for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(f"/v{API_VERSION}/containers/c{i}/json" for i in range(16))


def test_an_engine_that_is_not_there_says_how_to_start_it(socket_dir):
    with pytest.raises(EngineUnreachable, match="cannot reach the Docker engine at unix://.*start it"):
        EngineAPI(f"unix://{socket_dir}/absent.sock")


def test_an_ssh_docker_host_says_how_to_reach_it():
    with pytest.raises(EngineUnreachable, match="ssh -NL"):
        EngineAPI.from_env({"DOCKER_HOST": "ssh://me@box"})


@pytest.mark.parametrize("size", ["1024", "1m", "512m", "16g", "16G", "3k", "4096g", "1b"])
def test_sizes_read_as_docker_reads_them(size):
    assert size_in_bytes(size) == docker.utils.parse_bytes(size)


def test_query_values_as_the_engine_parses_them():
    assert encode_query({"all": True, "force": False, "since": None, "filters": {"label": ["a=b"]}, "t": 5}) == (
        "all=1&force=0&filters=%7B%22label%22%3A+%5B%22a%3Db%22%5D%7D&t=5")


def test_demultiplex_keeps_what_arrived_of_a_torn_last_frame():
    whole = b"\x01\0\0\0\0\0\0\x03abc"
    assert demultiplex(whole + b"\x02\0\0\0\0\0\0\x09par") == b"abc" + b"par"


def test_a_start_the_engine_fails_is_asked_again_and_a_refused_one_is_not(recording, monkeypatch):
    monkeypatch.setattr("lanectl.dockerapi.containers.START_RETRY_SECONDS", (0.0, 0.0, 0.0))
    answers = iter([(500, {}, b'{"message": "failed to update store for object type *libnetwork.endpoint"}')] * 2
                   + [(204, {}, b"")])
    engine = recording(lambda r: next(answers))
    ContainerEngine(EngineAPI(engine.url)).start("lt-a")
    assert len(engine.requests) == 3  # the engine was not ready twice (just restarted), then started it

    always = recording(lambda r: (500, {}, b'{"message": "port is already allocated"}'), name="busy.sock")
    with pytest.raises(OperationFailed, match="lt-a: start failed: port is already allocated"):
        ContainerEngine(EngineAPI(always.url)).start("lt-a")
    assert len(always.requests) == 4

    refused = recording(lambda r: (409, {}, b'{"message": "container is marked for removal"}'), name="gone.sock")
    with pytest.raises(OperationFailed, match="marked for removal"):
        ContainerEngine(EngineAPI(refused.url)).start("lt-a")
    assert len(refused.requests) == 1, "a refusal (4xx) is not asked again"


def test_an_engine_that_does_not_answer_in_time_is_named_with_the_request(recording):
    import time

    engine = recording(lambda r: (time.sleep(3), ok_json([]))[1])
    with pytest.raises(EngineUnreachable, match=r"did not answer GET /containers/json within 1 s"):
        EngineAPI(engine.url).get("/containers/json", timeout=1.0)


def test_bytes_that_are_not_utf8_in_a_stream_are_replaced_not_waited_on(recording):
    engine = recording(lambda r: iter([b'{"stream": "bad \xff byte"}\r\n', b'{"stream": "next"}\r\n']))
    stream = EngineAPI(engine.url).stream("GET", "/events")
    assert [item["stream"] for item in stream.json_objects()] == ["bad \ufffd byte", "next"]


def test_a_connect_to_a_full_unix_backlog_waits_for_room_instead_of_failing(socket_dir):
    from lanectl.dockerapi.engine_api import _unix_connector

    path = str(socket_dir / "busy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    waiting = []
    try:
        while True:  # fill the backlog until the kernel answers EAGAIN, as it does to a busy engine's callers
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(1)
            try:
                sock.connect(path)
            except BlockingIOError:
                sock.close()
                break
            waiting.append(sock)
        accepted = []
        drain = threading.Timer(0.3, lambda: accepted.extend(server.accept() for _ in waiting))
        drain.start()
        connected = _unix_connector(path)(10)  # before the fix: BlockingIOError at once
        drain.join()
        connected.close()
        for sock, _ in accepted:
            sock.close()
    finally:
        for sock in waiting:
            sock.close()
        server.close()

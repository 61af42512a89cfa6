"""The Docker Engine API over its socket (on `lanectl.dockerapi.http1`): the requests lanectl makes.

Why not the Docker SDK: importing it (requests, urllib3, its models) costs ~50 ms at every start of
`lanectl status`, `up`, `rollback` and the watchdog's cron pass, and each request goes through
requests' layers. lanectl makes a few dozen kinds of JSON request, all documented by the Engine API.
The one thing kept from the SDK is its reading of registry logins (`docker.auth`: ~/.docker/config.json
and credential helpers), imported only by a build or a push, which talk to registries.

One `EngineAPI` serves a process (`engine_api()`), from any thread: each request borrows an idle
keep-alive connection or opens one; a stream (build output, events, followed logs) has its own.
"""

from __future__ import annotations

import codecs
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from lanectl.dockerapi.http1 import Connection, RemoteDisconnected, Response, host_header, tcp_connector
from lanectl.errors import OperationFailed

if TYPE_CHECKING:
    import ssl  # imported where an engine is reached over TLS, never by a command that talks to a local one

DEFAULT_HOST = "unix:///var/run/docker.sock"
TIMEOUT_SECONDS = 60.0  # the SDK's default: a request the engine has not answered by then is stuck


class EngineError(Exception):
    """The engine answered a request with an error status; `explanation` is its own message."""

    def __init__(self, status: int, explanation: str, method: str, path: str):
        super().__init__(f"{status} {method} {path}: {explanation}")
        self.status = status
        self.explanation = explanation


class NotFound(EngineError):
    """404: no such container, image, service, node, or registry tag."""


class EngineUnreachable(OperationFailed):
    pass


def _unix_connector(socket_path: str) -> Callable[[float | None], socket.socket]:
    def connect(timeout: float | None) -> socket.socket:
        # A unix socket whose listen backlog is full answers a connect with EAGAIN at once, where a TCP connect
        # would wait: wait for room instead, within the connection's timeout (a busy engine, many threads at once).
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(socket_path)
            except BlockingIOError:
                sock.close()
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(2 * pause, 0.2)
                continue
            except BaseException:
                sock.close()
                raise
            return sock

    return connect


def _tls_connector(host: str, port: int, tls: ssl.SSLContext) -> Callable[[float | None], socket.socket]:
    tcp = tcp_connector(host, port)

    def connect(timeout: float | None) -> socket.socket:
        sock = tcp(timeout)
        try:
            return tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise

    return connect


class Stream:
    """A streamed answer (build output, push progress, events, followed logs), closed when done or abandoned."""

    def __init__(self, connection: Connection, response: Response):
        self._connection = connection
        self.response = response

    def json_objects(self) -> Iterator[dict[str, Any]]:
        """The JSON objects the engine writes one after another (not always one per line or per chunk)."""
        decoder = json.JSONDecoder()
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two chunks
        buffer = ""
        try:
            while True:
                chunk = self.response.read1(65536)
                if not chunk:
                    break
                buffer += text.decode(chunk)
                while True:
                    buffer = buffer.lstrip()
                    if not buffer:
                        break
                    try:
                        item, end = decoder.raw_decode(buffer)
                    except json.JSONDecodeError:
                        break  # an object split across chunks
                    buffer = buffer[end:]
                    if isinstance(item, dict):
                        yield item
        finally:
            self.close()

    def log_chunks(self) -> Iterator[bytes]:
        """A container's output as it comes: the frames of a multiplexed stream, or raw bytes from a TTY."""
        try:
            header = self.response.read(8)
            if _is_multiplexed(self.response, header):
                while len(header) == 8:
                    payload = self.response.read(int.from_bytes(header[4:8], "big"))
                    if payload:
                        yield payload
                    header = self.response.read(8)
            else:
                chunk = header
                while chunk:
                    yield chunk
                    chunk = self.response.read1(65536)
        finally:
            self.close()

    def close(self) -> None:
        """Ends the stream; a thread blocked reading it wakes (the socket is shut down, not only closed)."""
        sock = self._connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the engine
        self.response.close()
        self._connection.close()


class _ReadResponse:
    """An answer read whole: its status, headers (lowercase names) and body."""

    def __init__(self, status: int, headers: Mapping[str, str], data: bytes):
        self.status, self.headers, self.data = status, headers, data

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


class EngineAPI:
    """One Docker engine, reached at `base_url` (unix://, tcp://, http://, https://), at the API version it speaks."""

    def __init__(self, base_url: str = DEFAULT_HOST, *, tls: ssl.SSLContext | None = None):
        self.base_url = base_url
        self._tls = tls
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self.requests = 0  # sent by this client, streams and the version check included (benchmarks count them)
        parts = urlsplit(base_url)
        if parts.scheme in ("unix", "http+unix"):
            self._socket_path: str | None = parts.path or "/var/run/docker.sock"
        elif parts.scheme in ("tcp", "http", "https"):
            self._socket_path = None
            if not parts.hostname:
                raise EngineUnreachable(f"DOCKER_HOST={base_url}: no host in it; e.g. tcp://10.0.0.5:2376")
            self._host, self._port = parts.hostname, parts.port or (2376 if tls else 2375)
            if parts.scheme == "https" and self._tls is None:
                import ssl

                self._tls = ssl.create_default_context()
        else:
            raise EngineUnreachable(
                f"DOCKER_HOST={base_url}: lanectl reaches an engine at unix://, tcp:// or https:// addresses; "
                "for ssh://, forward the remote socket (`ssh -NL /tmp/docker.sock:/var/run/docker.sock HOST`) and "
                "set DOCKER_HOST=unix:///tmp/docker.sock")
        # The engine's own API version, as the SDK negotiates it; asking is also the check that it is there.
        self.version = ""
        ping = self._send("GET", "/_ping", timeout=TIMEOUT_SECONDS)
        self.version = ping.getheader("Api-Version") or "1.41"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> EngineAPI:
        """As the docker CLI reads its environment: DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH."""
        host = environ.get("DOCKER_HOST") or DEFAULT_HOST
        verify = environ.get("DOCKER_TLS_VERIFY", "") not in ("", "0")
        cert_path = environ.get("DOCKER_CERT_PATH", "")
        tls = None
        if verify or cert_path:
            import ssl

            folder = Path(cert_path) if cert_path else Path.home() / ".docker"
            tls = ssl.create_default_context(cafile=str(folder / "ca.pem") if verify else None)
            if not verify:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            if (folder / "cert.pem").exists():
                tls.load_cert_chain(str(folder / "cert.pem"), str(folder / "key.pem"))
            if host.startswith("tcp://"):
                host = "https://" + host.removeprefix("tcp://")
        return cls(host, tls=tls)

    # -- requests ----------------------------------------------------------------------------------

    def get(self, path: str, *, params: Mapping[str, Any] | None = None, **options: Any) -> Any:
        return self._json(self._send("GET", path, params=params, **options))

    def post(self, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None, **options: Any) -> Any:
        return self._json(self._send("POST", path, params=params, body=body, **options))

    def post_status(self, path: str, *, params: Mapping[str, Any] | None = None) -> int:
        """A POST whose answer is only its status: 204 done, 304 nothing to do (a container already started)."""
        return self._send("POST", path, params=params).status

    def delete(self, path: str, *, params: Mapping[str, Any] | None = None) -> Any:
        return self._json(self._send("DELETE", path, params=params))

    def logs(self, path: str, *, params: Mapping[str, Any]) -> bytes:
        """A finished log answer as text bytes: stdout and stderr frames joined in the order written."""
        response = self._send("GET", path, params=params)
        data = response.data
        return demultiplex(data) if _is_multiplexed(response, data) else data

    def stream(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None,
               headers: Mapping[str, str] | None = None) -> Stream:
        """A request whose answer is read as it comes, on a connection of its own, with no read timeout."""
        connection = self._connect(timeout=None)
        self.requests += 1
        try:
            response = self._exchange(connection, method, path, params, body, headers)
            if response.status >= 400:
                self._raise(response, response.read(), method, path)
        except BaseException:
            connection.close()
            raise
        return Stream(connection, response)

    def url(self, path: str, *parts: str) -> str:
        """`path` with each `{}` filled by one of `parts`, quoted as the engine's router expects: an image
        reference keeps its `/` and `:` (`/images/registry:5000/lanectl/x:tag/json`)."""
        return path.format(*(quote(part, safe="/:") for part in parts))

    # -- the wire ----------------------------------------------------------------------------------

    def _send(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None,
              headers: Mapping[str, str] | None = None, timeout: float | None = TIMEOUT_SECONDS
              ) -> _ReadResponse:
        """One request on a kept-alive connection; its whole answer is read (as `.data`) and checked."""
        self.requests += 1
        for attempt in (1, 2):
            connection, reused = self._borrow(timeout)
            try:
                response = self._exchange(connection, method, path, params, body, headers)
                data = response.read()
            except (RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                # A kept-alive connection the engine had closed (an idle timeout, a restart): the request
                # never reached it, so it is sent once more on a new connection.
                if reused and attempt == 1:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            if response.will_close:
                connection.close()
            else:
                with self._lock:
                    self._idle.append(connection)
            if response.status >= 400:
                self._raise(response, data, method, path)
            return _ReadResponse(response.status, response.headers, data)
        raise AssertionError("unreachable")

    def _exchange(self, connection: Connection, method: str, path: str,
                  params: Mapping[str, Any] | None, body: Any, headers: Mapping[str, str] | None
                  ) -> Response:
        url = f"/v{self.version}{path}" if self.version else path
        query = encode_query(params or {})
        if query:
            url += "?" + query
        sent_headers = dict(headers or {})
        payload: bytes | None = None
        if isinstance(body, bytes):
            payload = body
        elif body is not None:
            payload = json.dumps(body).encode()
            sent_headers["Content-Type"] = "application/json"
        elif method == "POST":
            payload = b""  # Content-Length: 0, as the engine expects of a POST without a body
        try:
            connection.request(method, url, body=payload, headers=sent_headers)
            return connection.getresponse()
        except TimeoutError:
            raise EngineUnreachable(
                f"the Docker engine at {self.base_url} did not answer {method} {path} within "
                f"{connection.timeout:.0f} s; is it overloaded or stuck? (`docker info` tells)") from None
        except (FileNotFoundError, ConnectionRefusedError, socket.gaierror) as exc:
            raise EngineUnreachable(
                f"cannot reach the Docker engine at {self.base_url} ({exc.strerror or exc}); start it "
                "(e.g. `dockerd &`, or `systemctl start docker`) or set DOCKER_HOST") from None
        except PermissionError:
            raise EngineUnreachable(
                f"no permission to use the Docker engine's socket {self._socket_path}; run as a member of the "
                "`docker` group (`sudo usermod -aG docker $USER`, then log in again) or as root") from None

    def _borrow(self, timeout: float | None) -> tuple[Connection, bool]:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            return self._connect(timeout), False
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        connection.timeout = timeout
        return connection, True

    def _connect(self, timeout: float | None) -> Connection:
        if self._socket_path is not None:
            return Connection(_unix_connector(self._socket_path), "localhost", timeout)
        host = host_header(self._host, self._port)
        if self._tls is not None:
            return Connection(_tls_connector(self._host, self._port, self._tls), host, timeout)
        return Connection(tcp_connector(self._host, self._port), host, timeout)

    @staticmethod
    def _json(response: _ReadResponse) -> Any:
        data = response.data
        if not data.strip():
            return None
        if "json" not in (response.getheader("Content-Type") or "application/json"):
            return data.decode(errors="replace")
        return json.loads(data)

    @staticmethod
    def _raise(response: Response, data: bytes, method: str, path: str) -> None:
        text = data.decode(errors="replace").strip()
        try:
            explanation = str(json.loads(text)["message"])
        except (ValueError, KeyError, TypeError):
            explanation = text or (response.reason or "")
        error = NotFound if response.status == 404 else EngineError
        raise error(response.status, explanation, method, path)


def encode_query(params: Mapping[str, Any]) -> str:
    """Query values as the engine reads them: booleans as 1/0, filters and maps as JSON, None left out."""
    pairs = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        pairs.append((key, str(value)))
    return urlencode(pairs)


def filters(**wanted: str) -> dict[str, list[str]]:
    """The engine's filter map: each filter a list of values."""
    return {name: [value] for name, value in wanted.items()}


def _is_multiplexed(response: Response | _ReadResponse, first: bytes) -> bool:
    """Whether a log answer is framed (a container without a TTY, as lanectl's are) or raw (with a TTY).

    API 1.42+ says so in its Content-Type; older engines call both raw-stream, so the first bytes decide:
    a frame header is a stream number (0-2) and three zero bytes, which a TTY's text does not start with."""
    if "multiplexed-stream" in (response.getheader("Content-Type") or ""):
        return True
    return len(first) >= 8 and first[0] in (0, 1, 2) and first[1:4] == b"\0\0\0"


def demultiplex(data: bytes) -> bytes:
    """The payloads of a multiplexed log answer (8-byte header: stream, 0, 0, 0, big-endian size)."""
    out, at = bytearray(), 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at + 4:at + 8], "big")
        out += data[at + 8:at + 8 + size]
        at += 8 + size
    return bytes(out)


def registry_auth(ref: str) -> str:
    """X-Registry-Auth for the registry of `ref`: `docker login`'s credentials for it, or none (`{}`), as the
    docker CLI sends it; a push without the header is refused ("missing X-Registry-Auth")."""
    from docker import auth  # only builds and pushes pay for it; see the module's docstring

    registry, _ = auth.resolve_repository_name(ref)
    credentials = auth.load_config().resolve_authconfig(registry)
    return auth.encode_header(credentials or {}).decode()


def registry_config() -> str | None:
    """X-Registry-Config for a build: every registry's login, as the SDK (and `docker build`) send them."""
    from docker import auth

    credentials = auth.load_config().get_all_credentials()
    return auth.encode_header(credentials).decode() if credentials else None


_shared: dict[tuple[str, str, str], EngineAPI] = {}
_shared_lock = threading.Lock()


def engine_api(environ: Mapping[str, str] = os.environ) -> EngineAPI:
    """The process's client for the engine its environment names: one negotiation, kept-alive connections."""
    key = (environ.get("DOCKER_HOST", ""), environ.get("DOCKER_TLS_VERIFY", ""), environ.get("DOCKER_CERT_PATH", ""))
    with _shared_lock:
        if key not in _shared:
            _shared[key] = EngineAPI.from_env(environ)
        return _shared[key]

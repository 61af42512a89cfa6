"""Plain HTTP to a lane's engine, as the health probes and the sleep routes speak it.

One request per connection, on lanectl's own HTTP/1.1 (`lanectl.dockerapi.http1`):
- probes and sleep requests are a few small requests a minute to a port on this host or a fleet node, never
  TLS. A fresh loopback connection costs well under a millisecond, and it also proves that the engine still
  accepts connections. No pool means nothing stale to retry and nothing shared between the watchdog's threads.
- no proxy from the environment: an `HTTP_PROXY` set for downloads must not carry a probe of 127.0.0.1.
- the watchdog (cron's pass every minute, the `run` daemon) and every `status`, `up` and `rollback` use it, and
  it costs them no client library: httpx and the SSL context it builds for every client added ~3 MiB to
  `watchdog run` and ~35 ms of CPU to a `watchdog check` (`make bench` prints both).
"""

from __future__ import annotations

import json
from typing import Any, Literal
from urllib.parse import urlsplit

from lanectl.dockerapi.http1 import Connection, host_header, tcp_connector
from lanectl.records import frozen

# A probe or a sleep route answers a few hundred bytes; a body this long is cut here (and then fails to parse),
# so a confused server cannot make the watchdog read without end.
MAX_BODY_BYTES = 1 << 20

Failure = Literal["timeout", "refused", "connect", "broken"]


def engine_url(host_ip: str, port: int) -> str:
    """The base URL of a port published on `host_ip`; a port published on every address is asked on loopback,
    and an IPv6 address is bracketed (`http://[::1]:8000`)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host_ip, host_ip)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EngineUnanswered(Exception):
    """No HTTP answer: the connection was refused, could not be made, timed out, or broke before an answer."""

    def __init__(self, failure: Failure, detail: str):
        super().__init__(detail)
        self.failure = failure


@frozen
class EngineAnswer:
    """An engine's HTTP answer: its status code and body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; `ValueError` when it is not."""
        return json.loads(self.body)

    def error_message(self) -> str:
        return error_message(self.body)


def error_message(body: bytes) -> str:
    """What an engine's error body says: vLLM's `{"error": {"message": ...}}` (or a bare `"error"`), FastAPI's
    `{"detail": ...}`, or else the start of the body; "" for an empty one."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return text[:200]
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:200]
        if isinstance(error, str) and error:
            return error[:200]
        if parsed.get("detail"):
            return str(parsed["detail"])[:200]
    return text[:200]


class EngineHttp:
    """Requests to one engine's base URL (`http://host:port`)."""

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"{base_url}: an engine is reached over plain HTTP, as http://host:port")
        self.host = parts.hostname
        self.port = parts.port or 80

    def request(self, method: str, path: str, *, timeout: float, json_body: Any = None) -> EngineAnswer:
        """Send one request and read the whole answer; the timeout bounds the connect and each read."""
        body = None if json_body is None else json.dumps(json_body).encode()
        headers = {"Connection": "close", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        connection = Connection(tcp_connector(self.host, self.port), host_header(self.host, self.port), timeout)
        try:
            try:
                connection.connect()
            except TimeoutError:
                raise EngineUnanswered("timeout", f"no connection within {timeout:g} s") from None
            except ConnectionRefusedError:
                raise EngineUnanswered("refused", "connection refused") from None
            except OSError as exc:
                raise EngineUnanswered("connect", f"cannot connect ({exc})") from None
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read(MAX_BODY_BYTES)
            except TimeoutError:
                raise EngineUnanswered("timeout", f"no answer within {timeout:g} s") from None
            except OSError as exc:  # BadAnswer and RemoteDisconnected among them
                raise EngineUnanswered("broken", f"{type(exc).__name__}: {exc}") from None
            return EngineAnswer(response.status, data)
        finally:
            connection.close()

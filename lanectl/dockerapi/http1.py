"""HTTP/1.1 on a socket: what lanectl sends to the Docker engine and to a lane's engine, and reads back.

Why not the standard library's `http.client`: importing it imports `email`'s parser and `ssl` (OpenSSL), ~17 ms
of CPU at every start of `status`, `up`, `rollback` and the watchdog's cron pass (measured on this project's CI
machine: `import http.client` against `import socket, json, urllib.parse`). Both peers need little of it: a
request line and a few headers out, and back a status line, headers and a body sized by Content-Length, sent
in chunks, or ended when the peer closes. TLS (a Docker engine at https://) wraps the socket with `ssl`,
imported only then, by the caller that makes the socket.

A `Connection` carries one request at a time and may be kept alive for the next; a `Response` is read whole
(`read()`), in parts (`read(n)`, `read1(n)` for streams), or abandoned by closing its connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

MAX_LINE = 65536  # a status or header line longer than this is no answer of these peers
MAX_HEADERS = 100
_NO_BODY_STATUS = (204, 304)


class BadAnswer(OSError):
    """The peer answered something that is not HTTP/1.x."""


class RemoteDisconnected(ConnectionResetError):
    """The peer closed the connection without answering (a kept-alive connection it had already closed)."""


class Connection:
    """One connection to one peer. `connect(timeout)` makes its socket when the first request is sent."""

    def __init__(self, connect: Callable[[float | None], socket.socket], host: str, timeout: float | None):
        self._connect = connect
        self.host = host  # the Host header
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self._reader: _Reader | None = None

    def connect(self) -> None:
        if self.sock is None:
            self.sock = self._connect(self.timeout)
            self._reader = _Reader(self.sock)

    def request(self, method: str, target: str, *, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> None:
        self.connect()
        assert self.sock is not None
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}", "Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        self._method = method

    def getresponse(self) -> Response:
        """The answer to the request sent, its status line and headers read; its body is read from it."""
        assert self._reader is not None, "request() first"
        return Response(self._reader, self._method)

    def close(self) -> None:
        sock, reader, self.sock, self._reader = self.sock, self._reader, None, None
        if reader is not None:
            reader.close()  # the socket's file holds it open until it is closed too
        if sock is not None:
            sock.close()


class Response:
    def __init__(self, reader: _Reader, method: str):
        self._reader = reader
        while True:  # a 100 Continue (or other 1xx but 101) precedes the answer
            version, self.status, self.reason = self._status_line()
            self.headers = self._headers()
            if not 100 <= self.status < 200 or self.status == 101:
                break
        connection = self.headers.get("connection", "").lower()
        self.will_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self._left: int | None = None  # bytes left of the body (of the current chunk, when chunked)
        self._done = False
        if method == "HEAD" or self.status in _NO_BODY_STATUS or 100 <= self.status < 200:
            self._left, self._done = 0, True
        elif not self._chunked:
            length = self.headers.get("content-length")
            if length is not None:
                if not length.strip().isdigit():
                    raise BadAnswer(f"Content-Length {length!r}")
                self._left = int(length)
                self._done = self._left == 0
            else:
                self.will_close = True  # the body ends when the peer closes

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def read(self, amount: int | None = None) -> bytes:
        """The body (what is left of it), or at most `amount` bytes of it: fewer only at its end."""
        parts = []
        wanted = amount if amount is not None else -1
        while wanted != 0:
            part = self._read_some(wanted if wanted > 0 else 1 << 20, whole=True)
            if not part:
                break
            parts.append(part)
            if wanted > 0:
                wanted -= len(part)
        return b"".join(parts)

    def read1(self, amount: int) -> bytes:
        """Up to `amount` bytes of the body, as soon as any came; b"" at its end."""
        return self._read_some(amount, whole=False)

    def close(self) -> None:
        self._done = True

    def _read_some(self, amount: int, *, whole: bool) -> bytes:
        if self._done:
            return b""
        if self._chunked and not self._left:
            self._next_chunk()
            if self._done:
                return b""
        take = amount if self._left is None else min(amount, self._left)
        data = self._reader.read(take) if whole else self._reader.read1(take)
        if self._left is not None:
            if not data:
                raise BadAnswer(f"the answer ended {self._left} bytes short")
            self._left -= len(data)
            if self._left == 0 and not self._chunked:
                self._done = True
        elif not data:
            self._done = True
        return data

    def _next_chunk(self) -> None:
        if self._left == 0:  # the CRLF that ends the chunk before
            self._reader.readline()
        size = self._reader.readline().split(b";", 1)[0].strip()
        try:
            self._left = int(size, 16)
        except ValueError:
            raise BadAnswer(f"chunk size {size[:20]!r}") from None
        if self._left == 0:
            while self._reader.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            self._done = True

    def _status_line(self) -> tuple[str, int, str]:
        line = self._reader.readline()
        if not line:
            raise RemoteDisconnected("Remote end closed connection without response")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise BadAnswer(f"not an HTTP/1.x status line: {line[:80]!r}")
        return version, int(code), reason

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._reader.readline()
            if line in (b"\r\n", b"\n"):
                return headers
            if not line:
                raise BadAnswer("the answer ended within its headers")
            name, colon, value = line.decode("latin-1").partition(":")
            if colon:
                key = name.strip().lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        raise BadAnswer(f"more than {MAX_HEADERS} headers")


class _Reader:
    """A socket read through a buffer: lines for the head, exact or available bytes for the body."""

    def __init__(self, sock: socket.socket):
        self._file = sock.makefile("rb")

    def readline(self) -> bytes:
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise BadAnswer("a line of the answer is too long")
        return line

    def read(self, amount: int) -> bytes:
        return self._file.read(amount)

    def read1(self, amount: int) -> bytes:
        return self._file.read1(amount)

    def close(self) -> None:
        self._file.close()


def tcp_connector(host: str, port: int) -> Callable[[float | None], socket.socket]:
    """Connects to `host:port` (a name, an IPv4 or an IPv6 address) within the timeout, which then bounds
    each read."""

    def connect(timeout: float | None) -> socket.socket:
        sock = socket.create_connection((host, port), timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return connect


def host_header(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

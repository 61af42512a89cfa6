"""lanectl's HTTP/1.1 client against a real socket peer that writes answers byte for byte.

The Docker engine and the lanes' engines are covered by their own tests (test_engine_api.py,
test_endpoint_probe.py); these hold the framing cases those peers rarely produce: a body in chunks split
anywhere, one ended by close, one cut short, an answer never sent, a 100 Continue before the answer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from lanectl.dockerapi.http1 import BadAnswer, Connection, RemoteDisconnected, host_header, tcp_connector


class ScriptedPeer:
    """Accepts connections on loopback; answers each request with the next script's bytes, in the pieces given."""

    def __init__(self, scripts: list[list[bytes]], *, close_after: bool = True):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0
        self._scripts = scripts
        self._close_after = close_after
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        scripts = iter(self._scripts)
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                for script in scripts:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        request += chunk
                    self.requests.append(request)
                    for piece in script:
                        conn.sendall(piece)
                    if self._close_after:
                        break

    def connection(self, timeout: float = 5) -> Connection:
        return Connection(tcp_connector("127.0.0.1", self.port), host_header("127.0.0.1", self.port), timeout)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def peer() -> Iterator[type[ScriptedPeer]]:
    made: list[ScriptedPeer] = []

    def make(scripts: list[list[bytes]], **options: bool) -> ScriptedPeer:
        made.append(ScriptedPeer(scripts, **options))
        return made[-1]

    yield make  # type: ignore[misc]
    for server in made:
        server.close()


def ask(server: ScriptedPeer, method: str = "GET", body: bytes | None = None):
    connection = server.connection()
    connection.request(method, "/x", body=body, headers={"Accept": "application/json"})
    return connection, connection.getresponse()


def test_a_chunked_body_split_anywhere_reads_whole_and_in_exact_pieces(peer):
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\n")
    pieces = [answer[i:i + 3] for i in range(0, len(answer), 3)]
    _, whole = ask(peer([pieces]))
    assert (whole.status, whole.read()) == (200, b"hello, world")
    _, parts = ask(peer([pieces]))
    assert [parts.read(4), parts.read(4), parts.read(8), parts.read(1)] == [b"hell", b"o, w", b"orld", b""]


def test_a_stream_reads_what_came_as_it_comes(peer):
    server = peer([[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"3\r\nabc\r\n",
                    b"2\r\nde\r\n0\r\n\r\n"]])
    _, response = ask(server)
    got = []
    while chunk := response.read1(65536):
        got.append(chunk)
    assert b"".join(got) == b"abcde" and len(got) >= 2


def test_a_body_without_length_ends_when_the_peer_closes_and_the_connection_is_not_kept(peer):
    _, response = ask(peer([[b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it", b" and more"]]))
    assert response.will_close and response.read() == b"all of it and more"
    assert response.getheader("content-TYPE") == "text/plain"


def test_a_body_cut_short_of_its_length_is_an_error_not_a_short_answer(peer):
    _, response = ask(peer([[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"]]))
    with pytest.raises(BadAnswer, match="5 bytes short"):
        response.read()


def test_no_answer_at_all_is_remote_disconnected(peer):
    connection = peer([[]]).connection()
    connection.request("GET", "/x")
    with pytest.raises(RemoteDisconnected):
        connection.getresponse()


def test_an_answer_that_is_not_http_is_refused(peer):
    connection = peer([[b"SSH-2.0-OpenSSH_9.6\r\n"]]).connection()
    connection.request("GET", "/x")
    with pytest.raises(BadAnswer, match="not an HTTP/1.x status line"):
        connection.getresponse()


def test_a_100_continue_is_skipped_and_a_204_has_no_body(peer):
    _, response = ask(peer([[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"]]))
    assert (response.status, response.read()) == (204, b"")


def test_a_kept_alive_connection_carries_the_next_request_and_sends_length_and_host(peer):
    server = peer([[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
                   [b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"]], close_after=False)
    connection = server.connection()
    connection.request("POST", "/a", body=b'{"k": 1}', headers={"Content-Type": "application/json"})
    first = connection.getresponse()
    assert (first.status, first.read(), first.will_close) == (200, b"ok", False)
    connection.request("POST", "/b", body=b"")
    assert connection.getresponse().status == 201
    connection.close()
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /a HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}".encode() in head and b"Content-Length: 8" in head
    assert b"Content-Length: 0" in server.requests[1]


def test_an_ipv6_host_header_is_bracketed():
    assert host_header("::1", 8000) == "[::1]:8000"

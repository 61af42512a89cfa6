"""Webhook alerts against a real local HTTP server, and the node_exporter textfile."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from tenacity import wait_none

from lanectl.errors import OperationFailed
from lanectl.watchdog.alerts import (
    Alert,
    AlertDelivery,
    PrometheusTextfile,
    UrlRedaction,
    WatchdogMetrics,
    WebhookAlerter,
    render_metrics,
)

VAR = "LANECTL_ALERT_WEBHOOK"
TOKEN = "T0FAKE/B0FAKE/xoxFakeSecretToken123"
ALERT = Alert(
    severity="critical",
    lane="h2-REF",
    title="Xid 79",
    detail="GPU has fallen off the bus;\nnot restarting onto it",
    host="dgx1",
    ts="2026-11-30T12:03:11.042Z",
    facts={"xid": "79", "pci": "0000:01:00"},
)


@dataclass
class Received:
    path: str
    content_type: str
    body: dict[str, object]


@dataclass
class FakeWebhook:
    """A real HTTP server on 127.0.0.1 that records each POST and answers from a script.

    `answers` is consumed one per request: a status code, or "slow" to sleep past the client's timeout;
    when it runs out, every request gets `then`.
    """

    port: int
    answers: list[int | str] = field(default_factory=list)
    then: int = 200
    answer_body: str = "ok"
    received: list[Received] = field(default_factory=list)

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/{TOKEN}"


@pytest.fixture
def webhook() -> Iterator[FakeWebhook]:
    state = FakeWebhook(port=0)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with lock:
                state.received.append(Received(self.path, self.headers.get("Content-Type", ""), body))
                answer = state.answers.pop(0) if state.answers else state.then
            if answer == "slow":
                time.sleep(0.6)
                answer = 200
            payload = state.answer_body.replace("{path}", self.path).encode()
            try:
                self.send_response(int(answer))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a "slow" answer comes after the client gave up

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/services/{TOKEN}"


def alerter(url: str, *, attempts: int = 4, client: httpx.Client | None = None) -> WebhookAlerter:
    """An alerter for `url` that retries without waiting."""
    return WebhookAlerter(VAR, environ={VAR: url}, client=client, attempts=attempts, wait=wait_none())


def test_delivers_on_the_first_try_with_a_slack_style_body(webhook: FakeWebhook) -> None:
    delivery = alerter(webhook.url()).send(ALERT)

    assert delivery == AlertDelivery(True, 1, f"webhook (${VAR}) answered 200 on attempt 1")
    [request] = webhook.received
    assert request.path == f"/services/{TOKEN}"
    assert request.content_type == "application/json"
    assert request.body == {
        "text": "lanectl CRITICAL h2-REF on dgx1: Xid 79 — GPU has fallen off the bus; not restarting onto it",
        "alert": {
            "severity": "critical",
            "lane": "h2-REF",
            "title": "Xid 79",
            "detail": "GPU has fallen off the bus;\nnot restarting onto it",
            "host": "dgx1",
            "ts": "2026-11-30T12:03:11.042Z",
            "facts": {"xid": "79", "pci": "0000:01:00"},
        },
    }


def test_retries_server_errors_and_rate_limits_until_delivered(webhook: FakeWebhook) -> None:
    webhook.answers = [500, 429, 503]

    delivery = alerter(webhook.url()).send(ALERT)

    assert delivery == AlertDelivery(True, 4, f"webhook (${VAR}) answered 200 on attempt 4")
    assert len(webhook.received) == 4


def test_gives_up_after_the_last_attempt(webhook: FakeWebhook, caplog: pytest.LogCaptureFixture) -> None:
    webhook.then = 500
    caplog.set_level(logging.WARNING, logger="lanectl.watchdog.alerts")

    delivery = alerter(webhook.url(), attempts=3).send(ALERT)

    assert delivery == AlertDelivery(False, 3, f"webhook (${VAR}) answered 500 after 3 attempts: ok")
    assert len(webhook.received) == 3
    assert [record.getMessage() for record in caplog.records if record.name == "lanectl.watchdog.alerts"] == [
        f"webhook (${VAR}) answered 500; retrying in 0.0 s (attempt 2 of 3)",
        f"webhook (${VAR}) answered 500; retrying in 0.0 s (attempt 3 of 3)",
    ]


def test_a_refused_request_is_not_retried(webhook: FakeWebhook) -> None:
    webhook.then = 400
    webhook.answer_body = "invalid_payload"

    delivery = alerter(webhook.url()).send(ALERT)

    assert delivery == AlertDelivery(False, 1, f"webhook (${VAR}) answered 400, not retried: invalid_payload")
    assert len(webhook.received) == 1


def test_an_unreachable_webhook_is_retried_then_reported_without_raising() -> None:
    delivery = alerter(closed_port_url()).send(ALERT)

    assert not delivery.delivered
    assert delivery.attempts == 4
    assert delivery.detail.startswith(f"webhook (${VAR}) could not connect (ConnectError: ")
    assert delivery.detail.endswith(") after 4 attempts")


def test_a_timeout_is_retried(webhook: FakeWebhook) -> None:
    webhook.answers = ["slow"]
    with httpx.Client(timeout=0.2) as client:
        delivery = alerter(webhook.url(), client=client).send(ALERT)

    assert delivery == AlertDelivery(True, 2, f"webhook (${VAR}) answered 200 on attempt 2")


def test_a_value_that_is_not_a_url_is_reported_once() -> None:
    delivery = alerter("hooks.example/T0/not-a-url").send(ALERT)

    assert delivery == AlertDelivery(
        False, 1, f"webhook (${VAR}) is not a usable URL (UnsupportedProtocol: Request URL is missing an "
                  f"'http://' or 'https://' protocol.) after 1 attempt"
    )


@pytest.mark.parametrize("environ", [{}, {VAR: ""}, {VAR: "   "}])
def test_no_webhook_variable_means_no_request(webhook: FakeWebhook, environ: dict[str, str]) -> None:
    delivery = WebhookAlerter(VAR, environ=environ).send(ALERT)

    assert delivery == AlertDelivery(False, 0, f"no webhook: ${VAR} is not set")
    assert webhook.received == []


def test_no_webhook_configured_at_all() -> None:
    assert WebhookAlerter(None, environ={VAR: "http://127.0.0.1:9/x"}).send(ALERT) == AlertDelivery(
        False, 0, "no webhook: alerting has no webhook variable configured"
    )


def test_an_alert_with_no_webhook_loads_no_http_client() -> None:
    # The watchdog journals an alert at every restart; `watchdog run` would keep whatever that imports.
    code = ("import sys\n"
            "from lanectl.watchdog.alerts import Alert, WebhookAlerter\n"
            "alert = Alert(severity='critical', lane='a', title='t', detail='', host='h', ts='2026-01-01')\n"
            "print(WebhookAlerter(None).send(alert).detail)\n"
            "print(WebhookAlerter('UNSET_VAR', environ={}).send(alert).detail)\n"
            "print(sorted({'httpx', 'tenacity', 'logging'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout


def test_the_url_is_read_when_sending(webhook: FakeWebhook) -> None:
    environ: dict[str, str] = {}
    sender = WebhookAlerter(VAR, environ=environ, wait=wait_none())
    environ[VAR] = webhook.url()

    assert sender.send(ALERT).delivered


@pytest.mark.parametrize("scenario", ["delivered", "server-error", "refused-echoing-url", "unreachable"])
def test_the_url_never_leaks(webhook: FakeWebhook, caplog: pytest.LogCaptureFixture, scenario: str) -> None:
    caplog.set_level(logging.DEBUG)
    url = webhook.url()
    if scenario == "server-error":
        webhook.then = 502
    elif scenario == "refused-echoing-url":
        # Some services echo the request line back; the excerpt of their answer must not carry it.
        webhook.then = 404
        webhook.answer_body = "no route for POST http://127.0.0.1:" + str(webhook.port) + "{path}"
    elif scenario == "unreachable":
        url = closed_port_url()
    sender = alerter(url)

    delivery = sender.send(ALERT)

    host_and_port = url.split("/")[2]
    logged = caplog.text + "\n".join(record.getMessage() for record in caplog.records)
    for place in (delivery.detail, repr(delivery), repr(sender), logged):
        assert TOKEN not in place
        assert "xoxFakeSecretToken123" not in place
        assert host_and_port not in place
        assert "127.0.0.1" not in place
    # The scrubbing was exercised, not dodged: httpx did log its requests, with the URL redacted.
    if scenario != "unreachable":
        assert any(record.name == "httpx" and "<redacted>" in record.getMessage() for record in caplog.records)
    assert logging.getLogger("httpx").filters == []


def test_redaction_covers_the_url_as_httpx_logs_it() -> None:
    redaction = UrlRedaction("https://Hooks.Example:8443/T0/a b?token=xyz123")
    scrubbed = redaction.scrub('HTTP Request: POST https://hooks.example:8443/T0/a%20b?token=xyz123 "HTTP/1.1 500"'
                               " connect_tcp.started host='hooks.example' port=8443")
    assert scrubbed == 'HTTP Request: POST <redacted> "HTTP/1.1 500" connect_tcp.started host=\'<redacted>\' port=8443'
    assert repr(redaction) == "UrlRedaction(<redacted>)"


def test_alert_severity_is_checked() -> None:
    with pytest.raises(ValueError, match="alert severity must be one of critical, warning, info, got 'fatal'"):
        Alert(severity="fatal", lane=None, title="t", detail="", host="h", ts="2026-11-30T12:03:11.042Z")


def test_a_host_alert_summary_has_no_lane() -> None:
    alert = Alert(severity="warning", lane=None, title="GPU memory not released", detail="", host="dgx1",
                  ts="2026-11-30T12:03:11.042Z")
    assert alert.summary() == "lanectl WARNING host on dgx1: GPU memory not released"


# --- textfile metrics ---------------------------------------------------------------------------

METRICS = WatchdogMetrics(
    lanes_up={"h2-REF": True, "h1-REF": False},
    restarts_total={"h2-REF": 2, "h1-REF": 0},
    rollbacks_total=1,
    xid_total={79: 1, 13: 4},
    xid_hardware_total=1,
    last_pass_timestamp=1764504191.042,
    last_pass_duration_seconds=0.25,
    armed=True,
    heartbeat_timestamp=1764504191.5,
)

RENDERED = """\
# HELP lanectl_watchdog_lane_up Whether the lane passed its last watchdog check (1) or not (0).
# TYPE lanectl_watchdog_lane_up gauge
lanectl_watchdog_lane_up{lane="h1-REF"} 0
lanectl_watchdog_lane_up{lane="h2-REF"} 1
# HELP lanectl_watchdog_restarts_total Restarts of the lane made by the watchdog.
# TYPE lanectl_watchdog_restarts_total counter
lanectl_watchdog_restarts_total{lane="h1-REF"} 0
lanectl_watchdog_restarts_total{lane="h2-REF"} 2
# HELP lanectl_watchdog_rollbacks_total Rollbacks to the last known-good lane made by the watchdog.
# TYPE lanectl_watchdog_rollbacks_total counter
lanectl_watchdog_rollbacks_total 1
# HELP lanectl_watchdog_xid_total NVIDIA Xid kernel log lines seen, by Xid code.
# TYPE lanectl_watchdog_xid_total counter
lanectl_watchdog_xid_total{code="13"} 4
lanectl_watchdog_xid_total{code="79"} 1
# HELP lanectl_watchdog_xid_hardware_total Xid lines whose code means the GPU hardware needs attention.
# TYPE lanectl_watchdog_xid_hardware_total counter
lanectl_watchdog_xid_hardware_total 1
# HELP lanectl_watchdog_last_pass_timestamp_seconds Unix time the last watchdog pass finished.
# TYPE lanectl_watchdog_last_pass_timestamp_seconds gauge
lanectl_watchdog_last_pass_timestamp_seconds 1764504191.042
# HELP lanectl_watchdog_last_pass_duration_seconds How long the last watchdog pass took.
# TYPE lanectl_watchdog_last_pass_duration_seconds gauge
lanectl_watchdog_last_pass_duration_seconds 0.25
# HELP lanectl_watchdog_armed Whether the watchdog is armed (1) or disarmed by a lease (0).
# TYPE lanectl_watchdog_armed gauge
lanectl_watchdog_armed 1
# HELP lanectl_watchdog_heartbeat_timestamp_seconds Unix time the watchdog last wrote these metrics.
# TYPE lanectl_watchdog_heartbeat_timestamp_seconds gauge
lanectl_watchdog_heartbeat_timestamp_seconds 1764504191.5
"""

# One sample line of the exposition format: name, optional {label="value",...} with escapes, value.
SAMPLE_LINE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)\})?'
    r' (?P<value>NaN|[+-]Inf|-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)$'
)


def test_render_metrics_exactly() -> None:
    assert render_metrics(METRICS) == RENDERED


def test_families_without_samples_are_left_out() -> None:
    empty = WatchdogMetrics(lanes_up={}, restarts_total={}, rollbacks_total=0, xid_total={}, xid_hardware_total=0,
                            last_pass_timestamp=0.0, last_pass_duration_seconds=0.0, armed=False,
                            heartbeat_timestamp=0.0)
    text = render_metrics(empty)
    assert "lane_up" not in text and "restarts_total" not in text and "xid_total{" not in text
    assert "lanectl_watchdog_rollbacks_total 0\n" in text
    assert "lanectl_watchdog_armed 0\n" in text


def test_label_values_are_escaped() -> None:
    metrics = WatchdogMetrics(lanes_up={'we"ird\\lane\nx': True}, restarts_total={}, rollbacks_total=0,
                              xid_total={}, xid_hardware_total=0, last_pass_timestamp=0.0,
                              last_pass_duration_seconds=0.0, armed=True, heartbeat_timestamp=0.0)
    text = render_metrics(metrics)
    assert 'lanectl_watchdog_lane_up{lane="we\\"ird\\\\lane\\nx"} 1\n' in text
    assert all(SAMPLE_LINE.match(line) for line in text.splitlines() if not line.startswith("#"))


def test_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    textfile = PrometheusTextfile(tmp_path)
    (tmp_path / "lanectl.prom").write_text("stale\n")

    textfile.write(METRICS)

    assert os.listdir(tmp_path) == ["lanectl.prom"]
    target = tmp_path / "lanectl.prom"
    assert target.read_text() == RENDERED
    assert target.stat().st_mode & 0o777 == 0o644  # node_exporter runs as its own user
    names = set()
    for line in target.read_text().splitlines():
        if line.startswith("# "):
            assert re.fullmatch(r"# (HELP|TYPE) lanectl_watchdog_[a-z_]+ .+", line), line
            continue
        match = SAMPLE_LINE.match(line)
        assert match, line
        names.add(match["name"])
    assert "lanectl_watchdog_last_pass_timestamp_seconds" in names


def test_write_without_a_directory_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    PrometheusTextfile(None).write(METRICS)
    assert os.listdir(tmp_path) == []


def test_write_into_a_missing_directory_says_where(tmp_path: Path) -> None:
    missing = tmp_path / "textfile_collector"
    with pytest.raises(OperationFailed, match=f"could not write metrics to {missing}/lanectl.prom: No such file"):
        PrometheusTextfile(missing).write(METRICS)


def test_the_file_name_must_be_one_the_collector_reads() -> None:
    with pytest.raises(ValueError, match="ending in .prom"):
        PrometheusTextfile(Path("/tmp"), name="lanectl.txt")


# --- hostile webhooks: no stall, no flood, no leak ----------------------------------------------------


class HostileWebhook:
    """A raw TCP server on 127.0.0.1 that answers each connection with `serve(connection)`."""

    def __init__(self, serve) -> None:  # type: ignore[no-untyped-def]
        self.sent = 0
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()

        def accept() -> None:
            while not self.stop.is_set():
                try:
                    connection, _ = self.listener.accept()
                except OSError:
                    return
                self.connections += 1
                threading.Thread(target=self._serve, args=(serve, connection), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def _serve(self, serve, connection: socket.socket) -> None:  # type: ignore[no-untyped-def]
        with connection:
            connection.recv(65536)
            try:
                serve(self, connection)
            except OSError:
                pass  # the client gave up, as it should

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/{TOKEN}"

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def send_within(alerter_: WebhookAlerter, limit: float = 30.0) -> AlertDelivery:
    """Send from a thread and fail the test, rather than hang it, if the send never returns."""
    result: list[AlertDelivery] = []
    thread = threading.Thread(target=lambda: result.append(alerter_.send(ALERT)), daemon=True)
    thread.start()
    thread.join(limit)
    assert result, "the delivery stalled its caller"
    return result[0]


def never_answers(server: HostileWebhook, connection: socket.socket) -> None:
    server.stop.wait(60)


def drips_forever(server: HostileWebhook, connection: socket.socket) -> None:
    connection.sendall(b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n")
    while not server.stop.is_set():
        connection.sendall(b"1\r\nx\r\n")
        server.sent += 1
        time.sleep(0.05)


def floods(server: HostileWebhook, connection: socket.socket) -> None:
    size = 200 * 1024 * 1024
    connection.sendall(f"HTTP/1.1 500 Oops\r\nContent-Length: {size}\r\n\r\n".encode())
    chunk = b"y" * 65536
    while server.sent < size and not server.stop.is_set():
        connection.sendall(chunk)
        server.sent += len(chunk)


@pytest.mark.parametrize(("serve", "reported"), [
    (never_answers, f"webhook (${VAR}) timed out"),
    (drips_forever, f"webhook (${VAR}) answered 500 after "),  # what came before the deadline, no more
], ids=["never answers", "drips its body"])
def test_a_webhook_that_stalls_is_given_up_at_the_delivery_deadline(serve, reported: str) -> None:  # type: ignore[no-untyped-def]
    server = HostileWebhook(serve)
    try:
        delivery = send_within(WebhookAlerter(VAR, environ={VAR: server.url()}, deadline_seconds=1.0))
    finally:
        server.close()

    assert not delivery.delivered
    assert delivery.detail.startswith(reported), delivery.detail
    assert TOKEN not in delivery.detail


def test_a_flood_of_an_error_body_is_not_read_past_the_cap() -> None:
    server = HostileWebhook(floods)
    try:
        delivery = send_within(WebhookAlerter(VAR, environ={VAR: server.url()}, attempts=1))
    finally:
        time.sleep(0.2)
        server.close()

    assert delivery.detail == f"webhook (${VAR}) answered 500 after 1 attempt: " + "y" * 200 or \
        delivery.detail.startswith(f"webhook (${VAR}) answered 500 after 1 attempt: <redacted>")
    assert server.sent < 200 * 1024 * 1024, "the client stopped reading; the server could not send it all"


def test_an_error_body_is_redacted_before_it_is_reported(webhook: FakeWebhook) -> None:
    webhook.then = 403
    webhook.answer_body = ('{"error": "invalid_auth", "token": "xoxb-1111-2222-abcdefgh", "seen": "{path}", '
                           '"piece": "xoxFakeSecretToken123", "auth": "Bearer abcdefghijklmnop", '
                           '"key": "AKIAABCDEFGHIJKLMNOP", "ok": "no such channel #general"}')

    delivery = alerter(webhook.url()).send(ALERT)

    assert not delivery.delivered
    for secret in ("xoxb-1111", "xoxFakeSecretToken123", "abcdefghijklmnop", "AKIAABCDEFGHIJKLMNOP", "T0FAKE",
                   "B0FAKE"):
        assert secret not in delivery.detail, delivery.detail
    assert "invalid_auth" in delivery.detail
